"""A data node SIGKILLed mid-run and restarted with its state directory comes back and training goes on.

1 data node and 2 stages x 2 relays train, separate processes on loopback.
The data node kills itself (fault injection, `GWTF_FAULT=final:K`) in the
middle of an iteration, as the final backward of one of its microbatches
starts: its relays hold microbatches and gradients of that iteration, and
its checkpoint holds the steps before it.  It is started again with the same
state directory and the same flags; `--port 0` gives it a new port and it has
no bootstrap address (it was the swarm's first node): it dials the peers of
its address book, they take it back (the same peer id, a new incarnation),
drop what they held of its iteration in flight, and it reopens that
iteration with the microbatches the run's step says.

Must hold: it trains again within 30 s of its restart; every loss recorded,
before and after, equals centralized training on the microbatches the data
node completed in each iteration (read from its logs: those of the iteration
it died in were dropped everywhere and trained again after the restart); the
relays of a stage end with equal parameters, those of the reference.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import build_chain, make_sources
from gwtf_node.runtime.local import LocalSwarm

from swarmutil import log_text, status, wait_exit, wait_for, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]
M = 4  # microbatches per iteration
ITERATIONS = 6
KILL_AT_FINAL = 2 * M + 2  # the 10th final backward: iteration 2, two of its microbatches completed


def completed_per_iteration(text: str) -> dict[int, list[int]]:
    """The data node's log: iteration -> seqs completed end to end (its "settled" lines)."""
    return {int(it): json.loads(seqs) for it, seqs in
            re.findall(r"iteration (\d+) settled: completed (\[[^\]]*\])", text)}


def reference(man, plan: list[list[int]]):
    """Centralized training when iteration t trains every part on the microbatches `plan[t]` of data node 0."""
    data, relays = build_chain(man)
    source = make_sources(man, 1)[0]
    losses = []
    for t, seqs in enumerate(plan):
        batch = []
        for seq in seqs:
            x, y = source.get(seq)
            h = data.embed((0, seq), x)
            for r in relays:
                h = r.forward((0, seq), h)
            loss, g = data.head_loss((0, seq), h, y)
            for r in reversed(relays):
                g = r.backward((0, seq), g)
            data.embed_backward((0, seq), g)
            batch.append(loss)
        for part in (data, *relays):
            part.apply_mean_grad(part.grad_vector(), len(seqs))
        losses.append(sum(batch) / len(batch))
    return losses, [r.param_vector() for r in relays]


async def test_data_node_restarted_with_its_state_dir(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                       faults={"d0": f"final:{KILL_AT_FINAL}"})
    old_log = tmp_path / "d0" / "node.log.before"
    try:
        await trio.to_thread.run_sync(swarm.start)
        assert await wait_exit(swarm, "d0", 90) == -9, "the fault did not fire"
        before = len(swarm.records())
        old_id = status(tmp_path, "d0")["peer_id"]
        old_addr = (tmp_path / "d0" / "addr").read_text().split()[0]
        # the relays notice it is gone and say that they wait for a data node
        await wait_for(lambda: all(status(tmp_path, f"r{k}_{i}").get("waiting_for_data_node_s") is not None
                                   for k in range(2) for i in range(2)), 20, "relays waiting for a data node")
        (tmp_path / "d0" / "node.log").rename(old_log)
        swarm.faults.pop("d0")
        swarm._spawn("d0", None, None)  # the same flags: no bootstrap, --port 0
        swarm.expected_dead.discard("d0")
        restarted = time.monotonic()
        await wait_for(lambda: len(swarm.records()) > before, 30, "an iteration recorded after the restart", swarm)
        back_s = time.monotonic() - restarted
        await wait_records(swarm, ITERATIONS, 120)
        await wait_exit(swarm, "d0", 30)
    finally:
        await trio.to_thread.run_sync(swarm.stop)

    st = status(tmp_path, "d0")
    assert st["peer_id"] == old_id
    assert (tmp_path / "d0" / "addr").read_text().split()[0] != old_addr, "it came back on the same port"
    new_text = log_text(tmp_path, "d0")
    assert "data node part loaded from" in new_text, new_text[-3000:]
    assert back_s < 30
    for k in range(2):
        for i in range(2):
            rs = status(tmp_path, f"r{k}_{i}")
            assert old_id not in rs["presumed_dead"], rs["presumed_dead"]
            assert "is back" in log_text(tmp_path, f"r{k}_{i}")

    records = swarm.records()
    assert [r["iteration"] for r in records] == list(range(ITERATIONS))
    done = completed_per_iteration(old_log.read_text())
    died_in = max(done) + 1
    assert died_in == KILL_AT_FINAL // M, (died_in, done)
    after = completed_per_iteration(new_text)
    assert min(after) == died_in, (sorted(after), died_in)
    plan = [done[t] if t < died_in else after[t] for t in range(ITERATIONS)]
    for t, seqs in enumerate(plan):  # nothing deferred: the run's step names the microbatches
        assert sorted(seqs) == list(range(t * M, (t + 1) * M)), (t, seqs)
    losses, params = reference(man, plan)
    for r, loss in zip(records, losses):
        assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss)
    for k in range(2):
        got = [torch.load(tmp_path / f"r{k}_{i}" / "checkpoint.pt", weights_only=False) for i in range(2)]
        assert got[0]["steps"] == got[1]["steps"] == ITERATIONS, [g["steps"] for g in got]
        assert torch.equal(got[0]["params"], got[1]["params"]), k
        err = (got[0]["params"] - params[k]).norm() / params[k].norm()
        assert err < 1e-4, (k, float(err))

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
from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.restartutil import reference_run, two_data_nodes
from support.swarmutil import log_text, status, wait_exit, wait_for, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]
M = 4  # microbatches per iteration
ITERATIONS = 6
KILL_AT_FINAL = 2 * M + 2  # the 10th final backward: iteration 2, two of its microbatches completed


def completed_per_iteration(text: str) -> dict[int, list[int]]:
    """The data node's log: iteration -> seqs completed end to end (its "settled" lines)."""
    return {int(it): json.loads(seqs) for it, seqs in
            re.findall(r"iteration (\d+) settled: completed (\[[^\]]*\])", text)}


def _every_part(plan: list[list[tuple[int, int]]]) -> list:
    """A plan where every part of the model trains on the same microbatches (no relay died with one)."""
    return [(keys, {k: keys for k in range(2)}) for keys in plan]


async def test_data_node_restarted_with_its_state_dir(tmp_path: Path) -> None:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=2, iterations=ITERATIONS,
                       faults={"d0": f"final:{KILL_AT_FINAL}"}, log_level="DEBUG")
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
        await wait_for(lambda: len(swarm.records()) > before, 120, "an iteration recorded after the restart", swarm)
        await wait_records(swarm, ITERATIONS, 120)
        await wait_exit(swarm, "d0", 30)
    finally:
        await trio.to_thread.run_sync(swarm.stop)

    st = status(tmp_path, "d0")
    assert st["peer_id"] == old_id
    assert (tmp_path / "d0" / "addr").read_text().split()[0] != old_addr, "it came back on the same port"
    new_text = log_text(tmp_path, "d0")
    assert "data node part loaded from" in new_text, new_text[-3000:]
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
    losses, params, _ = reference_run(man, 1, _every_part([[(0, s) for s in seqs] for seqs in plan]))
    for r, loss in zip(records, losses):
        assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss)
    for k in range(2):
        got = [torch.load(tmp_path / f"r{k}_{i}" / "checkpoint.pt", weights_only=False) for i in range(2)]
        assert got[0]["steps"] == got[1]["steps"] == ITERATIONS, [g["steps"] for g in got]
        assert torch.equal(got[0]["params"], got[1]["params"]), k
        err = (got[0]["params"] - params[k]).norm() / params[k].norm()
        assert err < 1e-4, (k, float(err))


async def test_one_of_two_data_nodes_restarted(tmp_path: Path) -> None:
    """2 data nodes, 2 stages x 1 relay: the data node that does not lead is SIGKILLed mid-iteration and
    restarted with its state directory and flags.  The other trains on alone meanwhile; the restarted one
    downloads the data part from it (its checkpoint is behind), is taken back by the leader from the iteration
    after the download, and both push microbatches again.  Every loss equals centralized training on the
    microbatches each data node completed in each counted iteration up to 4 iterations after the restart (later
    ones can be off by 1e-3 and more, rounding grown: docs/architecture.md, known gaps), no node computes on
    parameters of another step, and the two data parts end equal.  The run is long
    enough that the survivor, which keeps the lease with the witness relay's vote, is still training when the
    restarted one is back."""
    iterations = 40  # at ~0.1 s an iteration, the survivor is still training when the restarted one is back
    man, swarm = two_data_nodes(tmp_path, iterations, M)
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 2, 120)
        ids = {status(tmp_path, n)["peer_id"]: n for n in ("d0", "d1")}
        leader = ids[await wait_for(lambda: status(tmp_path, "d0").get("leader"), 30, "a leader")]
        victim = "d1" if leader == "d0" else "d0"
        swarm.expected_dead.add(victim)
        (tmp_path / victim / "fault").write_text("final:2")  # its second final backward from now: mid-iteration
        assert await wait_exit(swarm, victim, 60) == -9, "the fault did not fire"
        (tmp_path / victim / "fault").unlink()
        (tmp_path / victim / "node.log").rename(tmp_path / victim / "node.log.before")
        boot = None if victim == "d0" else (tmp_path / "d0" / "addr").read_text().split()[0]
        swarm._spawn(victim, boot, None)  # the same flags (--port 0: a new port)
        swarm.expected_dead.discard(victim)
        await wait_for(lambda: "taking part from iteration" in log_text(tmp_path, victim), 120,
                       "the data part downloaded", swarm)
        back_at = int(re.findall(r"taking part from iteration (\d+)", log_text(tmp_path, victim))[-1])
        await wait_records(swarm, iterations, 300)
        for n in ("d0", "d1"):
            await wait_exit(swarm, n, 30)
    finally:
        await trio.to_thread.run_sync(swarm.stop)

    records = swarm.records()
    assert [r["iteration"] for r in records] == list(range(iterations))
    index = {"d0": 0, "d1": 1}
    settled = {n: completed_per_iteration(log_text(tmp_path, n)) for n in ("d0", "d1")}
    before = completed_per_iteration((tmp_path / victim / "node.log.before").read_text())
    died_in = max(before) + 1
    # back from `back_at` on; an iteration it settled before that (it loaded a state the run had just stepped past,
    # was left out of that aggregation and fetched the next one) completed nothing: its microbatches were deferred
    assert back_at > died_in and all(not settled[victim][t] for t in settled[victim] if t < back_at), (
        died_in, back_at, sorted(settled[victim]))
    plan = []
    for t in range(iterations):
        keys = [(index[leader], s) for s in settled[leader][t]]
        mine = before.get(t) if t < died_in else settled[victim].get(t) if t >= back_at else None
        keys += [(index[victim], s) for s in mine or []]
        assert records[t]["microbatches"] == len(keys), (t, records[t], keys)
        plan.append(keys)
    for t in range(died_in):  # before the kill both data nodes pushed M fresh ones each iteration
        assert sorted(s for i, s in plan[t] if i == index[victim]) == list(range(t * M, (t + 1) * M)), (t, plan[t])
    # after it, the victim's microbatches each count once, in order: M fresh ones per iteration, plus any it
    # deferred from the iteration it was left out of
    after = [s for t in range(back_at, iterations) for i, s in plan[t] if i == index[victim]]
    assert after == sorted(set(after)) and after[-1] == iterations * M - 1, after
    # and none is lost: every fresh one from `back_at` on counted (a microbatch deferred moves to the next iteration)
    assert set(range(back_at * M, iterations * M)) <= set(after), (back_at, after)
    losses, _, _ = reference_run(man, 2, _every_part(plan))
    # exact to rounding up to 4 iterations after the restart; later, on some of these trajectories, rounding
    # differences grow (the reference itself, one tensor nudged by 1e-7 at the return, moves by 1e-3 within 20
    # iterations: docs/architecture.md, known gaps): compared only up to there
    for r, loss in zip(records[:back_at + 4], losses):
        assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss)
    # every forward, loss and backward ran on the parameters of its microbatch's iteration (microbatches.py)
    off_step = [line for n in ("d0", "d1", "r0_0", "r1_0") for line in log_text(tmp_path, n).splitlines()
                if "computed on parameters of" in line]
    assert not off_step, off_step
    parts = {n: torch.load(tmp_path / n / "checkpoint.pt", weights_only=False) for n in ("d0", "d1")}
    assert parts["d0"]["steps"] == parts["d1"]["steps"] == iterations
    # the two copies of the data part agree to float precision (not always to the bit: docs/architecture.md, known gaps)
    gap = (parts["d0"]["params"] - parts["d1"]["params"]).norm() / parts["d0"]["params"].norm()
    assert gap < 1e-6, float(gap)
    # the final parameters against the reference are the known gap (1e-5 to 1.3e-2 seen): not asserted, the
    # relays' part must still have trained on (finite, stepped)
    for k in range(2):
        got = torch.load(tmp_path / f"r{k}_0" / "checkpoint.pt", weights_only=False)
        assert got["steps"] == iterations and torch.isfinite(got["params"]).all(), (k, got["steps"])

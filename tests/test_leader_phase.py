"""The aggregation phase survives its leader and lost signals, on real processes.

3 data nodes and 2 stages x 1 relay train.  Once the swarm has trained two
iterations, the acting leader is armed (the `fault` file of its state
directory) to SIGKILL itself (a) as it opens an aggregation, before any BEGIN
AGGREGATION leaves, (b) once its first BEGIN AGGREGATION frame is sent, (c)
once the first copy of BEGIN went to every data node and stage-0 relay.  The
two others elect a new leader and training goes on; a separate run loses the
first copy of every phase signal (GWTF_DROP_FIRST_PHASE) and trains on.

Every loss equals the centralized reference of what was trained: the dead
leader's microbatches count up to the iteration it died in; in that
iteration the data part steps on the survivors' microbatches (the dead
node's embedding gradients died with it) and each relay on the
contributions it counted at BEGIN AGGREGATION (the relay's log says how many:
all data nodes' if the dead leader's BEGIN reached it, else the survivors').
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import build_chain, make_sources
from gwtf_node.runtime.local import LocalSwarm

from swarmutil import log_text, status, wait_exit, wait_for, wait_records

pytestmark = [pytest.mark.slow, pytest.mark.trio]
DATA_NODES = 3
M = 2  # microbatches per data node and iteration
AFTER = 3  # iterations trained after the one the leader died in


def reference_losses(man, plan: list[tuple[set[int], set[int]]]) -> list[float]:
    """Centralized losses when iteration t trains the data part on data nodes `plan[t][0]` (whose losses are the
    iteration's loss) and the relay stages on data nodes `plan[t][1]`."""
    data, relays = build_chain(man)
    sources = make_sources(man, DATA_NODES)
    losses = []
    for t, (data_set, relay_set) in enumerate(plan):
        batch = []
        for i in sorted(data_set | relay_set):
            for seq in range(t * M, (t + 1) * M):
                x, y = sources[i].get(seq)
                key = (i, seq)
                h = data.embed(key, x)
                for r in relays:
                    h = r.forward(key, h)
                loss, g = data.head_loss(key, h, y, hold=True)
                for r in reversed(relays):
                    g = r.backward(key, g, hold=True)
                    if i in relay_set:
                        r.commit(key)
                    else:
                        r.discard(key)
                if i in data_set:
                    data.commit(key, count=False)
                    data.embed_backward(key, g)
                    batch.append(loss)
                else:
                    data.discard(key)
                    data.drop(key)
        data.apply_mean_grad(data.grad_vector(), len(data_set) * M)
        for r in relays:
            r.apply_mean_grad(r.grad_vector(), len(relay_set) * M)
        losses.append(sum(batch) / len(batch))
    return losses


def _swarm(tmp_path: Path, **kw) -> tuple[object, LocalSwarm]:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=DATA_NODES, stages=2, relays_per_stage=1, iterations=100000,
                       iteration_timeout_s=120, **kw)
    return man, swarm


def _check(man, records: list[dict], plan: list[tuple[set[int], set[int]]]) -> None:
    assert [r["iteration"] for r in records] == list(range(len(records)))
    want = reference_losses(man, plan[:len(records)])
    for r, (data_set, _relays), loss in zip(records, plan, want):
        assert r["microbatches"] == len(data_set) * M and r["deferred"] == 0 and r["lost"] == 0, r
        assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss)


@pytest.mark.parametrize("fault", ["begin_open:1", "begin_sent:1", f"begin_sent:{DATA_NODES}"],
                         ids=["before-begin", "while-sending-begin", "after-begin"])
async def test_leader_killed_around_begin_aggregation(tmp_path: Path, fault: str) -> None:
    man, swarm = _swarm(tmp_path)
    names = [f"d{i}" for i in range(DATA_NODES)]
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 2, 240)
        ids = {status(tmp_path, n)["peer_id"]: n for n in names}
        leader = ids[await wait_for(lambda: status(tmp_path, "d0").get("leader"), 30, "a leader")]
        swarm.expected_dead.add(leader)
        (tmp_path / leader / "fault").write_text(fault)
        assert await wait_exit(swarm, leader, 120) == -9, "the fault did not fire"
        died = int(re.findall(r"iteration (\d+): opening the aggregation", log_text(tmp_path, leader))[-1])
        survivors = [n for n in names if n != leader]
        await wait_for(lambda: len({status(tmp_path, n).get("leader") for n in survivors} - {None}) == 1
                       and status(tmp_path, survivors[0]).get("leader") in ids
                       and ids[status(tmp_path, survivors[0])["leader"]] in survivors, 60, "a new leader", swarm)
        await wait_records(swarm, died + 1 + AFTER, 240)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    held = dict(re.findall(r"iteration (\d+): aggregating (\d+) contributions held here", log_text(tmp_path, "r0_0")))
    everyone, rest = set(range(DATA_NODES)), {int(n[1:]) for n in survivors}
    relay_died = everyone if int(held[str(died)]) == DATA_NODES * M else rest
    assert int(held[str(died)]) == len(relay_died) * M, (held, died)
    plan = [(everyone, everyone)] * died + [(rest, relay_died)] + [(rest, rest)] * (AFTER + 100)
    _check(man, swarm.records(), plan)


async def test_first_copy_of_every_phase_signal_lost(tmp_path: Path) -> None:
    man, swarm = _swarm(tmp_path, drop_first_phase=True)
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 4, 300)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    lost = sum(log_text(tmp_path, n).count("GWTF_DROP_FIRST_PHASE:") for n in swarm.names())
    assert lost >= 4 * (DATA_NODES + 2), lost  # every iteration lost at least one copy per node
    everyone = set(range(DATA_NODES))
    _check(man, swarm.records(), [(everyone, everyone)] * 100)

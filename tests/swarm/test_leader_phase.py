"""The aggregation phase survives its leader and lost signals, on real processes.

3 data nodes and 2 stages x 1 relay train.  Once the swarm has trained two
iterations, the acting leader is armed (the `fault` file of its state
directory) to SIGKILL itself (a) as it opens an aggregation, before any BEGIN
AGGREGATION leaves, (b) once its first BEGIN AGGREGATION frame is sent, (c)
once the first copy of BEGIN went to every data node and stage-0 relay.  The
two others elect a new leader and training goes on; a separate run loses the
first copy of every phase signal (GWTF_DROP_FIRST_PHASE) and trains on.

Every loss equals the centralized reference of what was trained, read from
the nodes' logs: the microbatches each data node completed in each
iteration (a deferred one is trained in a later iteration), the dead
leader's up to the iteration it died in (in that iteration the data part
steps on the survivors' microbatches: the dead node's embedding gradients
died with it), and at the relays the contributions they counted at BEGIN
AGGREGATION (all data nodes' if the dead leader's BEGIN reached them, else
the survivors').
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm

from support.restartutil import reference_losses
from support.swarmutil import log_text, status, wait_exit, wait_for, wait_records, wait_summed

pytestmark = [pytest.mark.slow, pytest.mark.trio]
DATA_NODES = 3
M = 2  # microbatches per data node and iteration
AFTER = 2  # iterations trained after the one the leader died in
RELAYS = ("r0_0", "r1_0")


Key = tuple[int, int]  # (data node index, seq)


def trained(workdir: Path, died: int | None, dead: str | None, upto: int) -> list[tuple[list[Key], list[Key]]]:
    """What iterations 0 to upto-1 trained, from the nodes' logs: the data part on the microbatches the live data
    nodes completed (the dead leader's from the iteration it died in on are gone with it), each relay on the
    contributions it counted at BEGIN AGGREGATION (the same at both stages; the test waited for both relays to sum
    these iterations, `wait_summed`)."""
    names = [f"d{i}" for i in range(DATA_NODES)]
    settled: dict[int, dict[str, list[int]]] = {}
    for n in names:
        for it, seqs in re.findall(r"iteration (\d+) settled: completed (\[[^]]*\])", log_text(workdir, n)):
            settled.setdefault(int(it), {})[n] = json.loads(seqs)
    ids = {status(workdir, n)["peer_id"]: n for n in names}

    def counted(relay: str) -> dict[int, list[Key]]:
        out = {}
        for it, keys in re.findall(r"iteration (\d+): summed in round \S+ contributions (\[.*\]);", log_text(workdir, relay)):
            named = [(next((v for k, v in ids.items() if k.startswith(who)), who), seq) for who, seq in json.loads(keys)]
            out[int(it)] = sorted((int(n[1:]), seq) for n, seq in named)
        return out

    stage0, stage1 = counted("r0_0"), counted("r1_0")
    plan = []
    for t in sorted(settled):
        if t >= upto:  # (trained on while the swarm stopped: a relay may not have summed it)
            break
        live = [n for n in names if died is None or t < died or n != dead]
        data_keys = sorted((int(n[1:]), seq) for n in live for seq in settled[t].get(n, []))
        if t in stage0:
            assert stage0[t] == stage1.get(t), (t, stage0[t], stage1.get(t))
        plan.append((data_keys, stage0.get(t, [])))
    return plan


def _swarm(tmp_path: Path, **kw) -> tuple[object, LocalSwarm]:
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(tmp_path, run, data_nodes=DATA_NODES, stages=2, relays_per_stage=1, iterations=100000,
                       iteration_timeout_s=120, **kw)
    return man, swarm


def _check(man, records: list[dict], plan: list[tuple[list[Key], list[Key]]], workdir: Path) -> None:
    assert [r["iteration"] for r in records] == list(range(len(records)))
    assert len(plan) >= len(records), (len(plan), len(records))
    # (both relay stages counted the same contributions, `trained` checks it)
    want = reference_losses(man, DATA_NODES, [(d, {k: r for k in range(len(man.stages))})
                                              for d, r in plan[:len(records)]])
    for r, (data_keys, _relay_keys), loss in zip(records, plan, want):
        assert r["microbatches"] == len(data_keys) and r["lost"] == 0, (r, data_keys, _told(workdir, r["iteration"]))
        assert r["loss"] == pytest.approx(loss, rel=1e-4), (r, loss, _told(workdir, r["iteration"]))


def _told(workdir: Path, iteration: int) -> str:
    """What the data nodes' logs say of `iteration` and of the leaders around it (for a failure's message)."""
    pat = re.compile(rf"iteration {iteration}\b|leader|IterationDone|metrics record")
    return "\n".join(f"{n}: {line}" for n in [f"d{i}" for i in range(DATA_NODES)]
                     for line in log_text(workdir, n).splitlines() if pat.search(line))[-8000:]


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
        waited = died + 1 + AFTER
        await wait_records(swarm, waited, 240)
        await wait_summed(swarm, RELAYS, waited, 120)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    try:
        plan = trained(tmp_path, died, leader, waited)
    except AssertionError as e:  # the two stages counted different contributions
        raise AssertionError(f"{e}\n{_told(tmp_path, died)}") from e
    # the records waited for: one written while the swarm stops may leave out a data node that left first
    _check(man, swarm.records()[:waited], plan, tmp_path)


async def test_first_copy_of_every_phase_signal_lost(tmp_path: Path) -> None:
    man, swarm = _swarm(tmp_path, drop_first_phase=True)
    try:
        await trio.to_thread.run_sync(swarm.start)
        await wait_records(swarm, 3, 300)
        # the leader records an iteration once the data nodes stepped; a relay whose BEGIN AGGREGATION was lost
        # sums it a retry later (twice at stage 1: the leader's copy to r0_0 and r0_0's to r1_0 are both lost)
        await wait_summed(swarm, RELAYS, 3, 120)
    finally:
        await trio.to_thread.run_sync(swarm.stop)
    lost = sum(log_text(tmp_path, n).count("GWTF_DROP_FIRST_PHASE:") for n in swarm.names())
    assert lost >= 3 * (DATA_NODES + 2), lost  # every iteration lost at least one copy per node
    _check(man, swarm.records()[:3], trained(tmp_path, None, None, 3), tmp_path)

"""Pooled formation in the daemon (runtime/node/pooling.py): two data nodes form their flows as one commodity,
home them and hand over; training then computes what centralized training computes.

2 data nodes and 2 stages x 2 relays, every node with `pooled_formation`, in
one process over real libp2p on loopback (support/inproc.py).  Every node
hands over after homing installed its units (its log says so), each data
node's flow machine starts holding its whole demand (the units homing
installed there), and every loss equals the centralized reference.  With 3
relays a stage and one of them stopped while it holds pooled units, the
others drop it, form and home over the relays left, and train as exactly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.model.reference import train_centralized

from support.helpers import until
from support.inproc import in_process_swarm

pytestmark = [pytest.mark.slow, pytest.mark.trio]
ITERATIONS = 2
M = 2  # microbatches per data node and iteration


def _pooled_swarm(tmp_path: Path, relays_per_stage: int):
    """The run's manifest and a pooled in-process swarm of 2 data nodes and 2 stages (not started yet)."""
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    return man, in_process_swarm(tmp_path, run, data_nodes=2, stages=2, relays_per_stage=relays_per_stage,
                                 iterations=ITERATIONS, options={"pooled_formation": True})


def _assert_exact(man, records: list[dict], *why) -> None:
    """Every iteration settled all microbatches, none lost, each loss the centralized reference's."""
    ref = train_centralized(man, ITERATIONS, data_nodes=2)
    assert [r["iteration"] for r in records[:ITERATIONS]] == list(range(ITERATIONS))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == 2 * M and rec["lost"] == 0, (*why, rec)
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (*why, rec, loss)


async def test_pooled_formation_hands_over_and_trains_exactly(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.node")
    man, swarm_cm = _pooled_swarm(tmp_path, 2)
    async with swarm_cm as swarm:
        await swarm.start()
        records = await swarm.wait_records(ITERATIONS, 180)
        flows = {name: node.parts.flows for name, node in swarm.nodes.items()}
        placed = {name: sum(f.out().get(swarm.peer_id(name), {}).values()) for name, f in flows.items()
                  if name.startswith("d")}
    text = caplog.text
    assert text.count("pooled formation over (homing installed its units)") == len(swarm.names()), text[-3000:]
    assert "gave up" not in text
    assert placed == {"d0": M, "d1": M}, placed
    _assert_exact(man, records)


async def test_a_relay_crashing_while_the_flows_form_pooled_is_dropped_and_the_swarm_trains_exactly(
        tmp_path: Path, caplog) -> None:
    """A relay that holds pooled units stops before homing is done (its connections close, it says nothing): its
    neighbours drop it from their pooled machines, the flows form over the relays left, and training is exact."""
    caplog.set_level(logging.INFO, logger="gwtf.node")
    man, swarm_cm = _pooled_swarm(tmp_path, 3)
    async with swarm_cm as swarm:
        await swarm.start()

        def holding() -> str | None:
            for name, node in swarm.nodes.items():
                pooling = node.parts.flows.pooling
                if name.startswith("r") and pooling is not None and not pooling.done and pooling.holds_units():
                    return name
            return None

        victim = await until(holding, "a relay holds pooled units", 60, poll_s=0.005)
        swarm.nodes[victim].stop()
        records = await swarm.wait_records(ITERATIONS, 240)
        alive = [n for n in swarm.names() if n != victim]
        done = {n: swarm.nodes[n].parts.flows.pooling.done for n in alive}
    text = caplog.text
    assert all(done.values()), done
    assert "gave up" not in text, text[-3000:]
    _assert_exact(man, records, victim)

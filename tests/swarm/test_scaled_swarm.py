"""Scaled formation in the daemon (runtime/node/scaledformation.py): one data node's flows formed by cost scaling,
handed to the flow machines; training then computes what centralized training computes.

1 data node and 2 stages x 2 relays, every node with `scaled_formation`, in
one process over real libp2p on loopback (support/inproc.py).  Every node
hands over after the last phase (its log says so), the data node's flow
machine starts holding its whole demand, and every loss equals the
centralized reference.  With 3 relays a stage and one of them stopped while
formation runs, its neighbours call formation off, the flow machines form the
flows over the relays left, and training is as exact.  With every node losing
frames of formation on purpose (`GWTF_DROP_SCALE`), they are asked for and sent
again, and formation ends as without loss."""

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
M = 4  # microbatches per iteration


def _scaled_swarm(tmp_path: Path, relays_per_stage: int, data_scaled: bool = True):
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=M)
    run = tmp_path / "run.json"
    save_manifest(man, run)
    return man, in_process_swarm(tmp_path, run, data_nodes=1, stages=2, relays_per_stage=relays_per_stage,
                                 iterations=ITERATIONS, options={"scaled_formation": True},
                                 node_options={"d0": {"scaled_formation": data_scaled}})


def _assert_exact(man, records: list[dict], *why) -> None:
    ref = train_centralized(man, ITERATIONS, data_nodes=1)
    assert [r["iteration"] for r in records[:ITERATIONS]] == list(range(ITERATIONS))
    for rec, loss in zip(records, ref.losses):
        assert rec["microbatches"] == M and rec["lost"] == 0, (*why, rec)
        assert rec["loss"] == pytest.approx(loss, rel=1e-4), (*why, rec, loss)


async def test_scaled_formation_hands_over_and_trains_exactly(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.node")
    man, swarm_cm = _scaled_swarm(tmp_path, 2)
    async with swarm_cm as swarm:
        await swarm.start()
        records = await swarm.wait_records(ITERATIONS, 180)
        d0 = swarm.nodes["d0"].parts.flows
        placed = sum(d0.out().get(swarm.peer_id("d0"), {}).values())
        ignored = {n: node.parts.flows.scaling.machine.ignored for n, node in swarm.nodes.items()}
    text = caplog.text
    assert text.count("scaled formation over after") == len(swarm.names()), text[-3000:]
    assert "called off" not in text and set(ignored.values()) == {0}, ignored
    assert placed == M, placed
    _assert_exact(man, records)


async def test_relays_that_wait_for_a_formation_the_data_node_does_not_open_form_by_waves_and_train_exactly(
        tmp_path: Path, caplog) -> None:
    """Auto's relays decide on half the width (protocol/neighbourhood.py `wide`): where the data node forms by label
    waves, each relay waiting for scaled formation hands over at its first flow message."""
    caplog.set_level(logging.INFO, logger="gwtf.node")
    man, swarm_cm = _scaled_swarm(tmp_path, 2, data_scaled=False)
    async with swarm_cm as swarm:
        await swarm.start()
        records = await swarm.wait_records(ITERATIONS, 180)
        relays = [n for n in swarm.names() if n.startswith("r")]
        done = {n: swarm.nodes[n].parts.flows.scaling.done for n in relays}
        assert swarm.nodes["d0"].parts.flows.scaling is None
    assert all(done.values()), done
    assert caplog.text.count("forms its flows without scaled formation") >= len(relays), caplog.text[-3000:]
    _assert_exact(man, records)


async def test_a_relay_crashing_while_the_flows_form_scaled_calls_it_off_and_the_swarm_trains_exactly(
        tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.node")
    man, swarm_cm = _scaled_swarm(tmp_path, 3)
    async with swarm_cm as swarm:
        await swarm.start()

        def forming() -> str | None:
            for name, node in swarm.nodes.items():
                scaling = node.parts.flows.scaling
                if name.startswith("r") and scaling is not None and not scaling.done and scaling.machine.phase > 0:
                    return name
            return None

        victim = await until(forming, "a relay is in scaled formation", 60, poll_s=0.002)
        swarm.nodes[victim].stop()
        records = await swarm.wait_records(ITERATIONS, 240)
        alive = [n for n in swarm.names() if n != victim]
        done = {n: swarm.nodes[n].parts.flows.scaling.done for n in alive}
    text = caplog.text
    assert all(done.values()), done
    assert "scaled formation called off" in text, text[-3000:]
    _assert_exact(man, records, victim)


async def test_scaled_formation_frames_lost_are_sent_again_and_formation_ends_as_without_loss(
        tmp_path: Path, caplog, monkeypatch) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.node")
    monkeypatch.setenv("GWTF_DROP_SCALE", "25")  # every node loses every 25th numbered frame it sends, once
    man, swarm_cm = _scaled_swarm(tmp_path, 2)
    async with swarm_cm as swarm:
        await swarm.start()
        records = await swarm.wait_records(ITERATIONS, 240)
        # a lost ScaleDone is probed for: its relay may end formation after the iterations (over its sibling)
        await until(lambda: all(n.parts.flows.scaling.done for n in swarm.nodes.values()), "every node's formation "
                    "over", 120, poll_s=0.1)
        d0 = swarm.nodes["d0"].parts.flows
        await until(lambda: sum(d0.out().get(swarm.peer_id("d0"), {}).values()) == M, "the data node's demand placed",
                    60, poll_s=0.1)
        resend = {n: node.parts.flows.scaling.formation.resend for n, node in swarm.nodes.items()}
        placed = sum(d0.out().get(swarm.peer_id("d0"), {}).values())
    text = caplog.text
    lost = text.count("fault injection GWTF_DROP_SCALE")
    assert lost >= 2, text[-3000:]
    assert sum(r.resent for r in resend.values()) >= lost, {n: r.resent for n, r in resend.items()}
    assert text.count("scaled formation over after") == len(swarm.names()), text[-3000:]
    assert "called off" not in text and placed == M, placed
    _assert_exact(man, records)

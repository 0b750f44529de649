"""Auto's choice in the daemon (runtime/node/flows.py `_choose`, protocol/neighbourhood.py `wide`): with
`--scaled-formation` and `--flow-neighbours` not given, the data node forms by scaled formation where it knows at
least 10 relays a stage once it has measured its links, and by label waves otherwise; a relay that knows one data
node waits for scaled formation, bounding its links to 10 from 5 relays a stage; given options stay as given."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.neighbourhood import SCALED_NEIGHBOURS
from gwtf_node.protocol.scalemsgs import ScalePhase
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.driver import Drivers
from gwtf_node.runtime.node.flows import Flows

from support.helpers import RecordingWire

pytestmark = pytest.mark.trio


class _Stage:
    def hidden_size_mb(self) -> float:
        return 0.01


def _relay(others: int, data: int = 1, **opts) -> Flows:
    """Relay R of the last of 2 stages that knows `data` data nodes and `others` more relays of each stage (P0...
    before it, N1... beside it)."""
    peers = Peers("R", "r1_0", 2, Place("relay", 1, 2))
    for i in range(data):
        peers.peers[f"D{i}"] = PeerInfo(f"D{i}", "data", -1, f"d{i}", 2)
    for i in range(others):
        peers.peers[f"P{i}"] = PeerInfo(f"P{i}", "relay", 0, f"r0_{i}", 2)
        peers.peers[f"N{i}"] = PeerInfo(f"N{i}", "relay", 1, f"r1_{i + 1}", 2)
    flows = Flows(RecordingWire(), peers, None, _Stage(), Drivers(RecordingWire()), {}, lambda: None, **opts)

    async def measure(peer: str, next_side: bool) -> None:
        peers.set_rtt(peer, 5.0)

    flows._measure = measure
    return flows


async def _form(flows: Flows) -> Flows:
    prv = sorted(p for p in flows.peers.ids("relay", 0))
    assert await flows.form(sorted(flows.peers.data_nodes()), prv, joined=False) is True
    return flows


async def test_a_relay_that_knows_one_data_node_waits_for_it_to_choose_and_bounds_from_half_the_width() -> None:
    narrow = await _form(_relay(3))  # 7 relays of 2 stages
    assert narrow.scaling is not None and narrow.machine is None and narrow.neighbours == 0
    flows = await _form(_relay(5))  # 11 relays of 2 stages: at least 5 a stage
    assert flows.scaling is not None and flows.machine is None and flows.neighbours == SCALED_NEIGHBOURS
    flows.on_scale_message("D0", ScalePhase(1, 1, "1/2", 2))  # taken by its formation, not held
    assert not flows.scale_queue


def _data_node(per_stage: int, later: int = 0) -> Flows:
    """A data node of 2 stages of `per_stage` relays; `later` more relays of stage 0 are heard of while it measures
    its links."""
    peers = Peers("R", "d0", 2, Place("data", -1, 2))  # (RecordingWire's node id)
    for st in (0, 1):
        for i in range(per_stage):
            peers.peers[f"S{st}_{i}"] = PeerInfo(f"S{st}_{i}", "relay", st, f"r{st}_{i}", 2)
    flows = Flows(RecordingWire(), peers, None, _Stage(), Drivers(RecordingWire()), {}, lambda: None)

    async def measure(peer: str, next_side: bool) -> None:
        for i in range(later):
            peers.peers.setdefault(f"L{i}", PeerInfo(f"L{i}", "relay", 0, f"r0_{per_stage + i}", 2))
        peers.set_rtt(peer, 5.0)

    flows._measure = measure
    return flows


async def test_the_data_node_chooses_once_it_has_measured_its_links() -> None:
    async def form(flows: Flows) -> Flows:
        assert await flows.form(flows.peers.ids("relay", 0), flows.peers.ids("relay", 1), joined=False) is True
        return flows

    narrow = await form(_data_node(9))
    assert narrow.machine is not None and narrow.scaling is None  # 9 a stage: label waves
    assert (await form(_data_node(10))).scaling is not None
    # 9 a stage when it starts measuring (half the width: it measures as for scaled formation), 2 more heard of
    grown = await form(_data_node(9, later=2))
    assert grown.scaling is not None and grown.machine is None and "L0" in grown.next_costs


async def test_given_options_stay_and_several_data_nodes_keep_the_waves() -> None:
    waves = await _form(_relay(12, scaled=False))
    assert waves.machine is not None and waves.scaling is None and waves.neighbours == SCALED_NEIGHBOURS
    every = await _form(_relay(12, neighbours=0))
    assert every.scaling is not None and every.neighbours == 0
    two = await _form(_relay(12, data=2))
    assert two.machine is not None and two.scaling is None and two.neighbours == 0


async def test_a_scale_message_before_the_links_are_measured_waits_for_auto_s_choice() -> None:
    auto, waves = _relay(5), _relay(5, scaled=False)
    for f in (auto, waves):
        f.on_scale_message("D0", ScalePhase(1, 1, "1/2", 2))
    assert len(auto.scale_queue) == 1 and not waves.scale_queue  # (waves given: never scaled here)
    await _form(auto)
    assert not auto.scale_queue and auto.scaling is not None


async def test_a_flow_message_that_came_while_the_links_were_measured_ends_the_wait_at_once() -> None:
    """The data node formed by label waves and a neighbour's flow message came before this relay's links were
    measured: it does not wait for a first phase (until GIVE_UP_S) but starts its flow machine and takes the
    message (a swarm on a loaded host: stage 0 waited while stage 1 trained nothing)."""
    from gwtf_node.protocol.messages import CostAnnounce, Label, Side

    flows = _relay(5)
    msg = CostAnnounce((Label("D0", Side.OUT, 7.0, ("N0",), 1),))
    flows.on_message("N0", msg)
    assert flows.machine is None and flows.queue == [("N0", msg)]
    await _form(flows)
    assert flows.scaling is not None and flows.scaling.done and flows.machine is not None and not flows.queue


async def test_a_relay_judges_the_width_by_the_stages_it_knows() -> None:
    """A relay of a 9-stage swarm knows the relays of its own and the adjacent stages (55 daemons: 3-18 of 54 when
    they formed): 11 a stage there bounds its links, though 32 relays are fewer than half of 9 x 10."""
    peers = Peers("R", "r1_0", 9, Place("relay", 1, 2))
    peers.peers["D0"] = PeerInfo("D0", "data", -1, "d0", 2)
    for st in (0, 1, 2):
        for i in range(11 - (st == 1)):
            peers.peers[f"S{st}_{i}"] = PeerInfo(f"S{st}_{i}", "relay", st, f"r{st}_{i + 1}", 2)
    flows = Flows(RecordingWire(), peers, None, _Stage(), Drivers(RecordingWire()), {}, lambda: None)
    flows._choose(True)
    assert flows.scaled and flows.neighbours == SCALED_NEIGHBOURS
    for i in range(4, 11):  # 4 a stage known beside its own stage's: too narrow to bound
        peers.peers.pop(f"S0_{i}"), peers.peers.pop(f"S2_{i}"), peers.peers.pop(f"S1_{i - 1}", None)
    flows._choose(True)
    assert flows.scaled and flows.neighbours == 0  # (it waits all the same: the data node decides)

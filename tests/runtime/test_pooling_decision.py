"""A relay with pooled formation that knows one data node when its links are measured decides on evidence
(runtime/node/flows.py): a second data node's Hello starts pooled formation, a neighbour's per-data-node flow
message starts the flow machine; and a data node heard of during pooled formation is added as its sides."""

from __future__ import annotations

import pytest

from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.driver import Drivers
from gwtf_node.runtime.node.flows import Flows

from support.helpers import RecordingWire

pytestmark = pytest.mark.trio


def _relay(*data: str) -> tuple[Flows, Peers]:
    """A relay of the last of 2 stages with pooled formation, its links measured with `data` known."""
    peers = Peers("R", "r1_0", 2, Place("relay", 1, 2))
    for d in data:
        peers.peers[d] = PeerInfo(d, "data", -1, d, 2)
    peers.peers["P"] = PeerInfo("P", "relay", 0, "r0_0", 2)
    wire = RecordingWire()
    flows = Flows(wire, peers, None, None, Drivers(wire), {}, lambda: None, pooled=True)
    return flows, peers


async def test_one_data_node_known_waits_and_a_second_one_starts_pooled_formation() -> None:
    flows, peers = _relay("A")
    await flows.form([], [], joined=False)
    assert flows.undecided and flows.pooling is None and flows.machine is None
    peers.peers["B"] = info = PeerInfo("B", "data", -1, "B", 2)
    flows.on_peer_hello(info)
    assert not flows.undecided and flows.pooling is not None and flows.machine is None
    assert flows.pooling.data == {"A", "B"} and flows.pooling.pool_id == "A/pool"
    # both data nodes after this last stage, and the previous-stage relay, are measured and added as links
    assert {(name, args[0]) for name, *args in flows.wire.spawned} >= {("_add_neighbour", "A"),
                                                                       ("_add_neighbour", "B"),
                                                                       ("_add_neighbour", "P")}
    flows.pooling.add_neighbour("B", 3.0, "next")
    assert flows.pooling.machines[""].cfg.next_costs == {"B/snk": 3.0}


async def test_one_data_node_known_and_a_neighbours_flow_message_starts_the_flow_machine() -> None:
    flows, _ = _relay("A")
    await flows.form([], [], joined=False)
    label = m.Label("A", m.Side.OUT, 5.0, ("P", "A"))
    flows.on_message("P", m.CostAnnounce((label,)))
    assert not flows.undecided and flows.pooling is None and flows.machine is not None
    assert flows.machine.cfg.commodities == ("A",) and flows.queue == []


async def test_two_data_nodes_known_start_pooled_formation_at_once() -> None:
    flows, _ = _relay("A", "B")
    await flows.form([], [], joined=False)
    assert not flows.undecided and flows.pooling is not None


async def test_a_joined_relay_or_no_pooled_formation_starts_the_flow_machine() -> None:
    flows, _ = _relay("A")
    await flows.form([], [], joined=True)
    assert flows.machine is not None and not flows.undecided
    flows, _ = _relay("A", "B")
    flows.pooled = False
    await flows.form([], [], joined=False)
    assert flows.machine is not None and flows.pooling is None


async def test_a_peer_gone_while_the_relay_waits_is_no_link_of_what_it_starts() -> None:
    flows, peers = _relay("A")
    await flows.form([], [], joined=False)
    flows.prev_costs["P"] = 1.0  # (as measured when its links were)
    flows.on_peer_gone("P")
    assert "P" not in flows.prev_costs and flows.undecided

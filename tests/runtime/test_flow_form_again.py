"""Flow formation when a side goes while its links are measured (runtime/node/flows.py `form`): a last-stage relay
whose data node was presumed dead for a few seconds then started a flow machine with no commodity, and the swarm's
flows never placed a unit through it; now it starts nothing and measures again once the swarm is quiet."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.driver import Drivers
from gwtf_node.runtime.node.flows import Flows

from support.helpers import RecordingWire

pytestmark = pytest.mark.trio


class _Stage:
    def hidden_size_mb(self) -> float:
        return 0.01


def _last_stage_relay() -> tuple[Flows, Peers, list[str]]:
    """A relay of the last of 2 stages: its next side is data node D, its previous side relay P.  Measuring a
    link takes no time here; measuring D's finds it gone when `gone` names it (presumed dead meanwhile)."""
    peers = Peers("R", "r1_0", 2, Place("relay", 1, 2))
    peers.peers["D"] = PeerInfo("D", "data", -1, "d0", 2)
    peers.peers["P"] = PeerInfo("P", "relay", 0, "r0_0", 2)
    flows = Flows(RecordingWire(), peers, None, _Stage(), Drivers(RecordingWire()), {}, lambda: None,
                  scaled=False)  # (label waves: auto would wait for the data node's choice)
    gone: list[str] = []

    async def measure(peer: str, next_side: bool) -> None:
        if peer in gone:
            peers.peers.pop(peer, None)
        elif peer in peers.peers:
            peers.set_rtt(peer, 5.0)

    flows._measure = measure
    return flows, peers, gone


async def test_a_data_node_gone_while_measured_starts_no_machine_and_the_next_formation_carries_it() -> None:
    flows, peers, gone = _last_stage_relay()
    gone.append("D")
    assert await flows.form(["D"], ["P"], joined=False) is False
    assert flows.machine is None  # not a machine without the data node's commodity
    gone.clear()
    peers.peers["D"] = PeerInfo("D", "data", -1, "d0", 2)  # back: its Hello
    assert await flows.form(["D"], ["P"], joined=False) is True
    assert flows.machine is not None and flows.machine.cfg.commodities == ("D",)
    assert set(flows.machine.cfg.next_costs) == {"D"} and set(flows.machine.cfg.prev_costs) == {"P"}


async def test_a_side_still_there_starts_the_machine_at_once() -> None:
    flows, _, _ = _last_stage_relay()
    assert await flows.form(["D"], ["P"], joined=False) is True and flows.machine is not None


async def test_a_relay_that_knows_no_data_node_yet_starts_no_machine() -> None:
    # a middle relay measured its links before the data node's Hello came: its machine had no commodity
    flows, peers, _ = _last_stage_relay()
    peers.peers.pop("D")
    peers.peers["N"] = PeerInfo("N", "relay", 1, "r1_1", 2)  # (a next side without a data node)
    assert await flows.form(["N"], ["P"], joined=False) is False and flows.machine is None
    peers.peers["D"] = PeerInfo("D", "data", -1, "d0", 2)
    assert await flows.form(["D"], ["P"], joined=False) is True and flows.machine.cfg.commodities == ("D",)


async def test_a_relay_whose_scaled_formation_ends_while_its_data_node_is_presumed_dead_keeps_its_commodity() -> None:
    """Scaled formation ended at a relay (here: a neighbour's flow message before any phase) while its data node
    was presumed dead: its flow machine carries that data node's units all the same, and links to it again when
    its Hello comes back (a machine with no commodity never carried a unit: 55 daemons, 5 of 6 units)."""
    from gwtf_node.protocol.messages import CostAnnounce, Label, Side

    flows, peers, _ = _last_stage_relay()
    flows.options = (True, None)  # (join --scaled-formation)
    assert await flows.form(["D"], ["P"], joined=False) is True
    assert flows.scaling is not None and flows.machine is None  # waiting for the data node's first phase
    info = peers.peers["D"]
    peers.forget("D")
    flows.on_peer_gone("D")  # presumed dead
    flows.on_message("P", CostAnnounce((Label("D", Side.OUT, 7.0, ("P",), 1),)))
    assert flows.machine is not None and flows.machine.cfg.commodities == ("D",)
    assert "D" not in flows.machine.cfg.next_costs
    peers.peers["D"] = info  # back: its Hello
    flows.on_peer_hello(info)
    assert ("_add_neighbour", "D", ("next",)) in flows.wire.spawned  # measured, then added to the flow machine

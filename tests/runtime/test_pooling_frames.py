"""A node's pooled machines take only well-formed PoolFrames for a role it hosts (runtime/node/pooling.py).

A relay of a run with data nodes A and B: its pooled machine links to both
source sides; a frame for a role it does not host, from a role that does not
exist, holding bytes that are no frame, a message that is neither a flow nor a
homing message, a homing order not from the pool, or a value out of bounds is
refused (the daemon logs and counts it, and goes on); a flow message from no
link yet goes to the machine, which keeps its labels for when the link is added
(`Pooling.add_neighbour`: a peer heard of after pooled formation began) and
answers its requests NOT_LINKED; the pool's Install hands the node over with
the installed units.
"""

from __future__ import annotations

import random

import pytest

from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.wire import FrameRefused
from gwtf_node.runtime.node.driver import Drivers
from gwtf_node.runtime.node.flows import FLOW_MSGS
from gwtf_node.protocol.flow.poolnodes import pooled_machines, split_id
from gwtf_node.runtime.node.pooling import Pooling
from support.helpers import RecordingWire

pytestmark = pytest.mark.trio


def _relay() -> tuple[Pooling, list]:
    done: list = []
    machines = pooled_machines("R", True, 2, ["A", "B"], {"A": 2, "B": 2}, {"S": 1.0}, {"A": 1.0, "B": 2.0}, (),
                               lambda nid: random.Random(0))
    wire = RecordingWire()
    p = Pooling(wire, Drivers(wire), machines, lambda: done.append(True), ("A", "B"))
    p.start()
    return p, done


def _frame(msg, role: str = "", sender_role: str = "") -> m.PoolFrame:
    return m.PoolFrame(role, sender_role, codec.encode("", msg))


async def test_the_relays_machine_links_to_the_data_nodes_sides() -> None:
    p, _ = _relay()
    cfg = p.machines[""].cfg
    assert p.pool_id == "A/pool" and cfg.commodities == ("A/pool",)
    assert dict(cfg.prev_costs) == {"A/src": 1.0, "B/src": 2.0} and dict(cfg.next_costs) == {"S": 1.0}
    data = pooled_machines("A", False, 2, ["A", "B"], {"A": 2, "B": 3}, {"R": 1.0}, {"S": 1.0}, (),
                           lambda nid: random.Random(0))
    assert sorted(data) == ["pool", "snk", "src"]
    assert data["pool"].inner.cfg.capacity == 5 and set(data["pool"].cfg.next_costs) == {"A/src", "B/src"}
    assert dict(data["src"].cfg.next_costs) == {"R": 1.0} and set(data["snk"].cfg.next_costs) == {"A/pool"}


@pytest.mark.parametrize("peer, frame, why", [
    ("A", _frame(m.HomingStart(1), role="snk", sender_role="pool"), "role 'snk'"),
    ("A", _frame(m.HomingStart(1), sender_role="boss"), "from role 'boss'"),
    ("A", m.PoolFrame("", "src", b"\x01\x02garbage"), "no valid frame"),
    ("A", _frame(m.Ping(1), sender_role="src"), "not a Ping"),
    ("B", _frame(m.Install(1, ()), sender_role="src"), "only the pool"),
    ("A", _frame(m.CostReply(1, (("S", -5.0),)), sender_role="pool"), "negative_cost"),
])
async def test_bad_pool_frames_are_refused(peer: str, frame: m.PoolFrame, why: str) -> None:
    p, done = _relay()
    with pytest.raises(FrameRefused, match=why):
        p.on_frame(peer, frame, FLOW_MSGS)
    assert not done and not p.done


async def test_the_pools_install_hands_the_node_over() -> None:
    p, done = _relay()
    routes = (m.Route("A", "A", "S", 1), m.Route("B", "B", "S", 1))
    p.on_frame("A", _frame(m.Install(1, routes), sender_role="pool"), FLOW_MSGS)
    assert done == [True] and p.done
    assert p.installed() == ({"A": {"A": 1}, "B": {"B": 1}}, {"A": {"S": 1}, "B": {"S": 1}})


def _sent(p: Pooling, peer: str) -> list:
    return [codec.decode(f.frame)[1] for f in p.outbox.queued.get(peer, [])]


async def test_a_request_from_no_link_is_answered_not_linked() -> None:
    p, done = _relay()
    p.on_frame("Z", _frame(m.RequestFlow(7, "A/pool", 1.0)), FLOW_MSGS)
    reply = _sent(p, "Z")[-1]
    assert isinstance(reply, m.FlowReply) and reply.req_id == 7 and reply.outcome is m.Reply.NOT_LINKED
    assert not done and sum(p.machines[""].inner.inn["A/pool"].values()) == 0


async def test_peers_heard_of_later_are_added_and_their_early_labels_kept() -> None:
    p, _ = _relay()
    pm = p.machines[""]
    label = m.Label("A/pool", m.Side.IN, 4.0, ("T", "A/snk"))
    p.on_frame("T", _frame(m.CostAnnounce((label,))), FLOW_MSGS)  # before this relay links to T
    assert "T" not in pm.cfg.next_costs and not p.linked("T")
    p.add_neighbour("T", 2.0, "next")
    p.add_neighbour("B", 3.0, "next")  # a data node after this (last) stage: its sink side
    p.add_neighbour("U", 0.0, "peer")
    assert pm.cfg.next_costs == {"S": 1.0, "T": 2.0, "B/snk": 3.0} and "U" in pm.cfg.peers
    assert p.linked("T") and p.linked("B") and p.linked("U") and not p.linked("Z")
    assert pm.inner.labels.lin["A/pool"]["T"].cost == 4.0  # the label T sent before it was linked
    assert {split_id(n)[0] for n in pm.cfg.prev_costs} == {"A", "B"}

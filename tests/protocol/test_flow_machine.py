"""Unit tests of the FlowNode machine (gwtf_node/protocol/flow/), driven directly, plus a pair test over the codec."""

from __future__ import annotations

import heapq
import random

from gwtf_node.protocol.codec import decode, encode
from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.flow import Annealer, units
from gwtf_node.protocol.flow.state import Via
from gwtf_node.protocol.messages import (
    INF, CostAnnounce, Deny, DenyReason, FlowReply, FlowReport, HopFlow, Label, LaunchBid, MoveReply, QueryFlows,
    Relabel, RelabelCost, Reply, RequestChange, RequestFlow, RequestRedirect, Reroute, Side, Withdraw,
)
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import extract_flows, flow_configs
from gwtf_node.sim.validate import check_routing
from support.helpers import sends
from support.scenarios import SMALL_TWO_STAGE

D = "d0"
PREV = {"P1": 2.0, "P2": 5.0}
NEXT = {"N1": 3.0, "N2": 7.0}


def relay(capacity=1, displace=True, node_id="R", same_wave_launches=True, **extra):
    cfg = FlowConfig(node_id, False, capacity, (D,), dict(NEXT), dict(PREV), peers=("S",), displace=displace,
                     same_wave_launches=same_wave_launches, **extra)
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    return m


def in_label(node, cost, path=None):
    return Label(D, Side.IN, cost, tuple(path) if path is not None else (node + "+", node + "-", D + "+"))


def one(eff, typ, to=None):
    got = sends(eff, typ, to)
    assert len(got) == 1, f"expected one {typ.__name__} to {to}, got {eff}"
    return got[0]


def relay_with_n1_label(**kw):
    """R hears N1's IN label 10: its IN label becomes 3 + 10 = 13 via N1."""
    m = relay(**kw)
    m.on_message(0.1, "N1", CostAnnounce((in_label("N1", 10.0),)))
    assert m.my_in[D].cost == 13.0 and m.dec_in[D] == (Via.FORWARD, "N1")
    return m


def settled_relay(**kw):
    """R carries one unit P1 -> R -> N1, nothing pending (quiet)."""
    m = relay_with_n1_label(**kw)
    eff = m.on_message(1.0, "P1", RequestFlow(1, D, 13.0))
    fwd = one(eff, RequestFlow, "N1")
    assert fwd.msg.expected_cost == 10.0 and not fwd.msg.forced
    m.on_message(1.1, "N1", FlowReply(fwd.msg.req_id, D, Reply.APPROVED, None))
    assert m.out[D] == {"N1": 1} and m.inn[D] == {"P1": 1}
    assert not m.pending and units.quiet(m)
    return m


# ------------------------------------------------------------ Request Flow


def test_request_flow_approved_when_expected_cost_matches():
    m = relay_with_n1_label()
    eff = m.on_message(1.0, "P1", RequestFlow(7, D, 13.0))
    rep = one(eff, FlowReply, "P1")
    assert rep.msg == FlowReply(7, D, Reply.APPROVED, None)
    assert m.inn[D] == {"P1": 1}
    # the machine passes the unit on along its OUT label
    assert one(eff, RequestFlow, "N1").msg.expected_cost == 10.0


def test_request_flow_cost_changed_carries_current_label():
    m = relay_with_n1_label()
    eff = m.on_message(1.0, "P1", RequestFlow(7, D, 12.0))
    rep = one(eff, FlowReply, "P1").msg
    assert rep.outcome == Reply.COST_CHANGED and rep.req_id == 7
    assert rep.current is not None and rep.current.cost == 13.0 and rep.current.side == Side.IN
    assert rep.current.epoch == m.epoch[D]  # the wire label carries the wave's epoch
    assert (rep.current.cost, rep.current.path) == (m.my_in[D].cost, m.my_in[D].path)
    assert m.inn[D] == {}


def test_request_flow_no_capacity_when_full_and_nothing_to_displace():
    m = relay_with_n1_label(displace=False)
    m.on_message(1.0, "P1", RequestFlow(1, D, 13.0))
    assert m.used() == 1 and m.my_in[D].cost == INF
    eff = m.on_message(1.1, "P2", RequestFlow(2, D, 13.0))
    rep = one(eff, FlowReply, "P2").msg
    assert rep.outcome == Reply.NO_CAPACITY
    assert m.inn[D] == {"P1": 1}


def test_request_flow_zero_capacity_relay_has_no_capacity():
    m = relay(capacity=0)
    m.on_message(0.1, "N1", CostAnnounce((in_label("N1", 10.0),)))
    assert m.my_in[D].cost == INF
    rep = one(m.on_message(1.0, "P1", RequestFlow(1, D, 13.0)), FlowReply, "P1").msg
    assert rep.outcome == Reply.NO_CAPACITY and m.used() == 0


def test_request_flow_from_unknown_sender_not_linked():
    m = relay_with_n1_label()
    eff = m.on_message(1.0, "X", RequestFlow(3, D, 13.0))
    assert one(eff, FlowReply, "X").msg.outcome == Reply.NOT_LINKED
    # a next-stage peer is not an upstream peer either
    eff = m.on_message(1.0, "N2", RequestFlow(4, D, 13.0))
    assert one(eff, FlowReply, "N2").msg.outcome == Reply.NOT_LINKED
    # nor is an unknown commodity accepted
    eff = m.on_message(1.0, "P1", RequestFlow(5, "zz", 13.0))
    assert one(eff, FlowReply, "P1").msg.outcome == Reply.NOT_LINKED
    assert m.used() == 0


def test_full_relay_displaces_upstream_unit():
    m = settled_relay(capacity=1, displace=True)
    # P1's OUT label (cost to get rid of the unit it holds) is 4: displacing P1 costs 4 - d(P1,R)=2
    m.on_message(1.2, "P1", CostAnnounce((Label(D, Side.OUT, 4.0, ("P1-", "Q+", "Q-", D + "+")),)))
    assert m.my_in[D].cost == 2.0 and m.dec_in[D] == (Via.BACK, "P1")
    eff = m.on_message(1.3, "P2", RequestFlow(9, D, 2.0))
    assert one(eff, FlowReply, "P2").msg.outcome == Reply.APPROVED
    assert one(eff, Deny, "P1").msg == Deny(D, DenyReason.DISPLACED)
    assert m.inn[D] == {"P2": 1} and m.used() == 1


def _holding_in_wave(formation: bool, **kw):
    """R in wave 1 of d0 (a formation wave or not) carries one unit P1 -> R -> N1 and hears P1's OUT label 4."""
    m = relay(capacity=1, displace=True, **kw)
    wave = lambda lab: Label(lab.commodity, lab.side, lab.cost, lab.path, 1, formation)  # noqa: E731
    m.on_message(0.1, "N1", CostAnnounce((wave(in_label("N1", 10.0)),)))
    eff = m.on_message(5.0, "P1", RequestFlow(1, D, 13.0))  # (long after the wave: its labels are still)
    m.on_message(5.1, "N1", FlowReply(one(eff, RequestFlow, "N1").msg.req_id, D, Reply.APPROVED, None))
    assert m.out[D] == {"N1": 1} and m.inn[D] == {"P1": 1}
    m.on_message(5.2, "P1", CostAnnounce((wave(Label(D, Side.OUT, 4.0, ("P1-", "Q+", "Q-", D + "+"))),)))
    return m


def test_a_hand_back_costs_minus_its_link_in_a_formation_wave_and_nothing_once_the_flows_re_form():
    """Displacing P1's unit costs P1's OUT label less d(P1, R) = 2 on a formation wave (the residual backward edge
    of successive shortest paths); on a wave after a removal or a cost change (unmarked: flow/waves.py) it costs
    P1's OUT label alone, so that no label falls below 0 around a negative cycle that the changed flows may hold
    (labels.py `back_candidates`; docs/bench_flow.md, "Flaps: relays presumed dead and taken back")."""
    m = _holding_in_wave(formation=True)
    assert m.my_in[D].cost == 2.0 and m.dec_in[D] == (Via.BACK, "P1")
    assert m.my_out[D].cost == 2.0 and m.dec_out[D] == (Via.BACK, "P1")
    m = _holding_in_wave(formation=False)
    assert m.my_in[D].cost == 4.0 and m.dec_in[D] == (Via.BACK, "P1")
    assert m.my_out[D].cost == 4.0 and m.dec_out[D] == (Via.BACK, "P1")  # (forwarding via N1 costs 13)
    m = _holding_in_wave(formation=False, reform_free_back=False)  # the option off: as on a formation wave
    assert m.my_in[D].cost == 2.0 and m.my_out[D].cost == 2.0


def test_upstream_out_label_recomputes_only_the_back_candidates(monkeypatch):
    from gwtf_node.protocol.flow import labels as label_module
    m = settled_relay(capacity=1, displace=True)
    calls = []
    full = label_module.compute
    monkeypatch.setattr(label_module, "compute", lambda node, d: (calls.append(d), full(node, d)))
    m.on_message(1.2, "P1", CostAnnounce((Label(D, Side.OUT, 4.0, ("P1-", "Q+", "Q-", D + "+")),)))
    assert m.my_in[D].cost == 2.0 and m.dec_in[D] == (Via.BACK, "P1")
    assert m.my_out[D].cost == 2.0 and m.dec_out[D] == (Via.BACK, "P1")  # cheaper than forwarding via N1 (13)
    # P1's OUT label rises: the cached back candidate must not stay at 4
    m.on_message(1.3, "P1", CostAnnounce((Label(D, Side.OUT, 20.0, ("P1-", "Q+", "Q-", D + "+")),)))
    assert m.my_in[D].cost == 18.0 and m.dec_in[D] == (Via.BACK, "P1")
    assert m.my_out[D].cost == 13.0 and m.dec_out[D] == (Via.FORWARD, "N1")
    assert not calls  # folded (labels.fold_out): the next-stage labels were not scanned again
    labels = (m.my_in[D], m.my_out[D], m.dec_in[D], m.dec_out[D])
    full(m, D)
    assert (m.my_in[D], m.my_out[D], m.dec_in[D], m.dec_out[D]) == labels  # what a full recomputation gives


def test_displacing_the_requesters_own_unit_is_refused():
    m = settled_relay(capacity=1, displace=True)
    m.on_message(1.2, "P1", CostAnnounce((Label(D, Side.OUT, 4.0, ("P1-", "Q+", "Q-", D + "+")),)))
    eff = m.on_message(1.3, "P1", RequestFlow(9, D, 2.0))
    rep = one(eff, FlowReply, "P1").msg
    assert rep.outcome == Reply.NO_CAPACITY and rep.current.cost == INF
    assert not sends(eff, Deny) and m.inn[D] == {"P1": 1}


def test_forced_request_flow_always_accepted():
    m = settled_relay(capacity=1, displace=False)
    assert m.my_in[D].cost == INF
    eff = m.on_message(2.0, "P2", RequestFlow(11, D, 0.0, forced=True))
    assert one(eff, FlowReply, "P2").msg.outcome == Reply.APPROVED
    assert m.inn[D] == {"P1": 1, "P2": 1} and m.used() == 2
    assert m.grace_until >= 2.0 + m.cfg.balance_grace_s - 1e-9


# ------------------------------------------------------------ replies, Deny, Withdraw


def test_flow_reply_approved_increments_out_and_rejection_updates_label():
    m = relay_with_n1_label(same_wave_launches=False)  # one unit per wave: the unit goes on at the new cost
    eff = m.on_message(1.0, "P1", RequestFlow(1, D, 13.0))
    rid = one(eff, RequestFlow, "N1").msg.req_id
    # rejection: the label of N1 is replaced by the one N1 tells
    eff = m.on_message(1.1, "N1", FlowReply(rid, D, Reply.COST_CHANGED, in_label("N1", 20.0)))
    assert m.out[D] == {} and m.lin[D]["N1"].cost == 20.0
    assert m.my_out[D].cost == 23.0
    fwd = one(eff, RequestFlow, "N1")  # retried at once with the cost it was told
    assert fwd.msg.expected_cost == 20.0
    m.on_message(1.6, "N1", FlowReply(fwd.msg.req_id, D, Reply.APPROVED, None))
    assert m.out[D] == {"N1": 1} and not m.pending and not m.token_pending


def test_same_wave_unit_without_a_tight_route_retreats_to_its_sender():
    """With several units per wave, a unit whose route rose above the wave's label is not sent on at the
    higher cost (not a shortest path any more): it goes back to the node it came from (DENY)."""
    m = relay_with_n1_label()
    eff = m.on_message(1.0, "P1", RequestFlow(1, D, 13.0))
    rid = one(eff, RequestFlow, "N1").msg.req_id
    eff = m.on_message(1.1, "N1", FlowReply(rid, D, Reply.COST_CHANGED, in_label("N1", 20.0)))
    assert m.my_out[D].cost == 23.0 and not sends(eff, RequestFlow)
    assert one(eff, Deny, "P1").msg.reason == DenyReason.NO_ROUTE
    assert m.inn[D] == {} and m.out[D] == {}


def test_same_wave_retreat_undoes_a_displacement():
    """A unit handed back by a displacement that finds no tight route goes back to the displacer (forced
    Request Flow, after telling it our OUT label rose); the displacer hands its own arrival back upstream."""
    # the displacer: full, its IN label displaces P1's unit
    x = relay_with_n1_label()
    x.on_message(0.2, "P1", CostAnnounce((Label(D, Side.OUT, 20.0, ("P1-", "Z+", "d0+")),)))
    fwd = one(x.on_message(1.0, "P1", RequestFlow(1, D, 13.0)), RequestFlow, "N1")
    x.on_message(1.1, "N1", FlowReply(fwd.msg.req_id, D, Reply.APPROVED, None))
    x.on_message(1.2, "P1", CostAnnounce((Label(D, Side.OUT, 15.0, ("P1-", "Z+", "d0+")),)))
    assert x.dec_in[D] == (Via.BACK, "P1") and x.my_in[D].cost == 13.0
    eff = x.on_message(2.0, "P2", RequestFlow(2, D, 13.0))
    assert one(eff, Deny, "P1").msg.reason == DenyReason.DISPLACED
    assert x.inn[D] == {"P2": 1}
    # P1 cannot place the unit at its wave's cost: it undoes the step, and x hands P2's unit back
    eff = x.on_message(2.1, "P1", RequestFlow(3, D, 0.0, forced=True))
    assert one(eff, FlowReply, "P1").msg.outcome == Reply.APPROVED
    assert one(eff, Deny, "P2").msg.reason == DenyReason.NO_ROUTE
    assert x.inn[D] == {"P1": 1}


def test_stale_flow_reply_is_ignored():
    m = settled_relay()
    before = m.stats.ignored
    m.on_message(2.0, "N1", FlowReply(999, D, Reply.APPROVED, None))
    assert m.out[D] == {"N1": 1} and m.stats.ignored == before + 1


def test_deny_decrements_out_and_unit_is_sent_again():
    m = settled_relay()
    eff = m.on_message(2.0, "N1", Deny(D, DenyReason.NO_ROUTE))
    assert m.out[D] == {}
    assert m.inn[D] == {"P1": 1}  # the unit is held again, unpaired
    # N1's label still says 10, so it re-dispatches (or denies upstream); either way it acts
    assert sends(eff, RequestFlow) or sends(eff, Deny)


def test_deny_for_a_link_without_flow_is_ignored():
    m = settled_relay()
    before = m.stats.ignored
    m.on_message(2.0, "N2", Deny(D, DenyReason.NO_ROUTE))
    assert m.out[D] == {"N1": 1} and m.stats.ignored == before + 1


def test_withdraw_approved_then_no_such_flow():
    m = settled_relay()
    eff = m.on_message(2.0, "P1", Withdraw(21, D))
    assert one(eff, FlowReply, "P1").msg == FlowReply(21, D, Reply.APPROVED, None)
    assert m.inn[D] == {}
    eff = m.on_message(2.1, "P1", Withdraw(22, D))
    assert one(eff, FlowReply, "P1").msg.outcome == Reply.NO_SUCH_FLOW
    eff = m.on_message(2.1, "P2", Withdraw(23, D))
    assert one(eff, FlowReply, "P2").msg.outcome == Reply.NO_SUCH_FLOW


def test_sender_of_withdraw_updates_out_on_approval():
    m = settled_relay()
    units.withdraw_one(m, 2.0, D, eff := [])
    w = one(eff, Withdraw, "N1")
    m.on_message(2.1, "N1", FlowReply(w.msg.req_id, D, Reply.APPROVED, None))
    assert m.out[D] == {}


def test_reroute_sends_forced_request_to_new_hop():
    m = settled_relay()
    # P1 is the sender view: make a machine at stage P with R as next hop; simpler: R reroutes its own out
    eff = m.on_message(2.0, "N1", Reroute(D, "N2"))
    assert m.out[D] == {}
    fwd = one(eff, RequestFlow, "N2")
    assert fwd.msg.forced


# ------------------------------------------------------------ CostAnnounce


def test_cost_announce_updates_labels_and_is_forwarded_upstream():
    m = relay()
    assert m.my_in[D].cost == INF
    eff = m.on_message(0.1, "N2", CostAnnounce((in_label("N2", 1.0),)))
    assert m.lin[D]["N2"].cost == 1.0
    assert m.my_in[D].cost == 8.0 and m.my_out[D].cost == 8.0
    # coalesced: the announcement goes out when the window closes, one message per peer
    timer = [e for e in eff if isinstance(e, SetTimer) and e.key == "announce"]
    assert len(timer) == 1 and not sends(eff, CostAnnounce)
    eff = m.on_timer(timer[0].deadline, "announce")
    for p in PREV:
        ann = one(eff, CostAnnounce, p).msg
        assert any(l.side == Side.IN and l.cost == 8.0 and l.epoch == 0 and l.path[:2] == ("R+", "R-") for l in ann.labels)
    # a cheaper route via N1 wins
    m.on_message(0.2, "N1", CostAnnounce((in_label("N1", 2.0),)))
    assert m.my_in[D].cost == 5.0 and m.dec_in[D] == (Via.FORWARD, "N1")
    # and a worse one for N1 switches back to N2
    m.on_message(0.3, "N1", CostAnnounce((in_label("N1", 50.0),)))
    assert m.my_in[D].cost == 8.0 and m.dec_in[D] == (Via.FORWARD, "N2")


def test_label_whose_path_contains_the_node_is_ignored():
    m = relay()
    eff = m.on_message(0.1, "N1", CostAnnounce((in_label("N1", 1.0, ("N1+", "N1-", "R-", "R+", D + "+")),)))
    assert m.my_in[D].cost == INF and m.my_out[D].cost == INF
    assert not sends(eff, CostAnnounce)
    m.on_message(0.2, "N1", CostAnnounce((in_label("N1", 1.0, ("N1+", "N1-", "R+", D + "+")),)))
    assert m.my_in[D].cost == INF  # R+ on the path: not usable for IN


def test_announce_from_wrong_side_or_commodity_is_ignored():
    m = relay()
    m.on_message(0.1, "P1", CostAnnounce((in_label("P1", 1.0),)))  # IN label from upstream peer
    m.on_message(0.1, "X", CostAnnounce((in_label("X", 1.0),)))
    m.on_message(0.1, "N1", CostAnnounce((Label("zz", Side.IN, 1.0, ("N1+",)),)))
    assert m.lin[D] == {} and m.my_in[D].cost == INF


# ------------------------------------------------------------ data node


def data_node(waves=True):
    cfg = FlowConfig(D, True, 3, (D, "d1"), {"A": 1.0}, {"Z": 2.0}, waves=waves)
    m = FlowNode(cfg, random.Random(0))
    return m, m.start(0.0)


def test_data_node_sink_label_is_zero_and_announced():
    m, eff = data_node()
    assert m.my_in[D].cost == 0.0 and m.my_in[D].side == Side.IN
    ann = one(eff, CostAnnounce, "Z").msg
    assert [l.cost for l in ann.labels if l.side == Side.IN and l.commodity == D] == [0.0]
    assert D + "+" in m.my_in[D].path


def test_data_node_approves_own_commodity_refuses_others():
    m, _ = data_node()
    eff = m.on_message(1.0, "Z", RequestFlow(1, D, 0.0))
    assert one(eff, FlowReply, "Z").msg.outcome == Reply.APPROVED
    assert m.inn[D] == {"Z": 1}
    eff = m.on_message(1.0, "Z", RequestFlow(2, "d1", 0.0))
    assert one(eff, FlowReply, "Z").msg.outcome == Reply.NO_CAPACITY
    assert m.inn["d1"] == {}
    eff = m.on_message(1.0, "A", RequestFlow(3, D, 0.0))
    assert one(eff, FlowReply, "A").msg.outcome == Reply.NOT_LINKED


def test_data_node_launches_along_its_out_label():
    m, _ = data_node()
    eff = m.on_message(0.1, "A", CostAnnounce((Label(D, Side.IN, 4.0, ("A+", "A-", D + "+"), epoch=1),)))
    assert m.my_out[D].cost == 5.0
    launch = [e for e in eff if isinstance(e, SetTimer) and e.key == "launch"]
    assert launch and not sends(eff, RequestFlow)  # waits until the wave has settled
    eff = m.on_timer(launch[-1].deadline, "launch")
    req = one(eff, RequestFlow, "A").msg
    assert req.expected_cost == 4.0 and not req.forced and m.token_pending


# ------------------------------------------------------------ Request Change / Redirect


def test_request_change_approved_when_improving():
    m = settled_relay()
    # requester S moves its unit to N1 and wants ours on N2: total = delta + d(N2)... wait, from R's view
    # receiver_next=N1 (ours, dropped), requester_next=N2 (taken): total = delta + 7 - 3
    eff = m.on_message(2.0, "S", RequestChange(5, D, "N2", "N1", -10.0, False))
    assert one(eff, MoveReply, "S").msg == MoveReply(5, Reply.APPROVED)
    assert one(eff, Withdraw, "N1")
    assert one(eff, RequestFlow, "N2").msg.forced


def test_request_change_not_improving():
    m = settled_relay()
    eff = m.on_message(2.0, "S", RequestChange(5, D, "N2", "N1", -4.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.NOT_IMPROVING
    assert not sends(eff, Withdraw)
    # annealing-accepted moves go through even when worse
    eff = m.on_message(2.0, "S", RequestChange(6, D, "N2", "N1", 5.0, True))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.APPROVED


def test_request_change_no_such_flow_not_linked_busy():
    m = settled_relay()
    eff = m.on_message(2.0, "S", RequestChange(5, D, "N1", "N2", -10.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.NO_SUCH_FLOW
    eff = m.on_message(2.0, "S", RequestChange(6, D, "NX", "N1", -10.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.NOT_LINKED
    busy = relay_with_n1_label()
    busy.on_message(1.0, "P1", RequestFlow(1, D, 13.0))  # forwarding pending
    eff = busy.on_message(1.01, "S", RequestChange(7, D, "N2", "N1", -10.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.BUSY


def test_request_redirect_approved_when_improving():
    m = settled_relay()
    eff = m.on_message(2.0, "S", RequestRedirect(8, D, "P1", "N1", 1.0, False))
    assert one(eff, MoveReply, "S").msg == MoveReply(8, Reply.APPROVED)
    assert one(eff, Reroute, "P1").msg == Reroute(D, "S")
    assert one(eff, Withdraw, "N1")
    assert m.inn[D] == {}


def test_request_redirect_refusals():
    m = settled_relay()
    eff = m.on_message(2.0, "S", RequestRedirect(8, D, "P1", "N1", 5.0, False))  # mine is 2 + 3 = 5
    assert one(eff, MoveReply, "S").msg.outcome == Reply.NOT_IMPROVING
    eff = m.on_message(2.0, "S", RequestRedirect(9, D, "P2", "N1", 1.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.NO_SUCH_FLOW
    eff = m.on_message(2.0, "S", RequestRedirect(10, D, "P1", "N2", 1.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.NO_SUCH_FLOW
    busy = relay_with_n1_label()
    busy.on_message(1.0, "P1", RequestFlow(1, D, 13.0))
    eff = busy.on_message(1.01, "S", RequestRedirect(11, D, "P1", "N1", 1.0, False))
    assert one(eff, MoveReply, "S").msg.outcome == Reply.BUSY


# ------------------------------------------------------------ the requester's side of a move, and annealing


def test_annealer_takes_no_better_or_equal_move_and_nothing_below_t_min():
    rng = random.Random(0)
    a = Annealer(temperature=1.7, alpha=0.95, t_min=0.05)
    assert not a.accepts_worse(0.0, rng) and not a.accepts_worse(-3.0, rng)
    cold = Annealer(temperature=0.049, alpha=0.95, t_min=0.05)
    assert not any(cold.accepts_worse(1e-6, rng) for _ in range(100))


def test_annealer_accepts_a_worse_move_with_probability_exp_minus_delta_over_t_and_cools():
    rng = random.Random(1)
    a = Annealer(temperature=2.0, alpha=0.5, t_min=0.05)
    n = 4000
    taken = sum(a.accepts_worse(2.0, rng) for _ in range(n)) / n
    assert abs(taken - 0.36788) < 0.03  # exp(-2 / 2)
    a.cool()
    assert a.temperature == 1.0
    taken = sum(a.accepts_worse(2.0, rng) for _ in range(n)) / n
    assert abs(taken - 0.13534) < 0.03  # exp(-2 / 1)


def test_improvement_moves_are_off_by_default_and_none_runs_them_with_several_data_nodes():
    def relay(data: tuple, **kw) -> FlowNode:
        m = FlowNode(FlowConfig("R", False, 1, data, dict(NEXT), dict(PREV), peers=("S",), **kw), random.Random(0))
        m.start(0.0)
        return m

    default = relay((D, "d1"))
    assert not default.improving and not default.cfg.anneal
    assert not sends(default.on_timer(1.0, "tick"), QueryFlows)
    one_data, two_data = relay((D,), improve=None), relay((D, "d1"), improve=None)
    assert not one_data.improving and two_data.improving
    assert not sends(one_data.on_timer(1.0, "tick"), QueryFlows)
    assert one(two_data.on_timer(1.0, "tick"), QueryFlows, "S")


def asking_relay(capacity=1, improve=True, anneal=True, **kw):
    """R carries P1 -> R -> N1 and, on its tick, asks its same-stage peer S for its flows."""
    m = settled_relay(capacity=capacity, improve=improve, anneal=anneal, **kw)
    eff = m.on_timer(2.0, "tick")
    q = one(eff, QueryFlows, "S").msg
    return m, q.query_id


def report(query_id, inflows=(), outflows=(), next_costs=(("N1", 3.0), ("N2", 7.0)), used=1, capacity=1):
    return FlowReport(query_id, capacity, used, tuple(HopFlow(D, p, 1, c) for p, c in inflows),
                      tuple(HopFlow(D, j, 1, c) for j, c in outflows), tuple(next_costs))


def test_requester_proposes_an_improving_change_and_carries_it_out_when_approved():
    m, qid = asking_relay()
    # S sends its unit to N2 at 20 and would reach N1 at 1: swapping saves (3 + 20) - (7 + 1) = 15
    eff = m.on_message(2.1, "S", report(qid, outflows=[("N2", 20.0)], next_costs=(("N1", 1.0), ("N2", 20.0))))
    req = one(eff, RequestChange, "S").msg
    assert (req.commodity, req.requester_next, req.receiver_next) == (D, "N1", "N2")
    assert req.requester_delta == 7.0 - 3.0 and not req.temperature_accept
    t0 = m.moves.annealer.temperature
    eff = m.on_message(2.2, "S", MoveReply(req.move_id, Reply.APPROVED))
    assert one(eff, Withdraw, "N1") and one(eff, RequestFlow, "N2").msg.forced
    assert m.moves.current is None and m.stats.moves_done == 1
    assert m.moves.annealer.temperature == t0 * m.cfg.cooling[0]  # cooled after an accepted move
    assert m.grace_until > 2.2  # the other half of the swap may still be on its way


def test_requester_proposes_an_improving_redirect_when_it_has_room():
    m, qid = asking_relay(capacity=2)
    # S carries P2 -> S -> N2 at 9 + 9; through R it costs d(P2, R) + d(R, N2) = 5 + 7 = 12
    eff = m.on_message(2.1, "S", report(qid, inflows=[("P2", 9.0)], outflows=[("N2", 9.0)]))
    req = one(eff, RequestRedirect, "S").msg
    assert (req.prev, req.next, req.via_requester_cost, req.temperature_accept) == ("P2", "N2", 12.0, False)
    eff = m.on_message(2.2, "S", MoveReply(req.move_id, Reply.APPROVED))
    fwd = one(eff, RequestFlow, "N2").msg
    assert fwd.forced and fwd.commodity == D  # P2's unit, rerouted to us by S, goes on to N2


def test_requester_drops_a_refused_move_without_cooling_and_ignores_stale_replies():
    m, qid = asking_relay()
    eff = m.on_message(2.1, "S", report(qid, outflows=[("N2", 20.0)], next_costs=(("N1", 1.0), ("N2", 20.0))))
    req = one(eff, RequestChange, "S").msg
    t0 = m.moves.annealer.temperature
    assert m.on_message(2.2, "S", MoveReply(req.move_id + 100, Reply.APPROVED)) == []  # not our move
    assert m.moves.current is not None and m.stats.ignored == 1
    eff = m.on_message(2.3, "S", MoveReply(req.move_id, Reply.BUSY))
    assert not sends(eff) and m.moves.current is None and m.moves.annealer.temperature == t0
    assert m.out[D] == {"N1": 1} and m.stats.moves_done == 0


def test_requester_ignores_a_report_it_did_not_ask_for_and_gives_up_an_unanswered_move():
    m, qid = asking_relay()
    better = report(qid, outflows=[("N2", 20.0)], next_costs=(("N1", 1.0), ("N2", 20.0)))
    assert not sends(m.on_message(2.1, "T", better))  # T was not asked
    req = one(m.on_message(2.1, "S", better), RequestChange, "S").msg
    assert not sends(m.on_message(2.15, "S", better))  # one move at a time (and the query was answered)
    m.on_timer(2.0 + m.cfg.round_s + 0.5, "tick")  # S never answered: the move is dropped at the deadline
    assert m.moves.current is None
    assert not sends(m.on_message(3.6, "S", MoveReply(req.move_id, Reply.APPROVED)), Withdraw)


def test_requester_takes_a_worse_move_only_by_annealing():
    worse = dict(outflows=[("N2", 1.0)], next_costs=(("N1", 5.0), ("N2", 1.0)))  # delta = 7 + 5 - 3 - 1 = 8
    greedy, qid = asking_relay(anneal=False, t0=1e6)
    assert not sends(greedy.on_message(2.1, "S", report(qid, **worse)))  # moves without annealing never go uphill
    after_change, qid = asking_relay(improve=False, anneal=False, change_improve_rounds=50.0, joined=True, t0=1e6)
    assert not sends(after_change.on_message(2.1, "S", report(qid, **worse)))  # nor the greedy ones after a change
    hot, qid = asking_relay(t0=1e6)  # exp(-8 / 1e6) ~ 1: accepted
    req = one(hot.on_message(2.1, "S", report(qid, **worse)), RequestChange, "S").msg
    assert req.temperature_accept and hot.stats.anneal_accepts == 1
    cold, qid = asking_relay(t0=0.01)  # below t_min: no exploring
    assert not sends(cold.on_message(2.1, "S", report(qid, **worse)))
    assert cold.stats.anneal_accepts == 0


def test_after_a_membership_change_moves_anneal_only_with_anneal_after_change_and_from_t0_again():
    worse = dict(outflows=[("N2", 1.0)], next_costs=(("N1", 5.0), ("N2", 1.0)))  # delta = 8
    for flag in (False, True):
        m = settled_relay(improve=False, t0=1e6, anneal_after_change=flag)
        m.moves.annealer.temperature = 1e-3  # cooled down by earlier moves
        m.add_neighbour(1.5, "P3", 9.0, "prev")  # a membership change: moves for change_improve_rounds
        assert m.change_moves_until == 1.5 + m.cfg.change_improve_rounds * m.cfg.round_s
        q = one(m.on_timer(2.0, "tick"), QueryFlows, "S").msg
        eff = m.on_message(2.1, "S", report(q.query_id, **worse))
        if flag:
            assert m.moves.annealer.temperature == 1e6 and one(eff, RequestChange, "S").msg.temperature_accept
        else:
            assert not sends(eff, RequestChange)


def test_an_annealed_move_is_taken_by_the_receiver_and_both_ends_stay_consistent():
    """Requester and receiver joined on a wire: the annealed (worse) change is carried out on both sides."""
    req_node, qid = asking_relay(t0=1e6)
    rec = settled_relay(node_id="S")
    rec_report = one(rec.on_message(2.05, "R", QueryFlows(qid)), FlowReport, "R").msg
    # S's only unit goes to N1 as ours does: no change possible; give S a unit to N2 instead
    assert [h.peer for h in rec_report.outflows] == ["N1"]
    eff = req_node.on_message(2.1, "S", report(qid, outflows=[("N2", 1.0)], next_costs=(("N1", 5.0), ("N2", 1.0))))
    req = one(eff, RequestChange, "S").msg
    rec.out[D] = {"N2": 1}  # S carries P1 -> S -> N2 (set up directly: the counts are what matters here)
    reply = one(rec.on_message(2.2, "R", req), MoveReply, "R").msg
    assert reply.outcome == Reply.APPROVED
    eff = req_node.on_message(2.3, "S", reply)
    assert one(eff, Withdraw, "N1") and one(eff, RequestFlow, "N2").msg.forced


# ------------------------------------------------------------ pair test over the wire codec

PAIR_SCENARIO = SMALL_TWO_STAGE


class Wire:
    """Delivers effects between machines; every message goes through encode/decode."""

    def __init__(self, machines, delay):
        self.m, self.delay = machines, delay
        self.heap, self.seq, self.timers, self.now, self.frames = [], 0, {}, 0.0, 0

    def push(self, t, item):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, item))

    def apply(self, nid, effects):
        for e in effects:
            if isinstance(e, Send):
                data = encode(nid, e.msg)
                assert isinstance(data, bytes)
                sender, msg = decode(data)
                assert sender == nid and msg == e.msg
                self.frames += 1
                self.push(self.now + self.delay(nid, e.to), ("msg", e.to, sender, msg))
            elif isinstance(e, SetTimer):
                v = self.timers.get((nid, e.key), 0) + 1
                self.timers[(nid, e.key)] = v
                self.push(max(self.now, e.deadline), ("timer", nid, e.key, v))

    def run(self, t_end):
        for nid in sorted(self.m):
            self.apply(nid, self.m[nid].start(0.0))
        while self.heap and self.heap[0][0] <= t_end:
            t, _, item = heapq.heappop(self.heap)
            self.now = t
            if item[0] == "msg":
                _, to, sender, msg = item
                self.apply(to, self.m[to].on_message(t, sender, msg))
            else:
                _, nid, key, v = item
                if self.timers.get((nid, key)) == v:
                    self.apply(nid, self.m[nid].on_timer(t, key))


def test_pair_over_codec_reaches_optimum():
    sc = parse_scenario(PAIR_SCENARIO)
    cfgs = flow_configs(sc)
    machines = {nid: FlowNode(cfg, random.Random(f"7:{nid}")) for nid, cfg in cfgs.items()}
    wire = Wire(machines, lambda a, b: 0.001 * sc.cost(a, b))
    wire.run(40.0)
    flows, mismatched = extract_flows(sc, machines)
    assert mismatched == 0
    check_routing(sc, flows)
    opt = optimal_routing(sc)
    assert len(flows) == opt.num_flows == 3
    assert sum(f.cost for f in flows) == opt.total_cost
    assert wire.frames > 0


def test_free_running_data_node_launches_on_tick():
    """Several data nodes (waves off by default), launches not ordered: the data node launches as soon as it has a
    route."""
    cfg = FlowConfig(D, True, 3, (D, "d1"), {"A": 1.0}, {"Z": 2.0}, ordered_launches=False)
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    assert not m.waves
    eff = m.on_message(0.1, "A", CostAnnounce((Label(D, Side.IN, 4.0, ("A+", "A-", D + "+"), epoch=1),)))
    req = one(eff, RequestFlow, "A").msg
    assert req.expected_cost == 4.0 and m.token_pending


def test_send_all_builds_the_same_sends_as_the_constructor():
    # _send_all bypasses Send.__init__ (hot path): it must stay in step with the dataclass's fields
    from gwtf_node.protocol.flow.announce import send_all as _send_all
    msg = CostAnnounce((in_label("N1", 1.0),))
    eff: list = []
    _send_all(eff, ["P1", "P2"], msg)
    assert eff == [Send("P1", msg), Send("P2", msg)]
    assert all(type(e) is Send and e.msg is msg for e in eff)
    assert [hash(e) for e in eff] == [hash(Send("P1", msg)), hash(Send("P2", msg))]


def _ordered_data_node():
    """d0 of a run with d0 and d1 (ordered launches by default), first hops A (cost 1) and B (cost 2)."""
    m = FlowNode(FlowConfig(D, True, 3, (D, "d1"), {"A": 1.0, "B": 2.0}, {"Z": 2.0}), random.Random(0))
    m.start(0.0)
    assert m.ordered and not m.waves
    return m


def test_ordered_launch_bids_then_waits_for_the_others():
    """Ordered launches: a route makes the data node announce its bid to its first hops; it launches only once the
    bid has been out for ordered_settle_s (the others' bids arrive meanwhile)."""
    m = _ordered_data_node()
    eff = m.on_message(0.1, "A", CostAnnounce((Label(D, Side.IN, 4.0, ("A+", "A-", D + "+"), epoch=1),)))
    bids = sends(eff, LaunchBid)
    assert sorted(b.to for b in bids) == ["A", "B"] and bids[0].msg == LaunchBid(D, 1, 5.0)
    assert not sends(eff, RequestFlow)
    assert any(isinstance(e, SetTimer) and e.key == "launch" and e.deadline == 0.1 + m.cfg.ordered_settle_s for e in eff)
    eff = m.on_timer(0.1 + m.cfg.ordered_settle_s, "launch")
    assert one(eff, RequestFlow, "A").msg.expected_cost == 4.0 and m.token_pending


def test_ordered_launch_yields_to_a_cheaper_bid_until_it_rises_or_goes_stale():
    m = _ordered_data_node()
    m.on_message(0.05, "A", LaunchBid("d1", 3, 4.0))  # d1's next launch costs 4, ours 5
    m.on_message(0.1, "A", CostAnnounce((Label(D, Side.IN, 4.0, ("A+", "A-", D + "+"), epoch=1),)))
    eff = m.on_timer(0.05 + m.cfg.ordered_settle_s + 0.1, "launch")
    assert not sends(eff, RequestFlow)
    m.on_message(0.05 + m.cfg.ordered_settle_s + 0.15, "B", LaunchBid("d1", 2, 9.0))  # an older seq: ignored
    assert not sends(m.on_timer(0.05 + m.cfg.ordered_settle_s + 0.2, "launch"), RequestFlow)
    eff = m.on_message(0.05 + m.cfg.ordered_settle_s + 0.3, "B", LaunchBid("d1", 4, 9.0))  # d1 settled and now bids more than us: our turn
    assert one(eff, RequestFlow, "A").msg.expected_cost == 4.0


def test_ordered_launch_ties_go_to_the_smaller_id_and_a_stale_bid_stops_holding_back():
    m = _ordered_data_node()
    m.on_message(0.05, "A", LaunchBid("c9", 1, 5.0))  # same cost, smaller id: c9 goes first
    eff = m.on_message(0.1, "A", CostAnnounce((Label(D, Side.IN, 4.0, ("A+", "A-", D + "+"), epoch=1),)))
    eff = m.on_timer(0.05 + m.cfg.ordered_settle_s + 0.1, "launch")
    assert not sends(eff, RequestFlow)
    until = 0.05 + m.cfg.bid_patience_rounds * m.cfg.round_s
    assert any(isinstance(e, SetTimer) and e.key == "launch" and e.deadline == until for e in eff)
    assert one(m.on_timer(until, "launch"), RequestFlow, "A")  # c9 never moved: it no longer holds d0 back


def test_relay_passes_a_bid_on_once_to_its_other_data_nodes():
    cfg = FlowConfig("R", False, 1, ("d0", "d1", "d2"), {"N1": 1.0}, {"d0": 1.0, "d1": 2.0, "d2": 3.0})
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    eff = m.on_message(0.1, "d0", LaunchBid("d0", 1, 7.0))
    assert sorted(e.to for e in sends(eff, LaunchBid)) == ["d1", "d2"] and len(eff) == 2
    assert not m.on_message(0.2, "d0", LaunchBid("d0", 1, 7.0))  # the same seq again: nothing
    assert sorted(e.to for e in sends(m.on_message(0.3, "d0", LaunchBid("d0", 2, INF)), LaunchBid)) == ["d1", "d2"]


def _multi_relay(node_id, nxt, prv, capacity=2):
    m = FlowNode(FlowConfig(node_id, False, capacity, ("d0", "d1"), nxt, prv), random.Random(0))
    m.start(0.0)
    assert m.relabel
    return m


def test_last_stage_relay_announces_the_cost_of_sending_a_unit_back_to_the_other_data_node():
    m = _multi_relay("L", {"d0": 5.0, "d1": 2.0}, {"P": 1.0, "Q": 1.0})
    m.inn["d0"]["P"] = 1
    m.out["d0"]["d0"] = 1
    eff = []
    units.act(m, 1.0, eff)
    assert sorted((e.to, e.msg) for e in sends(eff, RelabelCost)) == [
        ("P", RelabelCost("d0", "d1", -3.0)), ("Q", RelabelCost("d0", "d1", -3.0))]
    eff = []
    units.act(m, 1.1, eff)
    assert not sends(eff, RelabelCost)  # nothing changed: nothing sent


def test_first_stage_relay_relabels_a_unit_when_the_other_data_node_is_cheaper_then_the_chain_follows():
    first = _multi_relay("F", {"M": 1.0}, {"d0": 6.0, "d1": 2.0})
    first.inn["d0"]["d0"] = 1
    first.out["d0"]["M"] = 1
    first.on_message(0.5, "M", RelabelCost("d0", "d1", 1.0))  # the way back: 1 dearer for d1; the way in: 4 cheaper
    eff = first.on_timer(1.0, "tick")
    got = sorted((e.to, e.msg) for e in sends(eff, Relabel))
    assert got == [("M", Relabel("d0", "d1")), ("d0", Relabel("d0", "d1")), ("d1", Relabel("d0", "d1"))]
    assert first.inn["d1"] == {"d1": 1} and not first.inn["d0"] and first.out["d1"] == {"M": 1} and not first.out["d0"]
    # the next relay, the last one, sends the unit back to d1 instead of d0
    last = _multi_relay("M", {"d0": 1.0, "d1": 2.0}, {"F": 1.0})
    last.inn["d0"]["F"] = 1
    last.out["d0"]["d0"] = 1
    eff = last.on_message(1.1, "F", Relabel("d0", "d1"))
    assert sorted(e.to for e in sends(eff, Relabel)) == ["d0", "d1"]
    assert last.inn["d1"] == {"F": 1} and last.out["d1"] == {"d1": 1} and not last.out["d0"]
    # a relabel of a unit that is not there (handed back meanwhile, the Relabel crossing our Deny): the sender
    # already counts it as d1's on this link, so it is handed back as d1's, and nothing else changes here
    eff = last.on_message(1.2, "F", Relabel("d0", "d1"))
    assert eff == [Send("F", Deny("d1", DenyReason.NO_ROUTE))] and last.inn["d1"] == {"F": 1}
    # ... and the sender's count of the link drops with it: both ends agree again
    first.on_message(1.3, "M", Deny("d1", DenyReason.NO_ROUTE))
    assert not first.out["d1"].get("M")


def test_first_stage_relay_does_not_relabel_without_a_gain_or_while_a_data_node_still_bids():
    first = _multi_relay("F", {"M": 1.0}, {"d0": 6.0, "d1": 2.0})
    first.inn["d0"]["d0"] = 1
    first.out["d0"]["M"] = 1
    first.on_message(0.5, "M", RelabelCost("d0", "d1", 4.0))  # 4 cheaper in, 4 dearer back: no gain
    assert not sends(first.on_timer(1.0, "tick"), Relabel)
    first.on_message(1.1, "M", RelabelCost("d0", "d1", 1.0))
    first.on_message(1.2, "d1", LaunchBid("d1", 1, 30.0))  # d1 will still launch: wait
    assert not sends(first.on_timer(2.0, "tick"), Relabel)
    first.on_message(2.1, "d1", LaunchBid("d1", 2, INF))
    assert sends(first.on_timer(3.0, "tick"), Relabel)


def test_data_node_copies_a_relabel_of_its_links():
    m = FlowNode(FlowConfig("d1", True, 5, ("d0", "d1"), {"F": 2.0}, {"L": 3.0}), random.Random(0))
    m.start(0.0)
    m.on_message(1.0, "F", Relabel("d0", "d1"))  # F's unit from d0 is now ours: we send F one more
    m.on_message(1.1, "L", Relabel("d0", "d1"))  # and L sends it back to us
    assert m.out["d1"] == {"F": 1} and m.inn["d1"] == {"L": 1}
    m.on_message(1.2, "L", Relabel("d1", "d0"))
    assert m.inn["d1"] == {}


def test_cross_displacement_takes_a_unit_in_place_of_another_data_nodes():
    """A full relay holding a unit of d1 (P1 -> R -> N1) offers d0 an IN label: P1 routes its d1 unit again (its OUT
    label 10, minus the link 2) and d0's unit takes the d1 unit's route from R on, relabelled (RelabelCost -2)."""
    m = FlowNode(FlowConfig("R", False, 1, ("d0", "d1"), dict(NEXT), dict(PREV)), random.Random(0))
    m.start(0.0)
    assert m.cross
    m.inn["d1"]["P1"] = 1
    m.out["d1"]["N1"] = 1
    m.on_message(0.1, "N1", RelabelCost("d1", "d0", -2.0))
    m.on_message(0.2, "P1", CostAnnounce((Label("d1", Side.OUT, 10.0, ("P1-", "Z+", "Z-", "d1+")),)))
    assert m.my_in["d0"].cost == 6.0 and m.dec_in["d0"] == (Via.CROSS, "P1", "d1")
    eff = m.on_message(1.0, "P2", RequestFlow(5, "d0", 6.0))
    assert one(eff, FlowReply, "P2").msg.outcome == Reply.APPROVED
    assert one(eff, Deny, "P1").msg == Deny("d1", DenyReason.DISPLACED)
    assert one(eff, Relabel, "N1").msg == Relabel("d1", "d0")
    assert m.inn["d0"] == {"P2": 1} and not m.inn["d1"] and m.out["d0"] == {"N1": 1} and not m.out["d1"]
    assert m.my_in["d0"].cost == INF  # full again, and one cross displacement per relay (cross_limit)


def test_first_stage_relay_starts_at_most_relabel_limit_relabels():
    first = FlowNode(FlowConfig("F", False, 2, ("d0", "d1"), {"M": 1.0}, {"d0": 6.0, "d1": 2.0}, relabel_limit=0),
                     random.Random(0))
    first.start(0.0)
    first.inn["d0"]["d0"] = 1
    first.out["d0"]["M"] = 1
    first.on_message(0.5, "M", RelabelCost("d0", "d1", 1.0))
    assert not sends(first.on_timer(1.0, "tick"), Relabel)


def test_a_removed_data_nodes_bid_does_not_hold_relabelling_back():
    first = _multi_relay("F", {"M": 1.0}, {"d0": 6.0, "d1": 2.0})
    first.inn["d0"]["d0"] = 1
    first.out["d0"]["M"] = 1
    first.on_message(0.5, "M", RelabelCost("d0", "d1", 1.0))
    first.on_message(0.6, "d1", LaunchBid("d1", 1, 30.0))
    assert not sends(first.on_timer(1.0, "tick"), Relabel)
    first.bid.seen_cost["d9"] = 3.0  # a data node that is not a neighbour any more: dropped when removed
    first.remove_neighbour(1.5, "d9")
    first.on_message(1.6, "d1", LaunchBid("d1", 2, INF))
    assert sends(first.on_timer(2.0, "tick"), Relabel)


def test_flows_formed_is_one_predicate_for_the_daemon_and_the_simulator():
    from gwtf_node.protocol.flow import FORMED_QUIET_S, FORMED_WAIT_S, flows_formed

    assert flows_formed(4, 4, 0.0, 0.0)  # the whole demand placed
    assert not flows_formed(2, 4, FORMED_QUIET_S, 1.0)  # some placed, flows still changing
    assert flows_formed(2, 4, FORMED_QUIET_S + 0.1, 1.0)  # ... and then still
    assert not flows_formed(0, 4, 100.0, FORMED_WAIT_S - 1)  # nothing placed: wait
    assert flows_formed(0, 4, 0.0, FORMED_WAIT_S)  # ... at most this long

"""A request whose FlowReply does not come is sent again, and a request answered already gets the same reply
(flow/units.py `retry_due`, `answer_again`): a daemon can lose a frame with its connection, and a relay whose
Request Flow is never answered holds its unit for good."""

from __future__ import annotations

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.flow.state import REQUEST_RETRY_S
from gwtf_node.protocol.messages import CostAnnounce, FlowReply, Label, Reply, RequestFlow, Side, Withdraw
from support.helpers import flow_relay as relay, sends

D = "d0"


def ticks(m, t0: float, t1: float) -> list:
    """Every tick of `m` from `t0` to `t1` (its round), the effects together."""
    eff, t = [], t0
    while t <= t1 + 1e-9:
        eff += m.on_timer(t, "tick")
        t += m.cfg.round_s
    return eff


def test_a_request_flow_without_its_reply_is_sent_again_with_its_id_and_cost():
    m = relay(nxt={"N1": 1.0, "N2": 5.0})
    m.on_message(0.1, "N1", CostAnnounce((Label(D, Side.IN, 1.0, ("N1+", "N1-", D + "+")),)))
    m.on_message(0.1, "N2", CostAnnounce((Label(D, Side.IN, 3.0, ("N2+", "N2-", D + "+")),)))
    m.inn[D] = {"P1": 1}
    m.out[D] = {"N1": 1}
    (req,) = sends(m.remove_neighbour(1.0, "N1"), RequestFlow, "N2")  # the unit is unpaired: to N2
    assert sends(ticks(m, 1.0, 1.0 + REQUEST_RETRY_S - 2 * m.cfg.round_s), RequestFlow) == []
    again = sends(ticks(m, 1.0 + REQUEST_RETRY_S, 1.0 + REQUEST_RETRY_S + 2 * m.cfg.round_s), RequestFlow)
    assert [s.msg for s in again] == [req.msg] and again[0].to == "N2"
    assert m.progress()[D]["sent_again"] == 1  # (status.json's `flow_machine`)
    m.on_message(30.0, "N2", FlowReply(req.msg.req_id, D, Reply.APPROVED, None))
    assert m.out[D] == {"N2": 1} and not m.token_pending
    assert sends(ticks(m, 30.0, 30.0 + 2 * REQUEST_RETRY_S), RequestFlow) == []  # answered: never again
    m.on_message(70.0, "N2", FlowReply(req.msg.req_id, D, Reply.APPROVED, None))  # the first reply, late
    assert m.out[D] == {"N2": 1}  # counted once


def test_a_withdraw_without_its_reply_is_sent_again():
    m = relay()
    m.inn[D] = {}
    m.out[D] = {"N1": 1}  # more out than in: the unit on N1 is taken back
    (w,) = sends(m.on_timer(0.5, "balance") + ticks(m, 0.5, 1.0), Withdraw, "N1")
    again = sends(ticks(m, 1.0, 1.0 + REQUEST_RETRY_S + 2 * m.cfg.round_s), Withdraw, "N1")
    assert [s.msg for s in again] == [w.msg]


def test_a_request_flow_answered_already_gets_the_same_reply_and_moves_no_unit_twice():
    m = relay()
    m.inn[D] = {}
    eff = m.on_message(1.0, "P1", RequestFlow(7, D, 0.0, forced=True))
    (first,) = sends(eff, FlowReply, "P1")
    assert first.msg.outcome is Reply.APPROVED and m.inn[D] == {"P1": 1}
    assert m.on_message(21.0, "P1", RequestFlow(7, D, 0.0, forced=True)) == [Send("P1", first.msg)]
    assert m.inn[D] == {"P1": 1} and m.progress()[D]["answered_again"] == 1
    (other,) = sends(m.on_message(22.0, "P1", RequestFlow(8, D, 0.0, forced=True)), FlowReply, "P1")
    assert other.msg.req_id == 8 and m.inn[D] == {"P1": 2}  # a new request is a new request


def test_a_withdraw_answered_already_is_not_answered_no_such_flow():
    m = relay()
    m.inn[D] = {"P1": 1}
    (first,) = sends(m.on_message(1.0, "P1", Withdraw(5, D)), FlowReply, "P1")
    assert first.msg.outcome is Reply.APPROVED and m.inn[D] == {}
    assert m.on_message(21.0, "P1", Withdraw(5, D)) == [Send("P1", first.msg)]  # (not NO_SUCH_FLOW)


def test_the_replies_kept_for_a_peer_go_with_it():
    """A peer removed and added again may have restarted, its request ids from 1 again."""
    m = relay()
    m.inn[D] = {}
    m.on_message(1.0, "P1", RequestFlow(1, D, 0.0, forced=True))
    m.remove_neighbour(2.0, "P1")
    m.add_neighbour(3.0, "P1", 1.0, "prev")
    (reply,) = sends(m.on_message(4.0, "P1", RequestFlow(1, D, 0.0, forced=True)), FlowReply, "P1")
    assert reply.msg.outcome is Reply.APPROVED and m.inn[D] == {"P1": 1}  # handled afresh

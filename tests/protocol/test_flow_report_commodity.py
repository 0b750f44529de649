"""A FlowReport that names a data node the requester does not know (not heard yet, or forgotten as presumed
dead while its peer still routes for it) proposes no move with it, instead of ending the daemon (KeyError)."""

from __future__ import annotations

from gwtf_node.protocol.messages import HopFlow, RequestChange, RequestRedirect
from test_flow_machine import D, asking_relay, report, sends


def test_a_report_of_an_unknown_data_node_proposes_nothing() -> None:
    m, qid = asking_relay(capacity=2)
    rep = report(qid, inflows=[("P1", 20.0)], outflows=[("N2", 20.0)], next_costs=(("N1", 1.0), ("N2", 20.0)))
    gone = "d-forgotten"
    assert gone not in m.out and D in m.out
    rep = rep.__class__(rep.query_id, rep.capacity, rep.used,
                        tuple(HopFlow(gone, h.peer, h.count, h.cost) for h in rep.inflows),
                        tuple(HopFlow(gone, h.peer, h.count, h.cost) for h in rep.outflows), rep.next_costs)
    eff = m.on_message(2.1, "S", rep)
    assert not sends(eff, RequestChange) and not sends(eff, RequestRedirect)
    assert m.moves.current is None

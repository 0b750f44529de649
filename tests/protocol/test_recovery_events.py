"""The recovery machine's driver events (protocol/recovery/neighbours.py): `set_neighbours` and `peer_alive`, the
only ways a driver changes what the machine knows of its neighbours."""

from __future__ import annotations

import random

from gwtf_node.protocol.completions import Completion, holder_tag
from gwtf_node.protocol.messages import Forward, MbDeny, Room
from gwtf_node.protocol.recovery import Compute, RecoveryConfig, RecoveryNode


def relay() -> RecoveryNode:
    cfg = RecoveryConfig(node_id="r", stage=1, last_stage=3, capacity=2, data_nodes=("d",),
                         next_peers={"n": 1.0}, prev_peers={"p": 1.0}, peer_capacity={"n": 1},
                         prior_s={"n": 5.0, "p": 5.0})
    return RecoveryNode(cfg, random.Random(0))


def data_node() -> RecoveryNode:
    cfg = RecoveryConfig(node_id="d", stage=-1, last_stage=1, capacity=2, data_nodes=("d",),
                         next_peers={"a": 1.0}, prev_peers={"z": 1.0}, peer_capacity={"a": 2}, prior_s={"a": 5.0})
    return RecoveryNode(cfg, random.Random(0))


def test_set_neighbours_replaces_the_maps_and_keeps_known_capacities() -> None:
    m = relay()
    m.set_neighbours(0.0, {"n": 2.0, "x": 3.0}, {"p": 1.0, "q": 4.0}, {"n": 0, "x": 3}, prior_s=7.0)
    assert m.next_peers == {"n": 2.0, "x": 3.0} and m.prev_peers == {"p": 1.0, "q": 4.0}
    assert m.peer_cap["n"] == 1 and m.peer_cap["x"] == 3  # a capacity of 0 keeps what was known
    assert m.est["n"] == 5.0 and m.est["x"] == 7.0  # a new next peer starts at the prior
    m.set_neighbours(1.0, {"y": 1.0}, {}, {}, prior_s=7.0)
    assert m.next_peers == {"y": 1.0} and m.peer_cap["y"] == 1  # nothing known: one slot


def test_a_new_next_peer_is_a_route_again_for_a_parked_microbatch() -> None:
    m = relay()
    k = ("d", 0, 0)
    m.on_message(0.0, "p", Forward(*k, ("d", "p"), None, 0))
    m.on_message(0.0, "n", MbDeny(*k, 0))  # n is full
    eff = m.on_compute_done(1.0, k, "forward")
    assert m.mbs[k].parked and not [e for e in eff if type(getattr(e, "msg", None)) is Forward]
    eff = m.set_neighbours(2.0, {"n": 1.0, "x": 3.0}, {"p": 1.0}, {"x": 1}, prior_s=5.0)
    assert [e.to for e in eff if type(getattr(e, "msg", None)) is Forward] == ["x"]
    assert not m.mbs[k].parked


def test_peer_alive_undoes_a_presumption_not_a_membership_report() -> None:
    m = data_node()
    m.set_flows({"d": {"a": 2}})
    eff = m.start(0.0)
    assert len([e for e in eff if type(e) is Compute]) == 2
    m.routing.presume_dead(m, "a")  # a hop deadline presumed it dead
    assert "a" in m.dead
    m.peer_alive(1.0, "a")
    assert "a" not in m.dead
    m.peer_gone(2.0, "a")  # the membership layer reports it gone: only a message from it undoes that
    assert m.peer_alive(3.0, "a") == [] and "a" in m.dead
    m.on_message(4.0, "a", Room(1))
    assert "a" not in m.dead


def test_a_data_node_stops_a_repair_resent_to_it_for_an_attempt_it_no_longer_runs() -> None:
    """A last-stage relay resends its repair (`Recover`) to the sink on every hop deadline; a data node that
    holds no record of that attempt answers `Complete` (the resend stops) and, if the attempt was given up
    (deferred), `Release` again (its first Release may have been lost); a completed one is not released."""
    from gwtf_node.protocol.effects import Send
    from gwtf_node.protocol.messages import Complete, Recover, Release
    from gwtf_node.protocol.pipeline import MbStatus

    m = data_node()
    m.ledger.add(0, [0, 1])
    m.ledger.mark(0, 0, MbStatus.DEFERRED)
    m.ledger.mark(0, 1, MbStatus.COMPLETED)
    for seq, released in ((0, True), (1, False)):
        eff = m.on_message(5.0, "z", Recover("d", seq, 0, ("d", "a", "z"), (), None, 0))
        sent = [(e.to, type(e.msg)) for e in eff if isinstance(e, Send)]
        assert ("z", Complete) in sent
        assert (("z", Release) in sent) == released


def test_a_leaving_relay_denies_microbatches_of_iterations_after_its_last() -> None:
    m = relay()
    m.leave_after(3)
    later, last = ("d", 8, 4), ("d", 7, 3)
    eff = m.on_message(0.0, "p", Forward(*later, ("d", "p"), None, 0))
    assert [(e.to, e.msg) for e in eff if type(getattr(e, "msg", None)) is MbDeny] == [("p", MbDeny(*later, 0))]
    assert later not in m.mbs and not [e for e in eff if type(e) is Compute]
    eff = m.on_message(0.0, "p", Forward(*last, ("d", "p"), None, 0))  # its last iteration: it still takes part
    assert last in m.mbs and [e for e in eff if type(e) is Compute] == [Compute("forward", last)]


def test_a_relay_whose_parameters_hold_other_steps_denies_the_microbatch_until_they_are_the_iterations() -> None:
    """An aggregation left the relay out (the data node presumed it dead for a while): its part holds 13 steps
    when a microbatch of iteration 14 comes.  Its gradient would be summed nowhere (the stage's all-reduce leaves
    an out-of-step member's contributions out) while the data node counts the microbatch: DENY."""
    m = relay()
    m.parameters_at(13)
    k = ("d", 154, 14)
    eff = m.on_message(0.0, "p", Forward(*k, ("d", "p"), None, 0))
    assert [(e.to, e.msg) for e in eff if type(getattr(e, "msg", None)) is MbDeny] == [("p", MbDeny(*k, 0))]
    assert k not in m.mbs and not [e for e in eff if type(e) is Compute]
    m.parameters_at(14)  # the state after the step it missed, installed
    eff = m.on_message(1.0, "p", Forward(*k, ("d", "p"), None, 1))
    assert k in m.mbs and [e for e in eff if type(e) is Compute] == [Compute("forward", k)]
    m.begin_aggregation(2.0, 14, None)
    m.aggregation_done(3.0, 14)  # its own step: 15 from now on, without the driver telling it
    assert m.relay.applied == 15
    eff = m.on_message(4.0, "p", Forward("d", 170, 15, ("d", "p"), None, 0))
    assert [e for e in eff if type(e) is Compute] == [Compute("forward", ("d", 170, 15))]


def _relay_holding(keys) -> RecoveryNode:
    """A relay whose backward of `keys` ran here (forward from p, to n, backward from n)."""
    from gwtf_node.protocol.messages import Backward

    m = relay()
    for k in keys:
        m.on_message(0.0, "p", Forward(*k, (k[0], "p"), None, 0))
        m.on_compute_done(0.1, k, "forward")
        m.on_message(0.2, "n", Backward(*k, None, 0))
        m.on_compute_done(0.3, k, "backward")
    assert m.contrib[0] == set(keys)
    return m


def test_a_dead_data_nodes_contributions_count_only_when_begin_names_them() -> None:
    """A data node that dies after reporting its iteration: the leader's BEGIN names its completed seqs, and the
    relay counts them whether it heard of the death before that BEGIN or after (two stages once counted them
    differently: one relay had BEGIN first, the next one the death).  A BEGIN decided without its report (it
    names none of them), or none at all, counts none of them; nor does a new incarnation of the node."""
    keys = [("d", 0, 0), ("d", 1, 0)]
    named = {"d": frozenset({0, 1})}
    m = _relay_holding(keys)
    m.peer_gone(1.0, "d")
    assert not m.mbs and m.begin_aggregation(2.0, 0, named)[1] == frozenset(keys)

    m = _relay_holding(keys)
    m.begin_aggregation(1.0, 0, named)
    m.peer_gone(2.0, "d")  # after BEGIN: nothing changes
    assert m.begin_aggregation(2.0, 0, named)[1] == frozenset(keys)

    m = _relay_holding(keys)
    m.peer_gone(1.0, "d")
    assert m.begin_aggregation(2.0, 0, {"e": frozenset({0})})[1] == frozenset()

    m = _relay_holding(keys)
    m.peer_gone(1.0, "d")
    assert m.begin_aggregation(2.0, 0, None)[1] == frozenset()

    m = _relay_holding(keys)
    m.peer_gone(1.0, "d")
    m.peer_back(1.5, "d", data_node=True)  # restarted: the old incarnation's gradients are not its
    assert m.begin_aggregation(2.0, 0, named)[1] == frozenset()

    m = _relay_holding(keys)
    m.peer_gone(1.0, "d")
    m.peer_back(1.5, "d", data_node=True, same=True)  # presumed dead while alive: what it names counts
    assert m.begin_aggregation(2.0, 0, named)[1] == frozenset(keys)
    m = _relay_holding(keys)
    m.peer_gone(1.0, "d")
    m.peer_back(1.5, "d", data_node=True, same=True)  # ... not what it redid through another relay
    redone = {"d": {0: Completion(0, (holder_tag("x"),) * 4), 1: Completion(0, (holder_tag("r"),) * 4)}}
    assert m.begin_aggregation(2.0, 0, redone)[1] == frozenset({("d", 1, 0)})

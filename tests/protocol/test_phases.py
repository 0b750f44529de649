"""The aggregation phase as a pure machine (protocol/phases.py): BEGIN front to back, CAN TAKE back to front,
retransmission until acknowledged, idempotence, leader changes, the step check."""

from __future__ import annotations

from gwtf_node.protocol.effects import CancelTimer, Send, SetTimer
from gwtf_node.protocol.messages import BeginAggregation, CanTake, IterationDone, PhaseAck, PhaseKind, StageMembers
from gwtf_node.protocol.phases import (
    NOT_READY, CanTakeRule, Completion, LeftOut, OpenIteration, OutOfStep, Phases, StartStep, timer_key,
)

ALL = dict(data_nodes=["d0", "d1"], stage0=["a0", "a1"])


def sends(eff, t=None) -> list:
    return [e for e in eff if isinstance(e, Send) and (t is None or type(e.msg) is t)]


def test_two_stages_end_to_end() -> None:
    """d0 (leader), d1; stage 0: a0, a1; stage 1 (last): b0, b1."""
    d = {n: Phases(n, -1, 1) for n in ("d0", "d1")}
    a = {n: Phases(n, 0, 1) for n in ("a0", "a1")}
    b = {n: Phases(n, 1, 1) for n in ("b0", "b1")}
    for p in d.values():
        p.set_leader(0.0, "d0", front=["d0", "d1", "a0", "a1"])
    # the leader hears both data nodes (its own report is recorded, the other one acknowledged)
    assert d["d0"].report_done(1.0, IterationDone(0, 4, 8.0)) == []
    assert d["d0"].maybe_begin(1.0, 0, leading=True, **ALL) == []
    eff = d["d1"].report_done(1.0, IterationDone(0, 4, 4.0))
    assert [e.to for e in sends(eff, IterationDone)] == ["d0"] and SetTimer(timer_key(PhaseKind.DONE, 0), 3.0) in eff
    eff = d["d0"].on_iteration_done(1.1, "d1", IterationDone(0, 4, 4.0), leading=True, **ALL)
    assert sends(eff, PhaseAck) == [Send("d1", PhaseAck(PhaseKind.DONE, 0))]
    assert {e.to for e in sends(eff, BeginAggregation)} == {"d1", "a0", "a1"}
    assert StartStep(0, 8) in eff
    assert d["d0"].iteration_loss(0) == (8, 12.0)
    # stage 0 passes BEGIN on, once; a duplicate is acknowledged, not applied again
    eff = a["a0"].on_begin(1.2, "d0", BeginAggregation(0, 8), next_stage=["b0", "b1"])
    assert {e.to for e in sends(eff, BeginAggregation)} == {"b0", "b1"} and StartStep(0, 8) in eff
    assert a["a0"].on_begin(1.3, "d0", BeginAggregation(0, 8), ["b0", "b1"]) == [Send("d0", PhaseAck(PhaseKind.BEGIN, 0))]
    # the last stage: CAN TAKE as soon as its step is done
    b["b0"].on_begin(1.4, "a0", BeginAggregation(0, 8), next_stage=["d0", "d1"])
    eff = b["b0"].on_step_done(2.0, 0, next_stage=["d0", "d1"], prev_stage=["a0", "a1"])
    assert [e.to for e in sends(eff)] == ["a0", "a1"] and all(isinstance(e.msg, CanTake) for e in sends(eff))
    # stage 0 waits for its step AND both last-stage relays
    a0 = a["a0"]
    assert sends(a0.on_can_take(2.1, "b0", CanTake(0, 1), ["b0", "b1"], ["d0", "d1"]), CanTake) == []
    assert a0.on_step_done(2.2, 0, ["b0", "b1"], ["d0", "d1"]) == []
    eff = a0.on_can_take(2.3, "b1", CanTake(0, 1), ["b0", "b1"], ["d0", "d1"])
    assert [e.to for e in sends(eff, CanTake)] == ["d0", "d1"]
    # the data node opens the next iteration after its step and both stage-0 relays
    d1 = d["d1"]
    d1.on_begin(1.2, "d0", BeginAggregation(0, 8), next_stage=[])
    assert OpenIteration(1) not in d1.on_can_take(2.4, "a0", CanTake(0, 0), ["a0", "a1"], ["b0", "b1"])
    assert d1.on_step_done(2.5, 0, ["a0", "a1"], ["b0", "b1"]) == []
    assert OpenIteration(1) in d1.on_can_take(2.6, "a1", CanTake(0, 0), ["a0", "a1"], ["b0", "b1"])
    assert OpenIteration(1) not in d1.on_can_take(2.7, "a1", CanTake(0, 0), ["a0", "a1"], ["b0", "b1"])  # once


def test_groups_named_by_the_leader_decide_who_steps_and_who_is_waited_for() -> None:
    """A newcomer n0 of stage 0 not ready yet: left out; a0 does not wait for it, nor does the data node."""
    lead = Phases("d0", -1, 1, applied=3)
    lead.set_leader(0.0, "d0")
    groups = {-1: ["d0"], 0: ["a0"], 1: ["b0"]}
    lead.report_done(0.0, IterationDone(3, 2, 1.0))
    eff = lead.maybe_begin(0.0, 3, leading=True, data_nodes=["d0"], stage0=["a0", "n0"], groups=groups)
    begin = sends(eff)[0].msg
    assert {e.to for e in sends(eff)} == {"a0", "n0"}  # everyone at stage 0 hears it
    assert [(g.stage, g.peers) for g in begin.groups] == [(-1, ("d0",)), (0, ("a0",)), (1, ("b0",))]
    n0 = Phases("n0", 0, 1, applied=3)
    eff = n0.on_begin(0.1, "d0", begin, next_stage=["b0"])
    assert LeftOut(3) in eff and not any(isinstance(e, StartStep) for e in eff)
    a0 = Phases("a0", 0, 1, applied=3)
    assert StartStep(3, 2) in a0.on_begin(0.1, "d0", begin, next_stage=["b0", "n1"])
    a0.on_step_done(1.0, 3, ["b0", "n1"], ["d0"])
    # n1 (a newcomer at stage 1, left out) never says CAN TAKE: a0 waits only for b0
    assert [e.to for e in sends(a0.on_can_take(1.1, "b0", CanTake(3, 1), ["b0", "n1"], ["d0"]), CanTake)] == ["d0"]
    lead.on_step_done(1.0, 3, ["a0", "n0"], ["b0"])
    assert OpenIteration(4) in lead.on_can_take(1.2, "a0", CanTake(3, 0), ["a0", "n0"], ["b0"])


def test_a_signal_is_resent_on_its_deadline_until_acknowledged() -> None:
    b0 = Phases("b0", 1, 1)
    b0.on_begin(0.0, "a0", BeginAggregation(0, 4), next_stage=[])
    eff = b0.on_step_done(1.0, 0, [], ["a0", "a1"])
    assert SetTimer(timer_key(PhaseKind.CAN_TAKE, 0), 1.0 + b0.retry_s) in eff
    assert b0.on_ack(1.5, "a0", PhaseAck(PhaseKind.CAN_TAKE, 0)) == []  # a1 still owes an ack
    eff = b0.on_timer(3.0, timer_key(PhaseKind.CAN_TAKE, 0))
    assert sends(eff) == [Send("a1", CanTake(0, 1))] and SetTimer(timer_key(PhaseKind.CAN_TAKE, 0), 3.0 + b0.retry_s) in eff
    assert b0.on_ack(3.1, "a1", PhaseAck(PhaseKind.CAN_TAKE, 0)) == [CancelTimer(timer_key(PhaseKind.CAN_TAKE, 0))]
    assert b0.on_timer(5.0, timer_key(PhaseKind.CAN_TAKE, 0)) == [] and b0.stats.resent == 1
    # a peer forgotten is not resent to either
    b1 = Phases("b1", 1, 1)
    b1.on_begin(0.0, "a0", BeginAggregation(0, 4), next_stage=[])
    b1.on_step_done(1.0, 0, [], ["a0"])
    assert b1.forget(1.5, "a0", [], []) == [CancelTimer(timer_key(PhaseKind.CAN_TAKE, 0))]
    assert b1.on_timer(3.0, timer_key(PhaseKind.CAN_TAKE, 0)) == []


def test_an_iteration_done_is_not_acknowledged_by_a_node_that_does_not_lead() -> None:
    d1 = Phases("d1", -1, 0)
    assert d1.on_iteration_done(0.0, "d0", IterationDone(0, 1, 0.0), leading=False, **ALL) == []
    assert d1.stats.refused_not_leading == 1


def test_a_report_goes_to_each_new_leader_and_a_begun_iteration_is_handed_over() -> None:
    """The leader d0 dies: d1's pending report goes to d2 once the election names it; d2 holds no BEGIN."""
    d1 = Phases("d1", -1, 0)
    assert d1.report_done(0.0, IterationDone(0, 3, 1.0)) == []  # nobody leads yet: kept
    eff = d1.set_leader(1.0, "d0")
    assert sends(eff) == [Send("d0", IterationDone(0, 3, 1.0))]
    eff = d1.set_leader(5.0, None)  # the old leader is gone: its copy is not resent any more
    assert CancelTimer(timer_key(PhaseKind.DONE, 0)) in eff and d1.on_timer(6.0, timer_key(PhaseKind.DONE, 0)) == []
    assert sends(d1.set_leader(7.0, "d2")) == [Send("d2", IterationDone(0, 3, 1.0))]
    # d1 then applied BEGIN of 0 from a leader that died before reaching d2: d1 hands it to the next leader
    begin = BeginAggregation(0, 6)
    d1.on_begin(8.0, "d2", begin, next_stage=[])
    eff = d1.set_leader(20.0, "d3")
    assert Send("d3", begin) in sends(eff)
    # the new leader d3, handed a BEGIN it does not hold, applies it and sends it to the whole front
    d3 = Phases("d3", -1, 0)
    d3.set_leader(19.0, "d3", front=["d1", "d3", "d4", "a0"])
    eff = d3.on_begin(20.1, "d1", begin, next_stage=[])
    assert {e.to for e in sends(eff, BeginAggregation)} == {"d4", "a0"} and StartStep(0, 6) in eff
    # a leader that began an iteration answers a late report of it with the BEGIN
    eff = d3.on_iteration_done(21.0, "d4", IterationDone(0, 3, 1.0), leading=True, **ALL)
    assert Send("d4", PhaseAck(PhaseKind.DONE, 0)) in eff and Send("d4", begin) in eff


def test_a_new_leader_that_holds_a_begin_sends_it_to_the_front_again() -> None:
    d1 = Phases("d1", -1, 0)
    begin = BeginAggregation(0, 6)
    d1.on_begin(1.0, "d0", begin, next_stage=[])
    eff = d1.set_leader(5.0, "d1", front=["d1", "d2", "a0", "a1"])
    assert sorted(e.to for e in sends(eff, BeginAggregation)) == ["a0", "a1", "d2"]


def test_a_dead_data_node_is_not_waited_for() -> None:
    d0 = Phases("d0", -1, 0)
    d0.set_leader(0.0, "d0")
    d0.report_done(1.0, IterationDone(0, 2, 0.0))
    assert d0.maybe_begin(1.0, 0, leading=True, **ALL) == []  # d1 has not reported
    d0.forget(8.0, "d1", ["a0", "a1"], [])
    eff = d0.maybe_begin(8.0, 0, leading=True, data_nodes=["d0"], stage0=["a0", "a1"])
    assert StartStep(0, 2) in eff


def test_begin_of_another_iteration_than_the_parameters_is_refused() -> None:
    a0 = Phases("a0", 0, 1, applied=2)
    eff = a0.on_begin(0.0, "d0", BeginAggregation(3, 4), next_stage=["b0"])
    assert OutOfStep(3, 2) in eff and not [e for e in eff if isinstance(e, StartStep)]
    assert [e.to for e in sends(eff, BeginAggregation)] == ["b0"]  # still passed on
    # resynced to the state after the step of 3: its CAN TAKE goes on
    eff = a0.resynced(5.0, 4, ["b0"], ["d0"])
    assert eff == []  # b0 has not said CAN TAKE
    assert [e.to for e in sends(a0.on_can_take(6.0, "b0", CanTake(3, 1), ["b0"], ["d0"]), CanTake)] == ["d0"]


def test_can_take_rule_any_goes_on_after_one_downstream_member() -> None:
    for rule, expect in ((CanTakeRule.ALL, []), (CanTakeRule.ANY, ["d0"])):
        a0 = Phases("a0", 0, 1, can_take=rule)
        a0.on_begin(0.0, "d0", BeginAggregation(0, 4), next_stage=["b0", "b1"])
        a0.on_step_done(1.0, 0, ["b0", "b1"], ["d0"])
        eff = a0.on_can_take(2.0, "b0", CanTake(0, 1), ["b0", "b1"], ["d0"])
        assert [e.to for e in sends(eff, CanTake)] == expect, rule


def test_old_iterations_are_forgotten_and_their_signals_only_acknowledged() -> None:
    a0 = Phases("a0", 0, 1)
    for it in range(4):
        a0.on_begin(it * 10.0, "d0", BeginAggregation(it, 4), next_stage=[])
        a0.on_step_done(it * 10.0 + 1, it, [], ["d0"])
        a0.on_can_take(it * 10.0 + 2, "b0", CanTake(it, 1), ["b0"], ["d0"])
    assert min(a0.begun) >= 2 and a0.floor == 2
    assert a0.on_begin(50.0, "d0", BeginAggregation(0, 4), next_stage=["b0"]) == [
        Send("d0", PhaseAck(PhaseKind.BEGIN, 0))]


def test_a_signal_held_back_from_a_peer_presumed_dead_goes_to_it_when_it_is_back() -> None:
    """b0 presumed a0 dead before a0 acknowledged its CAN TAKE; a0 was alive (a false death) and is back: the
    CAN TAKE goes to it again, or a0 would wait for it (and the iteration with it) until its own bound."""
    b0 = Phases("b0", 1, 1)
    b0.on_begin(0.0, "a0", BeginAggregation(0, 4), next_stage=[])
    b0.on_step_done(1.0, 0, [], ["a0", "a1"])
    b0.on_ack(1.1, "a1", PhaseAck(PhaseKind.CAN_TAKE, 0))
    b0.forget(1.5, "a0", [], [])
    assert b0.on_timer(3.0, timer_key(PhaseKind.CAN_TAKE, 0)) == []  # nothing resent to it while it is gone
    eff = b0.peer_back(20.0, "a0")
    assert sends(eff) == [Send("a0", CanTake(0, 1))] and SetTimer(timer_key(PhaseKind.CAN_TAKE, 0), 22.0) in eff
    assert b0.peer_back(21.0, "a0") == []  # once
    assert b0.on_ack(21.5, "a0", PhaseAck(PhaseKind.CAN_TAKE, 0)) == [CancelTimer(timer_key(PhaseKind.CAN_TAKE, 0))]
    # a signal of an iteration over here is not sent again
    b1 = Phases("b1", 1, 1)
    b1.on_begin(0.0, "a0", BeginAggregation(0, 4), next_stage=[])
    b1.on_step_done(1.0, 0, [], ["a0"])
    b1.forget(1.5, "a0", [], [])
    for it in (1, 2):
        b1.on_begin(2.0 + it, "a1", BeginAggregation(it, 4), next_stage=[])
        b1.on_step_done(2.5 + it, it, [], ["a1"])
    assert sends(b1.peer_back(9.0, "a0")) == []


def test_a_duplicate_begin_after_can_take_is_answered_with_can_take() -> None:
    """a0 waits for b0's CAN TAKE and asks for it by sending BEGIN again (phasewaits.py); b0 sent it while it held
    a0 gone (left out), or a0 lost it after acknowledging: b0 sends it again."""
    b0 = Phases("b0", 1, 1)
    b0.on_begin(0.0, "a0", BeginAggregation(0, 4), next_stage=[])
    b0.forget(0.5, "a0", [], [])
    assert sends(b0.on_step_done(1.0, 0, [], ["a0"]), CanTake) == []  # a0 held gone: left out
    eff = b0.on_begin(40.0, "a0", BeginAggregation(0, 4), next_stage=[])
    assert Send("a0", PhaseAck(PhaseKind.BEGIN, 0)) in eff and Send("a0", CanTake(0, 1)) in eff
    assert not any(isinstance(e, StartStep) for e in eff)  # not applied again
    # before its own CAN TAKE, a duplicate is only acknowledged
    b1 = Phases("b1", 1, 1)
    b1.on_begin(0.0, "a0", BeginAggregation(0, 4), next_stage=[])
    assert b1.on_begin(1.0, "a0", BeginAggregation(0, 4), next_stage=[]) == [Send("a0", PhaseAck(PhaseKind.BEGIN, 0))]


def test_begin_names_the_attempt_that_completed_each_microbatch() -> None:
    """The leader's BEGIN carries each data node's completed seqs with the attempts its report names; a report
    without attempts (any attempt counts) gives seqs alone."""
    lead = Phases("d0", -1, 0)
    lead.set_leader(0.0, "d0")
    lead.report_done(0.0, IterationDone(0, 2, 1.0, 0, 0, (4, 3), (0, 2)))
    eff = lead.on_iteration_done(0.1, "d1", IterationDone(0, 1, 1.0, 0, 0, (7,)), leading=True, **ALL)
    msg = sends(eff, BeginAggregation)[0].msg
    assert [(c.data_node, c.seqs, c.attempts) for c in msg.completed] == [("d0", (3, 4), (2, 0)), ("d1", (7,), ())]
    assert lead.completed_in(0) == {"d0": {3: Completion(2), 4: Completion(0)}, "d1": {7: Completion()}}


def test_named_group_is_begins_group_as_sent_and_group_drops_the_peers_held_gone() -> None:
    """The all-reduce waits a grace for a member presumed dead just before BEGIN (runtime/node/regroup.py): it
    reads the group as the leader sent it; the CAN TAKE waits read `group`, without the peers held gone."""
    b0 = Phases("b0", 1, 1)
    b0.forget(0.5, "b1", [], [])
    groups = (StageMembers(0, ("a0",)), StageMembers(1, ("b0", "b1")))
    b0.on_begin(1.0, "a0", BeginAggregation(0, 4, groups), next_stage=[])
    assert b0.named_group(0, 1) == ("b0", "b1") and b0.group(0, 1) == {"b0"}
    assert b0.named_group(0, 2) == () and b0.named_group(1, 1) is None
    b0.on_begin(2.0, "a0", BeginAggregation(1, 4), next_stage=[])
    assert b0.named_group(1, 1) is None  # BEGIN without groups


def test_begin_sheds_the_groups_of_the_stages_behind_as_it_travels() -> None:
    """A relay passes BEGIN on without the groups of the stages before its own (the next stage's previous):
    the size a relay sends stays with its neighbourhood, and each member still waits for exactly its next
    stage's named members and sends CAN TAKE to its previous stage's."""
    groups = tuple(StageMembers(k, (f"s{k}a", f"s{k}b")) for k in range(-1, 4))
    r = {k: Phases(f"s{k}a", k, 3) for k in range(4)}
    msg = BeginAggregation(0, 4, groups)
    seen = []
    for k in range(4):
        eff = r[k].on_begin(0.1 * k, "x", msg, next_stage=[])
        if k < 3:
            out = sends(eff, BeginAggregation)
            assert {e.to for e in out} == {f"s{k + 1}a", f"s{k + 1}b"}
            msg = out[0].msg
            seen.append(sorted(g.stage for g in msg.groups))
    assert seen == [[-1, 0, 1, 2, 3], [-1, 1, 2, 3], [-1, 2, 3]]
    assert r[3].group(0, 3) == {"s3a", "s3b"} and r[3].group(0, 2) == {"s2a", "s2b"}
    eff = r[3].on_step_done(1.0, 0, next_stage=[], prev_stage=[])
    assert {e.to for e in sends(eff, CanTake)} == {"s2a", "s2b"}  # (the named previous stage, from the shed BEGIN)
    r[2].on_step_done(1.1, 0, next_stage=[], prev_stage=[])
    assert sends(r[2].on_can_take(1.2, "s3a", CanTake(0, 3), [], []), CanTake) == []  # s3b named: waited for
    assert {e.to for e in sends(r[2].on_can_take(1.3, "s3b", CanTake(0, 3), [], []), CanTake)} == {"s1a", "s1b"}


def test_a_member_not_ready_steps_in_no_iteration_until_resynced() -> None:
    """A relay back with a checkpoint of 7 steps, before it settled its state: a BEGIN that names it finds it out
    of step (no step; the driver sits it out); once resynced to 8 steps, iteration 7 counts as stepped."""
    a0 = Phases("a0", 0, 1, applied=NOT_READY)
    begin = BeginAggregation(7, 4, groups=(StageMembers(0, ("a0", "a1")),))
    eff = a0.on_begin(0.0, "d0", begin, next_stage=["b0"])
    assert OutOfStep(7, NOT_READY) in eff and not [e for e in eff if isinstance(e, StartStep)]
    a0.resynced(1.0, 8, ["b0"], ["d0"])
    assert 7 in a0.stepped and a0.applied == 8
    assert StartStep(8, 4) in a0.on_begin(2.0, "d0", BeginAggregation(8, 4), next_stage=["b0"])

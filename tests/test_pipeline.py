"""The pure bookkeeping of an iteration: slots along flows, the ledger, BEGIN AGGREGATION / CAN TAKE."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.messages import BeginAggregation, CanTake, IterationDone
from gwtf_node.protocol.pipeline import (
    DataIteration, LeftOut, Ledger, MbStatus, OpenIteration, Phases, StartStep, fallback_hop, pick_next_hop,
)


def test_pick_next_hop_respects_flow_units_and_cost() -> None:
    out = {"a": 2, "b": 1}
    costs = {"a": 5.0, "b": 3.0}
    assert pick_next_hop(out, {}, costs) == "b"
    assert pick_next_hop(out, {"b": 1}, costs) == "a"
    assert pick_next_hop(out, {"b": 1, "a": 2}, costs) is None
    assert pick_next_hop(out, {}, costs, alive={"a"}) == "a"


def test_fallback_prefers_least_loaded_then_cheapest() -> None:
    assert fallback_hop({"a": 5.0, "b": 3.0}, {"b": 1}) == "a"
    assert fallback_hop({}, {}) is None


def test_data_iteration_runs_in_waves_when_flow_is_short() -> None:
    it = DataIteration(0, [0, 1, 2, 3, 4])
    first = it.launchable({"x": 2, "y": 1}, {"x": 1.0, "y": 2.0}, flows_formed=True)
    assert [h for _, h in first] == ["x", "x", "y"]
    assert it.launchable({"x": 2, "y": 1}, {"x": 1.0, "y": 2.0}, flows_formed=True) == []
    assert it.complete(0, 2.0)
    assert not it.complete(0, 2.0)  # twice: refused
    assert it.launchable({"x": 2, "y": 1}, {"x": 1.0, "y": 2.0}, flows_formed=True) == [(3, "x")]
    for s in (1, 2, 3):
        it.complete(s, 1.0)
    assert not it.finished
    assert it.launchable({"x": 2, "y": 1}, {"x": 1.0, "y": 2.0}, flows_formed=True) == [(4, "x")]
    it.complete(4, 1.0)
    assert it.finished and it.loss_sum == 6.0


def test_ledger_counts_and_exactly_once() -> None:
    led = Ledger()
    led.add(0, [0, 1])
    led.mark(0, 0, MbStatus.INFLIGHT)
    led.mark(0, 0, MbStatus.COMPLETED)
    led.mark(0, 1, MbStatus.DEFERRED)
    assert led.counts(0) == {"pending": 0, "inflight": 0, "completed": 1, "deferred": 1}
    with pytest.raises(ValueError):
        led.mark(0, 0, MbStatus.INFLIGHT)
    with pytest.raises(ValueError):
        led.add(0, [1])
    with pytest.raises(KeyError):
        led.mark(3, 0, MbStatus.COMPLETED)
    assert led.completed_everywhere() == [0]


def test_phases_two_stages_end_to_end() -> None:
    """d0 (leader), d1; stage 0: a0, a1; stage 1 (last): b0, b1."""
    d = {n: Phases(n, -1, 1) for n in ("d0", "d1")}
    a = {n: Phases(n, 0, 1) for n in ("a0", "a1")}
    b = {n: Phases(n, 1, 1) for n in ("b0", "b1")}
    # the leader hears both data nodes
    assert d["d0"].on_iteration_done("d0", IterationDone(0, 4, 8.0), ["d0", "d1"], ["a0", "a1"]) == []
    eff = d["d0"].on_iteration_done("d1", IterationDone(0, 4, 4.0), ["d0", "d1"], ["a0", "a1"])
    sends = {e.to for e in eff if isinstance(e, Send)}
    assert sends == {"d1", "a0", "a1"}
    assert StartStep(0, 8) in eff
    assert d["d0"].iteration_loss(0) == (8, 12.0)
    # stage 0 passes BEGIN on, once
    eff = a["a0"].on_begin(BeginAggregation(0, 8), next_stage=["b0", "b1"])
    assert {e.to for e in eff if isinstance(e, Send)} == {"b0", "b1"} and StartStep(0, 8) in eff
    assert a["a0"].on_begin(BeginAggregation(0, 8), next_stage=["b0", "b1"]) == []
    # the last stage: CAN TAKE as soon as its step is done
    b["b0"].on_begin(BeginAggregation(0, 8), next_stage=["d0", "d1"])
    eff = b["b0"].on_step_done(0, next_stage=["d0", "d1"], prev_stage=["a0", "a1"])
    assert [e.to for e in eff] == ["a0", "a1"] and all(isinstance(e.msg, CanTake) for e in eff)
    # stage 0 waits for its step AND both last-stage relays
    a0 = a["a0"]
    assert a0.on_can_take("b0", CanTake(0, 1), ["b0", "b1"], ["d0", "d1"]) == []
    assert a0.on_step_done(0, ["b0", "b1"], ["d0", "d1"]) == []
    eff = a0.on_can_take("b1", CanTake(0, 1), ["b0", "b1"], ["d0", "d1"])
    assert [e.to for e in eff] == ["d0", "d1"]
    # the data node opens the next iteration after its step and both stage-0 relays
    d1 = d["d1"]
    d1.on_begin(BeginAggregation(0, 8), next_stage=[])
    assert d1.on_can_take("a0", CanTake(0, 0), ["a0", "a1"], ["b0", "b1"]) == []
    assert d1.on_step_done(0, ["a0", "a1"], ["b0", "b1"]) == []
    assert d1.on_can_take("a1", CanTake(0, 0), ["a0", "a1"], ["b0", "b1"]) == [OpenIteration(1)]
    assert d1.on_can_take("a1", CanTake(0, 0), ["a0", "a1"], ["b0", "b1"]) == []  # once


def test_groups_named_by_the_leader_decide_who_steps_and_who_is_waited_for() -> None:
    """A newcomer n0 of stage 0 not ready yet: left out; a0 does not wait for it, nor does the data node."""
    lead = Phases("d0", -1, 1)
    groups = {-1: ["d0"], 0: ["a0"], 1: ["b0"]}
    eff = lead.on_iteration_done("d0", IterationDone(3, 2, 1.0), ["d0"], ["a0", "n0"], groups)
    begin = next(e.msg for e in eff if isinstance(e, Send))
    assert {e.to for e in eff if isinstance(e, Send)} == {"a0", "n0"}  # everyone at stage 0 hears it
    assert [(g.stage, g.peers) for g in begin.groups] == [(-1, ("d0",)), (0, ("a0",)), (1, ("b0",))]
    n0 = Phases("n0", 0, 1)
    eff = n0.on_begin(begin, next_stage=["b0"])
    assert LeftOut(3) in eff and not any(isinstance(e, StartStep) for e in eff)
    a0 = Phases("a0", 0, 1)
    assert StartStep(3, 2) in a0.on_begin(begin, next_stage=["b0", "n1"])
    a0.on_step_done(3, ["b0", "n1"], ["d0"])
    # n1 (a newcomer at stage 1, left out) never says CAN TAKE: a0 waits only for b0
    assert [e.to for e in a0.on_can_take("b0", CanTake(3, 1), ["b0", "n1"], ["d0"])] == ["d0"]
    lead.on_step_done(3, ["a0", "n0"], ["b0"])
    assert lead.on_can_take("a0", CanTake(3, 0), ["a0", "n0"], ["b0"]) == [OpenIteration(4)]

"""The pure bookkeeping of an iteration: slots along flows, the ledger (the phases: tests/protocol/test_phases.py)."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.pipeline import DataIteration, Ledger, MbStatus, fallback_hop, pick_next_hop


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

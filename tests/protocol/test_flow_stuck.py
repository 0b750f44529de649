"""A data node whose launch needed a stuck wave launches one unit per wave from then on (flow/launches.py)."""

from __future__ import annotations

import random

from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.messages import CostAnnounce, FlowReply, Label, Reply, RequestFlow, Side

D = "d0"


def data_node() -> FlowNode:
    """One data node (label waves, same-wave launches): first hop A, last-stage peer Z."""
    m = FlowNode(FlowConfig(D, True, 3, (D,), {"A": 1.0}, {"Z": 2.0}), random.Random(0))
    m.start(0.0)
    return m


def hear_a(m: FlowNode, now: float) -> list:
    """A's IN label of the data node's current wave: the OUT label is 1 + 4 = 5."""
    e = m.labels.epoch[D]
    return m.on_message(now, "A", CostAnnounce((Label(D, Side.IN, 4.0, ("A+", "A-", D + "+"), epoch=e),)))


def launch(m: FlowNode, eff: list) -> tuple[list, RequestFlow]:
    timer = [x for x in eff if isinstance(x, SetTimer) and x.key == "launch"][-1]
    eff = m.on_timer(timer.deadline, "launch")
    req = [x.msg for x in eff if isinstance(x, Send) and isinstance(x.msg, RequestFlow) and x.to == "A"]
    assert len(req) == 1
    m.on_message(timer.deadline + 0.01, "A", FlowReply(req[0].req_id, D, Reply.APPROVED, None))
    return eff, req[0]


def stuck_deadline(eff: list) -> float:
    return [x for x in eff if isinstance(x, SetTimer) and x.key == "stuck"][-1].deadline


def test_a_unit_that_settles_on_its_wave_lets_the_next_go_on_the_same_wave():
    m = data_node()
    _, _ = launch(m, hear_a(m, 0.1))
    e = m.labels.epoch[D]
    eff = m.on_message(1.0, "Z", RequestFlow(7, D, 0.0))  # the unit reached the sink
    assert m.labels.epoch[D] == e and m.launch.wave_launches == 2 and not m.launch.one_per_wave
    assert [x.to for x in eff if isinstance(x, Send) and isinstance(x.msg, RequestFlow)] == ["A"]  # the next


def test_after_a_stuck_wave_every_unit_gets_a_wave_of_its_own():
    m = data_node()
    eff, _ = launch(m, hear_a(m, 0.1))
    e = m.labels.epoch[D]
    t = stuck_deadline(eff)
    m.on_timer(t, "stuck")  # the unit has not settled: held somewhere, a new wave
    assert m.labels.epoch[D] == e + 1
    hear_a(m, t + 0.1)  # the new wave's label, as tight as before
    eff = m.on_message(t + 0.5, "Z", RequestFlow(7, D, 0.0))  # the held unit reached the sink
    assert m.launch.one_per_wave
    assert m.labels.epoch[D] == e + 2  # a new wave, not a launch on this one
    assert not [x for x in eff if isinstance(x, Send) and isinstance(x.msg, RequestFlow)]
    # and so for the next unit, which settles without a stuck wave
    eff, _ = launch(m, hear_a(m, t + 0.6))
    e2 = m.labels.epoch[D]
    m.on_message(t + 5.0, "Z", RequestFlow(8, D, 0.0))
    assert m.labels.epoch[D] == e2 + 1

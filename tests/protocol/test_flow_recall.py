"""Recall waves (one data node, label waves: flow/launches.py): a launched unit with no augmenting path comes back."""

from __future__ import annotations

import random

import pytest

from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.flow import FlowConfig, FlowNode, launches
from gwtf_node.protocol.messages import INF, CostAnnounce, Deny, DenyReason, FlowReply, Label, Reply, RequestFlow, Side

D = "d0"


class DataNode:
    """A data node with first hop A and last hop Z, its timers fired in order."""

    def __init__(self, **extra) -> None:
        self.m = FlowNode(FlowConfig(D, True, 2, (D,), {"A": 1.0}, {"Z": 1.0}, **extra), random.Random(0))
        self.timers: dict[str, float] = {}
        self.sent: list[tuple[float, Send]] = []
        self.take(0.0, self.m.start(0.0))

    def take(self, now: float, eff: list) -> None:
        for e in eff:
            if isinstance(e, SetTimer):
                self.timers[e.key] = e.deadline
            else:
                self.sent.append((now, e))

    def run_to(self, t: float) -> None:
        while due := sorted((d, k) for k, d in self.timers.items() if d <= t):
            d, k = due[0]
            del self.timers[k]
            self.take(d, self.m.on_timer(d, k))

    def deliver(self, now: float, sender: str, msg) -> None:
        self.run_to(now)
        self.take(now, self.m.on_message(now, sender, msg))

    def labels_to(self, peer: str, since: float) -> list[Label]:
        return [lab for t, e in self.sent if t >= since and e.to == peer and isinstance(e.msg, CostAnnounce)
                for lab in e.msg.labels]

    def launched(self) -> RequestFlow:
        reqs = [e.msg for _, e in self.sent if e.to == "A" and isinstance(e.msg, RequestFlow)]
        assert len(reqs) == 1
        return reqs[0]


def stuck_launch(**extra) -> DataNode:
    """The data node launched a unit on wave 1, A approved it, and the wave after it shows no route."""
    n = DataNode(**extra)
    n.deliver(0.1, "A", CostAnnounce((Label(D, Side.IN, 10.0, ("A+", "A-", "Z+", "Z-", D + "+"), 1, True),)))
    n.run_to(1.0)
    n.deliver(1.0, "A", FlowReply(n.launched().req_id, D, Reply.APPROVED, None))
    assert n.m.launch.pending == 1 and n.m.labels.epoch[D] == 2  # the stuck timer started wave 2
    n.deliver(1.5, "A", CostAnnounce((Label(D, Side.IN, INF, (), 2, True),)))
    return n


def test_a_stuck_launch_without_an_augmenting_path_starts_a_recall_wave():
    n = stuck_launch()
    n.run_to(5.0)
    assert n.m.labels.epoch[D] == 3 and n.m.launch.recall
    # the retire label goes to the first hop: a unit handed back to the data node costs 0 from there, so the
    # relays' OUT labels price the way back, cheaper than any way on, and the unit follows them home
    (lab,) = [lab for lab in n.labels_to("A", 2.0) if lab.side is Side.OUT]
    assert lab.cost == 0.0 and lab.epoch == 3 and lab.path == (D + "~",)
    # the next stuck timer waits longer on a recall wave: the unit comes back hop by hop
    assert n.timers["stuck"] - 2.9 > 2 * n.m.cfg.round_s + n.m.cfg.launch_settle_s


def test_the_unit_back_ends_the_recall():
    n = stuck_launch()
    n.run_to(5.0)
    since = n.sent[-1][0]
    n.deliver(6.0, "A", Deny(D, DenyReason.NO_ROUTE))
    assert n.m.launch.pending == 0 and not n.m.launch.recall and n.m.labels.epoch[D] == 4
    assert n.m.labels.my_out[D].cost == INF
    assert all(lab.side is Side.IN for lab in n.labels_to("A", since + 0.001) + n.labels_to("Z", since + 0.001))
    n.run_to(20.0)
    assert not n.m.launch.recall and n.m.labels.epoch[D] == 4  # nothing out: no more waves, no launch
    assert len([e for _, e in n.sent if isinstance(e.msg, RequestFlow)]) == 1


def test_a_stuck_launch_with_a_route_on_the_new_wave_is_no_recall():
    n = DataNode()
    n.deliver(0.1, "A", CostAnnounce((Label(D, Side.IN, 10.0, ("A+", "A-", "Z+", "Z-", D + "+"), 1, True),)))
    n.run_to(1.0)
    n.deliver(1.0, "A", FlowReply(n.launched().req_id, D, Reply.APPROVED, None))
    n.deliver(1.5, "A", CostAnnounce((Label(D, Side.IN, 12.0, ("A+", "A-", "Z+", "Z-", D + "+"), 2, True),)))
    n.run_to(5.0)
    assert n.m.labels.epoch[D] >= 3 and not n.m.launch.recall  # the unit may still find the sink: wait for it
    assert not [lab for lab in n.labels_to("A", 1.5) if lab.side is Side.OUT and lab.cost == 0.0]


def test_several_data_nodes_never_recall():
    m = FlowNode(FlowConfig(D, True, 2, (D, "d1"), {"A": 1.0}, {"Z": 1.0}, waves=True), random.Random(0))
    m.start(0.0)
    m.launch.pending, m.launch.launch_wave = 1, 0
    m.labels.epoch[D] = 1
    assert not launches.recall_due(m)


def test_the_retire_label_waits_until_the_recall_wave_has_reached_the_data_node():
    n = stuck_launch()
    n.run_to(2.95)  # the recall wave began at 2.9; the last wave that gave an OUT label took 0.1 s
    assert n.m.launch.recall and not n.m.launch.retire
    assert not [lab for lab in n.labels_to("A", 2.0) if lab.side is Side.OUT and lab.cost == 0.0]
    n.run_to(3.05)
    assert n.m.launch.retire and [lab for lab in n.labels_to("A", 2.0) if lab.side is Side.OUT and lab.cost == 0.0]


def test_a_launch_after_a_recall_waits_twice_as_long_before_a_new_wave():
    n = stuck_launch()
    n.run_to(5.0)
    n.deliver(6.0, "A", Deny(D, DenyReason.NO_ROUTE))
    assert n.m.launch.backoff == 1
    e = n.m.labels.epoch[D]
    n.deliver(6.1, "A", CostAnnounce((Label(D, Side.IN, 12.0, ("A+", "A-", "Z+", "Z-", D + "+"), e, True),)))
    n.run_to(6.5)
    launched_at = [t for t, s in n.sent if isinstance(s.msg, RequestFlow)][-1]
    assert launched_at > 6.1
    # the first launch (0.3 s) had its stuck timer at 0.7: launch_settle_s + twice the wave's 0.1 s; this one waits
    # twice that wave time again
    assert n.timers["stuck"] - launched_at == pytest.approx(n.m.cfg.launch_settle_s + 2 * 2 * 0.1)
    n.deliver(6.6, "Z", RequestFlow(9, D, 0.0))  # the unit reaches the sink: no more backoff
    assert n.m.launch.backoff == 0


def test_each_stuck_wave_of_one_launch_with_a_route_waits_twice_as_long_as_the_one_before():
    # a relay holds a unit until its labels of the wave are still; stuck waves that come faster than that hold it
    # for good (tests/sim/test_flow_delays.py): so the stuck timer backs off while the launch does not settle
    n = DataNode()
    n.deliver(0.1, "A", CostAnnounce((Label(D, Side.IN, 10.0, ("A+", "A-", "Z+", "Z-", D + "+"), 1, True),)))
    n.run_to(0.5)
    n.deliver(0.5, "A", FlowReply(n.launched().req_id, D, Reply.APPROVED, None))
    waits = []
    for _ in range(7):
        e = n.m.labels.epoch[D]
        at = n.timers["stuck"]
        n.run_to(at)
        assert n.m.labels.epoch[D] == e + 1 and not n.m.launch.recall  # a new wave, with a route: no recall
        n.deliver(at + 0.1, "A", CostAnnounce((Label(D, Side.IN, 10.0, ("A+", "A-", "Z+", "Z-", D + "+"), e + 1,
                                                     True),)))
        waits.append(n.timers["stuck"] - at - n.m.cfg.launch_settle_s)
    # twice a round (the new wave's time is not known yet when the timer is set), doubled per stuck wave after the
    # first, up to 2 ** MAX_BACKOFF
    assert waits == pytest.approx([2.0, 4.0, 8.0, 16.0, 32.0, 32.0, 32.0])
    n.deliver(n.timers["stuck"] - 0.1, "Z", RequestFlow(9, D, 0.0))  # the unit reaches the sink
    assert n.m.launch.pending == 0

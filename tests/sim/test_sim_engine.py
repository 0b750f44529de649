"""The simulator's event order (sim/engine.py): a message sent to several peers is one heap entry per delay
(`_MANY`), which must deliver exactly as the separate events it stands for: by (time, sequence number),
skipping dead receivers, with `stop` asked before each delivery."""

from __future__ import annotations

from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.sim.engine import Simulator

M1, M2 = ("M1",), ("M2",)  # one object each, sent to several peers
DELAY_MS = {("a", "x"): 3.0}  # every other link: 5 ms


class Rec:
    def __init__(self, nid: str, log: list, script: list | None = None) -> None:
        self.nid, self.log, self.script = nid, log, script or []

    def start(self, now):
        return list(self.script)

    def on_message(self, now, sender, msg):
        self.log.append((round(now, 6), self.nid, sender, msg))
        if self.nid == "b" and msg is M1:
            return [SetTimer("late", now)]  # an event at the same time: after every one already queued
        return []

    def on_timer(self, now, key):
        self.log.append((round(now, 6), self.nid, "timer", key))
        return []


def _run(stop_at: int | None = None) -> tuple[list, list]:
    log: list = []
    sim = Simulator(lambda a, b: DELAY_MS.get((a, b), 5.0) * 1e-3)
    script = [Send("b", M1), Send("c", M1), Send("x", M1), Send("d", M1), Send("e", M1),
              SetTimer("t", 0.005), Send("b", M2)]
    sim.add("a", Rec("a", log, script))
    for n in "bcdex":
        sim.add(n, Rec(n, log))
    sim.kill("c")
    sim.start_all()
    asked: list = []

    def stop(now):
        asked.append(round(now, 6))
        return len(asked) == stop_at

    sim.run_until(1.0, stop=stop, check_every_s=0.001)
    if stop_at is not None:
        sim.run_until(1.0, stop=stop, check_every_s=0.001)  # carries on where it stopped
    return log, asked


def test_multicast_delivers_in_event_order():
    log, asked = _run()
    assert log == [
        (0.003, "x", "a", M1),
        (0.005, "b", "a", M1),  # c is dead: skipped
        (0.005, "d", "a", M1),
        (0.005, "e", "a", M1),
        (0.005, "a", "timer", "t"),  # set after the first Sends, before the last one
        (0.005, "b", "a", M2),
        (0.005, "b", "timer", "late"),  # queued while the multicast was being delivered: after all of it
    ]
    assert asked == [0.001, 0.002, 0.003, 0.004, 0.005]  # one check per event (c's included), as before


def test_stop_inside_a_multicast_resumes_with_the_rest():
    full, _ = _run()
    for k in range(1, 6):
        log, asked = _run(stop_at=k)
        assert log == full, k
        assert asked[:k] == [0.001, 0.002, 0.003, 0.004, 0.005][:k]


def test_a_drivers_own_events_come_out_by_time_then_push_order() -> None:
    """`push` / `next_event`: the queue and clock a driver with its own kinds of events uses (sim/train)."""
    sim = Simulator(lambda a, b: None)
    sim.push(2.0, 7, "a", "late")
    sim.push(1.0, 8, "b", "first")
    sim.push(1.0, 7, "c", "second", 3)
    assert sim.next_event(10.0) == (1.0, 8, "b", "first", None) and sim.now == 1.0
    assert sim.next_event(10.0) == (1.0, 7, "c", "second", 3)
    assert sim.next_event(1.5) is None and sim.now == 1.0  # after the limit: the clock stays
    assert sim.next_event(10.0) is None  # (an event after the limit is dropped, the run ends there)

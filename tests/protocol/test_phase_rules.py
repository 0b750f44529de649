"""Hypothesis: the aggregation phase opens every iteration, whatever joins, crashes and lost frames come between.

A data node that leads, two stages of relays, all driven by the pure `Phases`
machines over an in-memory network that loses and reorders frames.  Relays
join (the leader counts them at once; the other nodes hear of them only when
a `hello` rule says so), crash (every node forgets them: the membership
layer's decision), frames are lost, delivered out of order, and time passes
(retransmission and watch timers fire).  After any such history, `settle`
delivers what is in flight, applies the steps, and lets at most a few wait
bounds pass: the iteration reported must be open by then
(protocol/phases.py, "Who passes a signal on"; protocol/phasewaits.py).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gwtf_node.protocol.effects import CancelTimer, Send, SetTimer
from gwtf_node.protocol.messages import IterationDone
from gwtf_node.protocol.phases import OpenIteration, Overdue, Phases, StartStep

BOUND = 30.0


class PhaseRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.t = 0.0
        self.nodes: dict[str, Phases] = {"d": Phases("d", -1, 1, wait_bound_s=BOUND)}
        self.stage: dict[str, int] = {"d": -1}
        self.known: dict[str, set[str]] = {"d": set()}
        self.net: list[tuple[str, Send]] = []
        self.timers: dict[tuple[str, str], float] = {}
        self.steps: list[tuple[str, int]] = []
        self.crashed: set[str] = set()
        self.open = 0  # the data node's open iteration
        self.reported: int | None = None
        self.overdue = 0
        self.count = 0
        for k in (0, 0, 1):
            self._new_relay(k, knows_all=True)
        self.nodes["d"].set_leader(0.0, "d", front=self._members(0))

    # ---- the network --------------------------------------------------------------
    def _members(self, k: int) -> list[str]:
        return sorted(n for n, s in self.stage.items() if s == k and n not in self.crashed)

    def _new_relay(self, k: int, knows_all: bool) -> str:
        name = f"r{k}_{self.count}"
        self.count += 1
        self.nodes[name] = Phases(name, k, 1, applied=self.open, wait_bound_s=BOUND)
        self.stage[name] = k
        self.known[name] = {"d"} | ({n for n in self.stage if n != name} if knows_all else set())
        self.known["d"].add(name)  # its Hello reached the leader
        if knows_all:
            for n in self.known:
                self.known[n].add(name)
        return name

    def _view(self, n: str, k: int) -> list[str]:
        """The ids of stage k (data nodes: -1 and the last stage's next) that node n knows and has not forgotten."""
        want = -1 if k in (-1, 2) else k
        return sorted(p for p in self.known[n] if self.stage.get(p) == want and p not in self.crashed)

    def _nxt_prv(self, n: str) -> tuple[list[str], list[str]]:
        s = self.stage[n]
        return self._view(n, s + 1 if s >= 0 else 0), self._view(n, s - 1 if s >= 0 else 1)

    def _apply(self, n: str, eff: list) -> None:
        for e in eff:
            if isinstance(e, Send):
                self.net.append((n, e))
            elif isinstance(e, SetTimer):
                self.timers[(n, e.key)] = e.deadline
            elif isinstance(e, CancelTimer):
                self.timers.pop((n, e.key), None)
            elif isinstance(e, StartStep):
                self.steps.append((n, e.iteration))
            elif isinstance(e, OpenIteration):
                assert n == "d"
                self.open = max(self.open, e.iteration)
            elif isinstance(e, Overdue):
                self.overdue += 1

    def _deliver(self, i: int) -> None:
        src, e = self.net.pop(i)
        to = e.to
        if to in self.crashed or src in self.crashed:
            return
        ph = self.nodes[to]
        nxt, prv = self._nxt_prv(to)
        kind = type(e.msg).__name__
        self.t += 0.01
        if kind == "BeginAggregation":
            out = ph.on_begin(self.t, src, e.msg, nxt)
        elif kind == "CanTake":
            out = ph.on_can_take(self.t, src, e.msg, nxt, prv)
        elif kind == "PhaseAck":
            out = ph.on_ack(self.t, src, e.msg)
        else:
            out = []
        self._apply(to, out)

    def _fire_due(self) -> None:
        for (n, key), at in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if at <= self.t and (n, key) in self.timers and n not in self.crashed:
                del self.timers[(n, key)]
                self._apply(n, self.nodes[n].on_timer(self.t, key))

    # ---- rules --------------------------------------------------------------------
    @precondition(lambda self: self.reported != self.open)
    @rule()
    def report(self) -> None:
        it = self.open
        self.reported = it
        d = self.nodes["d"]
        groups = {-1: ["d"]} | {k: self._members(k) for k in (0, 1)}
        eff = d.report_done(self.t, IterationDone(it, 1, 1.0, 0, 0, (it,)))
        eff += d.maybe_begin(self.t, it, leading=True, data_nodes=["d"], stage0=self._view("d", 0), groups=groups)
        self._apply("d", eff)

    @precondition(lambda self: self.reported != self.open)
    @rule(k=st.sampled_from([0, 1]), knows=st.booleans())
    def join(self, k: int, knows: bool) -> None:
        """A relay with the state of the open iteration joins stage k; the leader hears of it at once."""
        self._new_relay(k, knows_all=knows)

    @rule(a=st.integers(0, 20), b=st.integers(0, 20))
    def hello(self, a: int, b: int) -> None:
        names = sorted(self.nodes)
        x, y = names[a % len(names)], names[b % len(names)]
        if x != y:
            self.known[x].add(y)

    @precondition(lambda self: sum(1 for n in self.stage if self.stage[n] >= 0 and n not in self.crashed) > 2)
    @rule(i=st.integers(0, 20))
    def crash(self, i: int) -> None:
        """A relay crashes (never the last of its stage: an empty stage pauses the run, the driver's decision)."""
        cands = [n for k in (0, 1) for n in self._members(k) if len(self._members(k)) > 1]
        if not cands:
            return
        dead = cands[i % len(cands)]
        self.crashed.add(dead)
        self.steps = [s for s in self.steps if s[0] != dead]
        for n, ph in self.nodes.items():
            if n not in self.crashed:
                nxt, prv = self._nxt_prv(n)
                self._apply(n, ph.forget(self.t, dead, nxt, prv))

    @precondition(lambda self: self.net)
    @rule(i=st.integers(0, 50), lose=st.booleans())
    def deliver(self, i: int, lose: bool) -> None:
        i %= len(self.net)
        if lose:
            self.net.pop(i)
        else:
            self._deliver(i)

    @precondition(lambda self: self.steps)
    @rule(i=st.integers(0, 50))
    def step(self, i: int) -> None:
        n, it = self.steps.pop(i % len(self.steps))
        nxt, prv = self._nxt_prv(n)
        self._apply(n, self.nodes[n].on_step_done(self.t, it, nxt, prv))

    @rule(dt=st.sampled_from([0.5, 2.5, BOUND + 1]))
    def tick(self, dt: float) -> None:
        self.t += dt
        self._fire_due()

    @rule()
    def settle(self) -> None:
        """Deliver everything, apply every step, let up to 3 wait bounds pass: the reported iteration opens."""
        if self.reported is None or self.reported < self.open:
            return
        end = self.t + 3 * BOUND
        while self.t < end and self.open <= self.reported:
            while self.net or self.steps:
                if self.net:
                    self._deliver(0)
                else:
                    self.step(0)
            self.t += 1.0
            self._fire_due()
        assert self.open > self.reported, (
            f"iteration {self.reported} not opened within 3 bounds: waits "
            f"{ {n: ph.waiting(self.t) for n, ph in self.nodes.items() if n not in self.crashed} }")

    @invariant()
    def never_ahead(self) -> None:
        assert self.open <= (self.reported or 0) + 1


PhaseRules.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPhaseRules = PhaseRules.TestCase

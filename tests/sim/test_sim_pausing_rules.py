"""Hypothesis: relays join, leave and crash at any moment of the simulated run; every iteration opens in time.

The training simulator (`gwtf_node.sim.train.TrainSim`, with the daemon's
pause of an empty stage, `pause_empty=True`) runs the daemon's phase,
joining, leader, microbatch and flow machines over two data nodes and two
relays per stage (Table II's homogeneous setting, seed 0, 5 stages).  The
rules act at the current virtual time through the simulator's hooks
(`sim/train/churn.py`): a relay joins a stage (`join_relay`: it downloads the
state from a stage member, or, the stage being empty, comes back with the
stage's checkpoint), leaves gracefully (`leave_relay`: the aggregation of its
iteration in flight, then Goodbye), crashes (`crash_relay`: the others learn
it DETECT_S later), phase frames are lost (their senders resend them), and
time passes (`advance`; `into_aggregation` runs until an aggregation is under
way, so that the churn also falls between BEGIN AGGREGATION and CAN TAKE;
`settle` runs until every data node opened once more).  Drawn at the start:
the policy (GWTF's flow machines, or SWARM), how long a leaving relay waits for
its last aggregation (the daemon's LEAVE_WAIT_S, or long enough to finish an
iteration of this setting) and how late crashes are learned (the daemon's
DETECT_S, or 60 s).

Invariants, after every rule:

* Paused exactly while a stage is empty: a paused data node has a stage with
  no ready relay (so it opens the moment the last empty stage is served:
  the bound of a pause is 0 s here, PAUSE_CHECK_S in the daemon); one that is
  not paused opened on its microbatch machine the iteration its aggregation
  phase opened; no data node ever opens an iteration with a stage empty (no
  idle iteration).
* Nothing counted twice: every data node opens iterations 0, 1, 2, ... each
  once and in order; every relay applies the step of an iteration at most
  once; no microbatch completes twice, and every microbatch of a closed
  iteration is completed or deferred.
* No silent wait: every wait of a node's aggregation phase that is older than
  its bound (WAIT_BOUND_S) was reported (`Overdue`), and a paused data node
  says which stages it waits for and since when.
* Every iteration opens within BOUND once the swarm is whole again (a live
  relay that is not leaving in every stage) and quiet (no join, leave, crash
  or lost frame since): in such a window, no live data node goes more than
  BOUND without opening an iteration, counted from the window's start.

BOUND, from the setting and the protocol's deadlines (not measured):
the iteration in flight when the window starts and the next one each take at
most ITERATION_S, plus what the churn just before the window may still cost:
`detect_s` (a crash is learned), ALLREDUCE_TIMEOUT_S (a round waits for a
named member that died before its part), WAIT_BOUND_S (a missing CAN TAKE is
asked for again), `leave_wait_s` (a leaving relay's last wait) and the
retransmissions of RETRY_S.  ITERATION_S is the work of one iteration done
one piece at a time: each of the D x M microbatches crosses 2 (S + 1) links
at the slowest transfer of an activation between the setting's locations,
and is computed (IDEAL_MB_S); then the slowest all-reduce of a stage
(2 x its gradient over the slowest link), the optimizer step, and a resync
(the stage state over the slowest link).  BOUND is 4762 s here (5405 s with
the long leave and detection); the longest gap seen in a quiet window is
328 s over the derandomized examples and 1768 s over 300 random ones of 30
steps (virtual time; `SEEN` keeps it for a script that runs the machine).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gwtf_node.protocol.messages import BeginAggregation, CanTake, IterationDone, PhaseAck
from gwtf_node.protocol.phases import RETRY_S
from gwtf_node.protocol.phasewaits import WAIT_BOUND_S
from gwtf_node.protocol.pipeline import MbStatus
from gwtf_node.sim import train as T
from gwtf_node.sim.train.churn import LEAVE_WAIT_S
from gwtf_node.sim.train.setting import (
    ACTIVATION_MB, ALLREDUCE_TIMEOUT_S, DETECT_S, IDEAL_MB_S, MICROBATCHES, OPTIMIZER_STEP_S, STAGE_SIZES,
    STAGE_STATE_MB, Setting, gradient_mb,
)

SEED = 0
SETTING = "table2-homogeneous"
BASE = T.make_setting(SETTING, SEED)
RELAYS = {r: v for r, v in BASE.relays.items() if int(r[3]) < 2}  # two relays a stage
LOCS = sorted({BASE.net.loc[n] for n in (*BASE.relays, *BASE.data)})  # where joiners start
MAX_RELAYS = 12  # live and joining, at most
PHASE_FRAMES = (IterationDone, BeginAggregation, CanTake, PhaseAck)


def _slowest(mb: float) -> float:
    return max(BASE.net.transfer_s(a, b, mb) for a in (*BASE.relays, *BASE.data) for b in (*BASE.relays, *BASE.data)
               if a != b)


S = len(STAGE_SIZES)
ITERATION_S = (len(BASE.data) * MICROBATCHES * (2 * (S + 1) * _slowest(ACTIVATION_MB) + IDEAL_MB_S)
               + 2 * _slowest(max(gradient_mb(k) for k in range(S))) + OPTIMIZER_STEP_S + _slowest(STAGE_STATE_MB))
LEAVE_WAITS = (LEAVE_WAIT_S, 600.0)  # the daemon's, and one long enough to finish an iteration of this setting
DETECTS = (DETECT_S, 60.0)  # the daemon's liveness check, and heartbeats or DHT entries expiring (a bench row)


def bound(leave_wait_s: float, detect_s: float) -> float:
    """BOUND (module docstring) with a leaving relay's wait `leave_wait_s` and crashes learned `detect_s` late."""
    return 2 * ITERATION_S + detect_s + ALLREDUCE_TIMEOUT_S + WAIT_BOUND_S + leave_wait_s + 2 * RETRY_S


SEEN: dict = {"max_gap": 0.0}  # the longest gap in a quiet window (scripts read it)


class Recorder(T.TrainSim):
    """The simulator as it is, with what happened written down (it decides nothing)."""

    def __init__(self, *args, **kw) -> None:
        self.opens: list[tuple[float, str, int, tuple[int, ...]]] = []  # (when, data node, iteration, empty stages)
        self.steps_done: dict[tuple[str, int], int] = {}
        self.came_in: list[float] = []
        super().__init__(*args, **kw)

    def _on_open(self, nid: str, it: int) -> None:
        self.opens.append((self.now, nid, it, tuple(self.empty_stages(it))))
        super()._on_open(nid, it)

    def _step_done(self, nid: str, it: int) -> None:
        self.steps_done[(nid, it)] = self.steps_done.get((nid, it), 0) + 1
        super()._step_done(nid, it)

    def _add_node(self, nid: str, stage: int, cap: int, applied: int | None = None) -> None:
        self.came_in.append(self.now)
        super()._add_node(nid, stage, cap, applied)


def _small(policy: str, leave_wait_s: float = LEAVE_WAIT_S, detect_s: float = DETECT_S) -> Recorder:
    """The setting of the machine (module docstring), with a fresh copy of its network."""
    s = Setting("pausing", dict(RELAYS), T.make_setting(SETTING, SEED).net, BASE.data)
    sim = Recorder(s, T.TrainSimOptions(policy=policy, churn=0.0, seed=SEED, rejoin=False, pause_empty=True,
                                        detect_s=detect_s))
    sim.leave_wait_s = leave_wait_s
    return sim


class PausingRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim: Recorder | None = None
        self.quiet_since: float | None = None
        self.losing = 0  # phase frames still to lose
        self.lost_at = 0.0  # when the last one was lost

    @initialize(policy=st.sampled_from(["swarm", "gwtf"]), leave_wait_s=st.sampled_from(LEAVE_WAITS),
                detect_s=st.sampled_from(DETECTS))
    def start(self, policy: str, leave_wait_s: float, detect_s: float) -> None:
        self.sim = _small(policy, leave_wait_s, detect_s)
        self.bound = bound(leave_wait_s, detect_s)
        self.sim.drop = self._drop
        self.sim.run(10**9, until=1.0)
        self.quiet_since = 0.0

    def _drop(self, sender: str, to: str, msg: object) -> bool:
        if self.losing and type(msg) in PHASE_FRAMES:
            self.losing -= 1
            self.lost_at = self.sim.now
            return True
        return False

    # ---- the swarm ---------------------------------------------------------------------
    def _live(self) -> list[str]:
        s = self.sim
        return sorted(r for r in s.nodes if r not in s.data and r not in s.dead)

    def _whole(self) -> bool:
        s = self.sim
        return all(any(s.stage[r] == k and r not in s.leaving for r in self._live()) for k in range(s.S))

    def _check_window(self) -> None:
        """The opens of every live data node in the quiet window [quiet_since, now]: no gap over BOUND."""
        s = self.sim
        if self.quiet_since is None:
            return
        for d in s._live_data():
            marks = [self.quiet_since] + [t for t, n, _, _ in s.opens if n == d and t >= self.quiet_since] + [s.now]
            gap = max(b - a for a, b in zip(marks, marks[1:]))
            SEEN["max_gap"] = max(SEEN["max_gap"], gap)
            assert gap <= self.bound, (
                f"{d} opened nothing for {gap:.0f} s (bound {self.bound:.0f} s) in a quiet window from "
                f"{self.quiet_since:.0f} s with every stage served: paused {s.paused.get(d)}, waits "
                f"{ {n: x.phases.waiting(s.now) for n, x in s.nodes.items() if n not in s.dead and x.phases.waiting(s.now)} }")

    def _churned(self) -> None:
        self._check_window()
        self.quiet_since = self.sim.now if self._whole() and not self.losing else None

    def _run(self, until: float) -> None:
        s = self.sim
        whole = self._whole()
        s.run(10**9, until=until)
        if self.quiet_since is None and self._whole() and not self.losing:
            # joiners came in, the frames to lose are lost: whole and quiet since the later of the two
            self.quiet_since = max([self.lost_at] + (s.came_in[-1:] if not whole else []))
        self._check_window()

    # ---- rules ---------------------------------------------------------------------------
    @precondition(lambda self: len(self._live()) + len(self.sim.joiners) < MAX_RELAYS)
    @rule(stage=st.integers(0, S - 1), loc=st.integers(0, len(LOCS) - 1))
    def join(self, stage: int, loc: int) -> None:
        self.sim.join_relay(stage, LOCS[loc])
        self._churned()

    @precondition(lambda self: self.sim is not None and not self._whole())
    @rule(loc=st.integers(0, len(LOCS) - 1))
    def refill(self, loc: int) -> None:
        """A relay joins every stage that has no live relay that stays (from its checkpoint if it is empty)."""
        s = self.sim
        for k in range(S):
            if not any(s.stage[r] == k and r not in s.leaving for r in self._live()):
                s.join_relay(k, LOCS[loc])
        self._churned()

    @rule(i=st.integers(0, 30))
    def leave(self, i: int) -> None:
        cands = [r for r in self._live() if r not in self.sim.leaving]
        if cands:
            self.sim.leave_relay(cands[i % len(cands)])
            self._churned()

    @rule(i=st.integers(0, 30))
    def crash(self, i: int) -> None:
        cands = self._live()
        if cands:
            self.sim.crash_relay(cands[i % len(cands)])
            self._churned()

    @rule(stage=st.integers(0, S - 1), leave=st.booleans())
    def empty_a_stage(self, stage: int, leave: bool) -> None:
        """Every live relay of `stage` leaves (or crashes) now: the stage is empty, the run pauses."""
        for r in [r for r in self._live() if self.sim.stage[r] == stage]:
            if leave:
                self.sim.leave_relay(r)
            else:
                self.sim.crash_relay(r)
        self._churned()

    @rule(n=st.integers(1, 6))
    def lose_phase_frames(self, n: int) -> None:
        """The next n phase frames (reports, BEGIN, CAN TAKE, acknowledgements) are lost on the wire."""
        self.losing = n
        self._churned()

    @rule(dt=st.sampled_from([10.0, 60.0, 300.0, 1500.0]))
    def advance(self, dt: float) -> None:
        self._run(self.sim.now + dt)

    @rule()
    def into_aggregation(self) -> None:
        """Run until an aggregation is under way (1500 s at most)."""
        s = self.sim
        end = s.now + 1500.0
        while s.now < end and not s._aggregating():
            self._run(s.now + 2.0)

    @precondition(lambda self: self.sim is not None and self._whole())
    @rule()
    def settle(self) -> None:
        """The swarm is whole: run until every live data node opened one more iteration (BOUND + 1 s at most)."""
        s = self.sim
        want = {d: s.nodes[d].rec.iteration + 1 for d in s._live_data()}
        end = s.now + self.bound + 1.0
        while s.now < end and any(s.nodes[d].rec.iteration < it for d, it in want.items() if d not in s.dead):
            self._run(min(end, s.now + 50.0))

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def paused_exactly_while_a_stage_is_empty(self) -> None:
        s = self.sim
        if s is None:
            return
        for d in s._live_data():
            p = s.paused.get(d)
            if p is not None:
                assert p.stages and s.empty_stages(p.iteration), f"{d} paused with every stage served: {p}"
                assert s.nodes[d].phases.iteration == p.iteration, (d, p)
                assert not any(n == d and it == p.iteration for _, n, it, _ in s.opens), (d, p)
            else:
                assert s.nodes[d].phases.iteration == s.nodes[d].rec.iteration, (
                    f"{d}: its phase opened {s.nodes[d].phases.iteration}, its microbatches are in {s.nodes[d].rec.iteration}")
        for _, d, it, empty in s.opens:
            assert not empty, f"{d} opened iteration {it} with stage(s) {empty} empty"

    @invariant()
    def nothing_counted_twice(self) -> None:
        s = self.sim
        if s is None:
            return
        for d in s.data:
            its = [it for _, n, it, _ in s.opens if n == d]
            assert its == list(range(len(its))), f"{d} opened {its}"
            led = s.nodes[d].rec.ledger
            done = led.completed_everywhere()
            assert len(done) == len(set(done)), f"{d}: a microbatch was trained twice"
            for it in range(s.nodes[d].rec.iteration):
                for seq, status in led.entries.get(it, {}).items():
                    assert status in (MbStatus.COMPLETED, MbStatus.DEFERRED), (d, it, seq, status)
        twice = [k for k, v in s.steps_done.items() if v > 1]
        assert not twice, f"steps applied twice: {twice}"

    @invariant()
    def no_silent_wait(self) -> None:
        s = self.sim
        if s is None:
            return
        for n, ph in ((n, x.phases) for n, x in s.nodes.items()):
            if n in s.dead:
                continue
            for w in ph.waiting(s.now):
                if s.now - w.since > ph.wait_bound_s:
                    assert (w.what, w.iteration) in ph.overdue_since, f"{n} waits silently: {w} at {s.now:.1f} s"


PausingRules.TestCase.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)
TestPausingRules = PausingRules.TestCase


def test_an_empty_stage_pauses_the_run_until_a_relay_serves_it() -> None:
    """Stage 2 loses one relay to a crash and the other to a leave: the data nodes finish the iteration in
    flight, then pause (no idle iteration) and say for which stage; a relay back with the stage's checkpoint
    makes them open at once, and the run trains on."""
    sim = _small("swarm")
    sim.run(10**9, until=300.0)
    sim.crash_relay("s2r0")
    sim.leave_relay("s2r1")
    sim.run(10**9, until=5000.0)
    assert [(t, r) for t, r in sim.left] and sim.left[0][1] == "s2r1"
    assert set(sim.paused) == set(sim.data)
    p = sim.paused["d0"]
    assert p.stages == (2,) and sim.nodes["d0"].phases.iteration == p.iteration
    opened = len(sim.opens)
    sim.join_relay(2, BASE.net.loc["s2r0"])
    assert not sim.paused and len(sim.opens) == opened + 2  # both data nodes opened at once
    assert all(t == sim.now and it == p.iteration for t, _, it, _ in sim.opens[-2:])
    sim.run(10**9, until=sim.now + 1500.0)
    assert min(sim.nodes[d].rec.iteration for d in sim.data) >= p.iteration + 2
    assert [(d, it) for d, it, *_ in sim.pauses] == [("d0", p.iteration), ("d1", p.iteration)]


def test_without_the_pause_the_run_goes_on_deferring() -> None:
    """`pause_empty=False` (the older model, not the daemon's): the same empty stage, iterations keep opening."""
    s = Setting("pausing", dict(RELAYS), T.make_setting(SETTING, SEED).net, BASE.data)
    sim = Recorder(s, T.TrainSimOptions(policy="swarm", churn=0.0, seed=SEED, rejoin=False, pause_empty=False))
    sim.run(10**9, until=300.0)
    sim.crash_relay("s2r0")
    sim.crash_relay("s2r1")
    sim.run(10**9, until=8000.0)
    assert not sim.paused and any(empty for *_, empty in sim.opens)


def test_a_leaving_relay_finishes_its_iteration_and_its_aggregation() -> None:
    """A relay that leaves in iteration t takes part in t's aggregation (its step applied), says Goodbye once
    its CAN TAKE is sent, and is not named in any later aggregation."""
    sim = _small("swarm", leave_wait_s=600.0)
    sim.run(10**9, until=100.0)
    t = sim.nodes["s1r0"].phases.applied
    sim.leave_relay("s1r0")
    assert sim.leaving == {"s1r0": t}
    sim.run(10**9, until=2000.0)
    assert ("s1r0", t) in sim.steps_done and "s1r0" in sim.dead and not sim.leaving
    assert not any(("s1r0", i) in sim.steps_done for i in range(t + 1, t + 10))
    later = [sim.nodes["s1r1"].phases.group(i, 1) for i in sorted(sim.nodes["s1r1"].phases.groups) if i > t]
    assert later and all(g == {"s1r1"} for g in later)

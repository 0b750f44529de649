"""Hypothesis: joins, leaves and crashes over the training simulator's phases, joining and pausing machines.

Draft: data collection.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gwtf_node.protocol.pipeline import MbStatus
from gwtf_node.sim import train as T
from gwtf_node.sim.train.setting import Setting

SEED = 0
BASE = T.make_setting("table2-homogeneous", SEED)
RELAYS = {r: v for r, v in BASE.relays.items() if int(r[3]) < 2}  # two relays a stage
LOCS = sorted({BASE.net.loc[r] for r in BASE.relays})
MAX_RELAYS = 12
STATS: dict = {"max_gap": 0.0, "gaps": []}


class Recorder(T.TrainSim):
    """The simulator as it is, with what happened written down (it decides nothing)."""

    def __init__(self, *args, **kw) -> None:
        self.opens: list[tuple[float, str, int, tuple[int, ...]]] = []
        self.steps_done: dict[tuple[str, int], int] = {}
        self.came_in: list[tuple[float, str]] = []
        super().__init__(*args, **kw)

    def _on_open(self, nid: str, it: int) -> None:
        self.opens.append((self.now, nid, it, tuple(self.empty_stages(it))))
        super()._on_open(nid, it)

    def _step_done(self, nid: str, it: int) -> None:
        self.steps_done[(nid, it)] = self.steps_done.get((nid, it), 0) + 1
        super()._step_done(nid, it)

    def _add_node(self, nid, stage, cap, applied=None) -> None:
        self.came_in.append((self.now, nid))
        super()._add_node(nid, stage, cap, applied)


class PausingRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim: Recorder | None = None

    @initialize(policy=st.sampled_from(["swarm", "gwtf"]))
    def start(self, policy: str) -> None:
        s = Setting("pausing", dict(RELAYS), T.make_setting("table2-homogeneous", SEED).net, BASE.data)
        self.sim = Recorder(s, policy, 0.0, SEED, rejoin=False, pause_empty=True)
        self.sim.run(10**9, until=1.0)
        self.churn_at = 0.0
        self.last_open = {d: 0.0 for d in s.data}

    # ---- the swarm ---------------------------------------------------------------------
    def _live(self) -> list[str]:
        s = self.sim
        return sorted(r for r in s.nodes if r not in s.data and r not in s.dead)

    def _whole(self) -> bool:
        s = self.sim
        return all(any(s.stage[r] == k and r not in s.leaving for r in self._live()) for k in range(s.S))

    @precondition(lambda self: len(self._live()) + len(self.sim.joiners) < MAX_RELAYS)
    @rule(stage=st.integers(0, 4), loc=st.integers(0, len(LOCS) - 1))
    def join(self, stage: int, loc: int) -> None:
        self.sim.join_relay(stage, LOCS[loc])
        self.churn_at = self.sim.now

    @rule(i=st.integers(0, 30))
    def leave(self, i: int) -> None:
        cands = [r for r in self._live() if r not in self.sim.leaving]
        if cands:
            self.sim.leave_relay(cands[i % len(cands)])
            self.churn_at = self.sim.now

    @rule(i=st.integers(0, 30))
    def crash(self, i: int) -> None:
        cands = self._live()
        if cands:
            self.sim.crash_relay(cands[i % len(cands)])
            self.churn_at = self.sim.now

    @rule(dt=st.sampled_from([10.0, 60.0, 300.0, 1500.0]))
    def advance(self, dt: float) -> None:
        s = self.sim
        before = s.now
        s.run(10**9, until=s.now + dt)
        # when did the swarm become whole and quiet?
        if self._whole():
            came = [t for t, _ in s.came_in if t >= before]
            quiet = max([self.churn_at] + came)
            for d in s._live_data():
                last = max([t for t, n, _, _ in s.opens if n == d], default=0.0)
                gap = s.now - max(quiet, last)
                STATS["gaps"].append(gap)
                STATS["max_gap"] = max(STATS["max_gap"], gap)

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def paused_exactly_while_a_stage_is_empty(self) -> None:
        s = self.sim
        if s is None:
            return
        for d in s._live_data():
            if d in s.paused:
                assert s.empty_stages(s.paused[d].iteration), (d, s.paused[d])
            else:
                assert s.phases[d].iteration == s.nodes[d].iteration, (d, s.phases[d].iteration, s.nodes[d].iteration)
        for _, d, it, empty in s.opens:
            assert not empty, f"{d} opened iteration {it} with stage(s) {empty} empty"

    @invariant()
    def nothing_counted_twice(self) -> None:
        s = self.sim
        if s is None:
            return
        for d in s.data:
            its = [it for _, n, it, _ in s.opens if n == d]
            assert its == list(range(len(its))), (d, its)
            led = s.nodes[d].ledger
            done = led.completed_everywhere()
            assert len(done) == len(set(done)), "a microbatch was trained twice"
            for it in range(s.nodes[d].iteration):
                for seq, stt in led.entries.get(it, {}).items():
                    assert stt in (MbStatus.COMPLETED, MbStatus.DEFERRED), (d, it, seq, stt)
        assert all(v == 1 for v in s.steps_done.values()), [k for k, v in s.steps_done.items() if v > 1]


PausingRules.TestCase.settings = settings(max_examples=20, stateful_step_count=15, deadline=None)
TestPausingRules = PausingRules.TestCase

"""The step of the aggregation phase in virtual time: the daemon's within-stage all-reduce, then the optimizer step.

The all-reduce follows the daemon's algorithm (`runtime/node/allreduce.py`) on
the simulator's links: owner-based reduce-scatter, then all-gather.  The
members of a stage's group, sorted by id, cut the stage's gradient
(`gradient_mb`) into n parts, part i owned by the i-th member; every member
sends part i to its owner when its step starts (phase 1); an owner that holds
all n parts sends their sum to every other member (phase 2).  Every member
sends and receives 2 (n - 1) / n of the gradient, over n - 1 links at once;
a part takes latency + size / bandwidth on its directed link (the
aggregation comes after the iteration's tensors, so it does not queue behind
them).  A member is done when it holds every summed part; then it applies
the optimizer step (OPTIMIZER_STEP_S) and its step is done.  A group of one
steps on its own gradient at once, as the daemon does.

The group is the one BEGIN AGGREGATION named for the stage without the
members the membership layer reported gone (the daemon's `alive()`); a round
is collective, so members whose groups differ are in different rounds.  A
member that crashes leaves the round stuck if it had not sent its parts or
its summed part had not gone out by then (transfers it started are
delivered); the survivors wait until the membership layer reports it and
redo the round among themselves then (the daemon's `after_gone`: a round
waiting for a gone peer is cancelled and redone with the live members of the
named group).  A named member that does not step (its parameters are out of
step: it resyncs instead) holds its round for the daemon's all-reduce
timeout, ALLREDUCE_TIMEOUT_S, from the moment the round is stuck; the round
is then redone without it (the daemon counts the timeout from the last
payload byte that moved with a member, retries the same group and, failing
again, steps alone: those differences are this model's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import ComputeDone, StepRetry
from .setting import ALLREDUCE_TIMEOUT_S, OPTIMIZER_STEP_S, gradient_mb


@dataclass
class Round:
    """One all-reduce round: a stage's group for an iteration, and when each member started."""

    stage: int
    iteration: int
    group: tuple[str, ...]
    starts: dict[str, float] = field(default_factory=dict)
    sums_out: dict[str, float] = field(default_factory=dict)  # owner -> when its summed part went out
    finish: dict[str, float] = field(default_factory=dict)  # member -> when it holds the whole sum
    stuck: bool = False  # a member crashed before it had done its part: redone at the report


class AllReduceDriver:
    """Part of `TrainSim` (driver.py): one mechanism of the simulator, see the module docstring."""

    def _init_allreduce(self) -> None:
        self._rounds: dict = {}  # allreduce.py: (stage, iteration, group) -> Round
        self._absent: dict[tuple[int, int], set[str]] = {}  # (stage, iteration) -> named members that do not step
        self._agg_pending: dict[str, tuple[float, int, tuple]] = {}

    def _step_group(self, nid: str, it: int) -> tuple[str, ...]:
        stage = self.stage[nid]
        named = self.nodes[nid].phases.group(it, stage)
        named = set(self._known(stage)) if named is None else named
        absent = self._absent.get((stage, it), set())
        return tuple(sorted(p for p in named | {nid} if p == nid or (p not in self.reported_gone and p not in absent)))

    def _start_step(self, nid: str, it: int, at: float | None = None) -> None:
        """`nid` starts the step of iteration `it`: it joins its group's round (its compute queue free)."""
        start = max(self.now if at is None else at, self.nodes[nid].busy_until)
        key = (self.stage[nid], it, self._step_group(nid, it))
        rnd = self._rounds.get(key)
        if rnd is None:
            rnd = self._rounds[key] = Round(key[0], it, key[2])
        rnd.starts[nid] = start
        self.nodes[nid].busy_until = max(self.nodes[nid].busy_until, start)
        self._agg_pending[nid] = (start, None, ("agg", it))  # waiting for its round
        if len(rnd.starts) == len(rnd.group) and not rnd.stuck:
            self._finish_round(rnd)

    def _finish_round(self, rnd: Round) -> None:
        """Every member started: when each holds the sum (the module docstring's two phases), then its step."""
        g, n = rnd.group, len(rnd.group)
        part = gradient_mb(rnd.stage) / n
        for i in g:  # phase 1: the parts of owner i
            rnd.sums_out[i] = max([rnd.starts[i]] + [rnd.starts[j] + self.net.transfer_s(j, i, part)
                                                     for j in g if j != i])
        for j in g:  # phase 2: the summed parts reach j
            rnd.finish[j] = max([rnd.sums_out[j]] + [rnd.sums_out[i] + self.net.transfer_s(i, j, part)
                                                     for i in g if i != j])
            end = rnd.finish[j] + OPTIMIZER_STEP_S
            start = rnd.starts[j]
            self.nodes[j].busy_until = max(self.nodes[j].busy_until, end)
            self._token += 1
            self._agg_pending[j] = (end, self._token, ("agg", rnd.iteration))
            self._push(end, ComputeDone(j, "aggregate", ("agg", rnd.iteration), end - start, start, self._token))

    def _allreduce_crash(self, x: str) -> None:
        """`x` crashed: a round it had not done its part in is stuck (its members' steps wait for the report)."""
        for rnd in self._rounds.values():
            if x not in rnd.group or rnd.stuck:
                continue
            if rnd.finish and rnd.starts[x] <= self.now and rnd.sums_out[x] <= self.now:
                continue  # its parts and its sum went out: the round completes without it
            rnd.stuck = True
            for j in rnd.group:
                pend = self._agg_pending.get(j)
                if j != x and pend is not None and pend[2] == ("agg", rnd.iteration):
                    self._agg_pending[j] = (pend[0], None, pend[2])  # its DONE event is stale now
                    self.nodes[j].busy_until = rnd.starts.get(j, self.now)

    def _allreduce_gone(self, gone: str) -> None:
        """The membership layer reports `gone`: the members of a stuck round with it redo theirs without it."""
        for key, rnd in sorted(self._rounds.items()):
            if gone not in rnd.group or (rnd.finish and not rnd.stuck):
                continue  # (a round that had not started everywhere when it crashed waits for it too)
            del self._rounds[key]
            for j in sorted(rnd.starts):
                if j != gone and j not in self.dead:
                    self._start_step(j, rnd.iteration)

    def _allreduce_absent(self, nid: str, it: int) -> None:
        """BEGIN named `nid` but its parameters are not the iteration's (OutOfStep): it does not step.  A round that
        counts it waits ALLREDUCE_TIMEOUT_S (the daemon's all-reduce timeout), then goes on without it; members
        that start later leave it out at once."""
        stage = self.stage[nid]
        self._absent.setdefault((stage, it), set()).add(nid)
        for key, rnd in sorted(self._rounds.items()):
            if rnd.stage == stage and rnd.iteration == it and nid in rnd.group and not rnd.finish and not rnd.stuck:
                rnd.stuck = True
                self._push(self.now + ALLREDUCE_TIMEOUT_S, StepRetry(key))

    def _allreduce_retry(self, key: tuple) -> None:
        rnd = self._rounds.pop(key, None)
        if rnd is None:
            return
        for j in sorted(rnd.starts):
            if j not in self.dead:
                self._start_step(j, rnd.iteration)

    def _round_done(self, nid: str, token: int) -> bool:
        """A DONE event of `nid`'s step: it is current (not of a round redone since)."""
        pend = self._agg_pending.get(nid)
        if pend is None or pend[1] != token:
            return False
        del self._agg_pending[nid]
        return True

"""The waits of the aggregation phase: what a node waits for, since when, from whom; a wait past its bound.

Theory of operation
-------------------
Every wait of the phase is visible and bounded (`waiting`): a data node's
report waiting for BEGIN (from the leader), the leader waiting for the data
nodes' reports, a step in progress, and a node whose step is applied waiting
for CAN TAKE from the members downstream, each with since when and from
whom.  With `wait_bound_s` set, a timer (`WATCH_TIMER`) checks them: a wait
past its bound yields `Overdue` once (the driver logs it at WARNING with what
it waits for) and, where a resolution exists, does it again every bound: a
report waiting for BEGIN is sent to the leader again; a CAN TAKE that does
not come is asked for by sending BEGIN again to the members it is missing
from (a member that never had it steps; one that had it acknowledges and,
once it sent its CAN TAKE, sends it to the asker again, `Phases.on_begin`).  A member that is gone is
dropped from the wait by `forget` (the membership layer's decision).  The
leader waiting for reports and a step in progress have no resolution here:
the data nodes resend their reports, the all-reduce has its own timeout.

`PhaseWaits` is the part of `phases.Phases` that does this; it reads and
writes the phase's own tables (it is a base class of `Phases`, not a machine
of its own).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Iterable

from .effects import Send, SetTimer
from .messages import BeginAggregation, PhaseKind


@dataclass(frozen=True, slots=True)
class WatchTimer:
    """The timer key of the check of the waits (`check_waits`): one per node, `WATCH_TIMER`."""


WATCH_TIMER = WatchTimer()
WAIT_BOUND_S = 30.0  # the daemon's bound of a phase wait (runtime/node/waits.py: longer for a node whose work is long)


def begin_for(begin: BeginAggregation, stage: int) -> BeginAggregation:
    """BEGIN as a relay passes it on to `stage`: without the groups of the stages before `stage - 1`, which
    nobody from there on reads (a member reads its own stage's group, the one before it (whom it sends CAN
    TAKE) and the ones after it (whom it passes BEGIN and waits for); the data nodes' group stays, a relay
    counts only their microbatches).  So BEGIN shrinks as it travels instead of carrying every member of the
    swarm to every relay."""
    keep = tuple(g for g in begin.groups if g.stage == -1 or g.stage >= stage - 1)
    return begin if len(keep) == len(begin.groups) else replace(begin, groups=keep)


class WaitKind(enum.StrEnum):
    """What a node of the phase waits for (its value is the word status.json and the logs show)."""

    BEGIN = "begin"  # a data node's report waits for BEGIN AGGREGATION from the leader
    REPORTS = "reports"  # the leader waits for the data nodes' reports
    STEP = "step"  # a step in progress
    CAN_TAKE = "can_take"  # a node whose step is applied waits for CAN TAKE from the members downstream


@dataclass(frozen=True, slots=True)
class Wait:
    """Something this node waits for: `what` of `iteration`, since `since`, from the peers `peers` (empty: nobody
    in particular)."""

    what: WaitKind
    iteration: int
    since: float
    peers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Overdue:
    """`wait` passed its bound (`Phases.wait_bound_s`); `resolution` says what is done about it ("" if nothing)."""

    wait: Wait
    resolution: str = ""


WaitEffect = Send | SetTimer | Overdue
"""Every effect the check of the waits returns (a part of `phases.PhaseEffect`)."""


class PhaseWaits:
    """The waits of `phases.Phases` (module doc)."""

    def _downstream(self, iteration: int, next_stage: Iterable[str] = ()) -> set[str]:
        """Whose CAN TAKE of `iteration` this node waits for: with BEGIN's groups, the members the leader named
        (a relay: its children among them, phasefan.py), else the next stage it knows."""
        groups = self.groups.get(iteration)
        if groups is None:
            return set(next_stage) - self.gone
        kids = None if self.is_data else self._children(iteration)
        return groups.get(0 if self.is_data else self.stage + 1, set()) if kids is None else kids

    def _downstream_missing(self, iteration: int, next_stage: Iterable[str] = ()) -> tuple[str, ...]:
        heard = self.can_take_from.get(iteration, set())
        return tuple(sorted(self._downstream(iteration, next_stage) - heard - self.gone))

    def waiting(self, now: float) -> list[Wait]:
        """What this node's phase waits for now, the oldest first."""
        out: list[Wait] = []
        if self.is_data:
            for it, at in self.reported_at.items():
                if it not in self.begun and self.leader is not None and self.leader != self.me:
                    out.append(Wait(WaitKind.BEGIN, it, at, (self.leader,)))
            if self.leader == self.me:
                for it in self.pending_iterations():
                    reports = self.done_reports.get(it, {})
                    missing = tuple(d for d in self.expected.get(it, ()) if d not in reports and d not in self.gone)
                    if missing:
                        out.append(Wait(WaitKind.REPORTS, it, self.reported_at.get(it, now), missing))
        for it, at in self.step_at.items():
            if it not in self.stepped and it in self.begun:
                out.append(Wait(WaitKind.STEP, it, at))
        for it, at in self.stepped_at.items():
            done = it + 1 in self.opened if self.is_data else it in self.can_take_sent
            if done or (not self.is_data and self.stage == self.last_stage):
                continue
            missing = self._downstream_missing(it)
            if missing:
                out.append(Wait(WaitKind.CAN_TAKE, it, at, missing))
        return sorted(out, key=lambda w: (w.since, w.iteration, w.what))

    def _watch(self, now: float) -> list[WaitEffect]:
        """Set the watch timer if a wait may pass its bound before it fires (none with `wait_bound_s` None)."""
        if self.wait_bound_s is None:
            return []
        due = now + self.wait_bound_s
        if self.watch_at is not None and self.watch_at <= due:
            return []
        self.watch_at = due
        return [SetTimer(WATCH_TIMER, due)]

    def check_waits(self, now: float) -> list[WaitEffect]:
        """The watch timer: every wait past `wait_bound_s` yields `Overdue` once and its resolution (module doc)
        again every bound; the timer is set again while anything is waited for."""
        if self.wait_bound_s is None:
            return []
        bound = self.wait_bound_s
        eff: list[WaitEffect] = []
        waits = self.waiting(now)
        live = {(w.what, w.iteration) for w in waits}
        self.overdue_since = {k: v for k, v in self.overdue_since.items() if k in live}
        next_due: float | None = None
        for w in waits:
            key = (w.what, w.iteration)
            last = self.overdue_since.get(key)
            due = w.since + bound if last is None else last + bound
            if now < due:
                next_due = due if next_due is None else min(next_due, due)
                continue
            resolution, acts = self._resolve(now, w)
            if last is None:
                self.stats.overdue += 1
                eff.append(Overdue(w, resolution))
            eff += acts
            self.overdue_since[key] = now
            next_due = now + bound if next_due is None else min(next_due, now + bound)
        if next_due is not None:
            self.watch_at = next_due
            eff.append(SetTimer(WATCH_TIMER, next_due))
        return eff

    def _resolve(self, now: float, w: Wait) -> tuple[str, list[WaitEffect]]:
        if w.what is WaitKind.BEGIN:
            report = self.my_reports.get(w.iteration)
            if report is None or self.leader is None:
                return "", []
            return "report sent to the leader again", self._send(now, PhaseKind.DONE, w.iteration, self.leader,
                                                                 report)
        if w.what is WaitKind.CAN_TAKE:
            begin = self.begin_msgs.get(w.iteration)
            if begin is None:
                return "", []
            eff: list[WaitEffect] = []
            out = begin if self.is_data else begin_for(begin, self.stage + 1)
            for p in w.peers:
                eff += self._send(now, PhaseKind.BEGIN, w.iteration, p, out)
            return "BEGIN AGGREGATION sent to them again", eff
        return "", []


def peers_at_work(phases, t: float, stage: int | None) -> set[str]:
    """The peers a node's aggregation phase (`phases.Phases`) works with at `t`: those its waits name, and its
    stage's group in the aggregations begun and not stepped there (their all-reduce; the liveness check watches
    them closely: runtime/node/liveness.py, and the simulator's `_idle_watchers`).

    The group counts only once this node has stepped after an all-reduce (`PhaseStats.steps`).  Its first
    aggregation opens a tensor channel to every stage-mate while every other relay of the swarm does the same,
    with its first checkpoint and step, and nothing measured yet scales a deadline with that: at 100 daemons on
    two cores, 93 stage-mates were presumed dead in the first aggregation, 5 in the 27 after it.  So the first
    time, a stage-mate is watched loosely unless its connection closes (a crashed process closes its connections:
    it is watched closely from then, and found as quickly as before)."""
    out = {p for w in phases.waiting(t) for p in w.peers}
    for it in phases.begun - phases.stepped if stage is not None and phases.stats.steps else ():
        out |= phases.group(it, stage) or set()
    return out

"""Who passes BEGIN AGGREGATION to whom, and whom CAN TAKE goes back to: a bounded fan-out between two stages.

Theory of operation
-------------------
Passed from every member of stage k to every member of stage k+1, BEGIN costs
each relay a copy and its acknowledgement per member of the next stage, and
CAN TAKE as much back: per node, per iteration, a number of control frames
that grows with the relays per stage.  Instead every member of stage k+1 has
`fan_out` parents in stage k: the members of stage k with the highest rank
for it (`rank`, a hash of the two peer ids: rendezvous hashing), among the
members BEGIN names for stage k that the node computing it does not hold
gone.  Every node computes the same parents from the same BEGIN, so a stage-k
relay knows, without a message, which members of stage k+1 it passes BEGIN
to (its children) and a stage-(k+1) relay which members of stage k it sends
CAN TAKE to (its parents).

Why CAN TAKE still means what it meant.  A relay sends CAN TAKE once its step
is applied and each of its children said CAN TAKE; a data node opens the next
iteration once every stage-0 member said it.  Every member of stage k+1 has
a parent in stage k that waits for it, so by induction from stage 0 every
member of every stage has applied its step when a data node opens the next
iteration: the guarantee of waiting for every downstream member
(`phases.CanTakeRule.ALL`), with `fan_out` signals per node instead of a
stage's worth.

A parent that crashes or leaves.  With `fan_out` 2 a child still hears BEGIN
from its other parent.  When a node forgets a peer (`Phases.forget`), the
parents are computed again without it: a stage-k relay that has become a
parent passes BEGIN to its new children and waits for their CAN TAKE, and a
relay whose CAN TAKE went to a parent now gone sends it to the new one.  Where
two nodes' views differ (one holds a peer gone that the other does not: a
false death on a loaded machine), a relay may be a parent by its own view and
not by its child's: it passed the child BEGIN, so the child sends CAN TAKE to
its parents and to every named member of the stage before that passed it
BEGIN, and answers a BEGIN that comes after its CAN TAKE with it
(`_can_take_again`).  A parent by its own view never waits for the bound of
the waits (`phasewaits.py`), which at 100 daemons cost 30 s a stage.

`fan_out=None` (`Phases`; `gwtf-node sim train --phase-fan-out 0`) passes
BEGIN to every member of the next stage and CAN TAKE to every member of the
stage before.  Pure: a hash of the ids, no randomness.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

from .effects import Send, SetTimer
from .messages import CanTake, PhaseKind
from .phasewaits import begin_for

FAN_OUT = 2  # parents per member of a stage (module doc): the daemon's and the simulator's default


def rank(child: str, parent: str) -> bytes:
    """The rank of `parent` for `child` (highest first): a hash of both ids, the same on every node."""
    return hashlib.blake2b(f"{child}\x00{parent}".encode(), digest_size=8).digest()


def parents(child: str, candidates: Iterable[str], fan_out: int) -> frozenset[str]:
    """The `fan_out` members of `candidates` (a stage's members) of the highest rank for `child`."""
    ranked = sorted(set(candidates) - {child}, key=lambda p: rank(child, p), reverse=True)
    return frozenset(ranked[:fan_out])


def children(me: str, my_stage: Iterable[str], next_stage: Iterable[str], fan_out: int) -> set[str]:
    """The members of `next_stage` whose parents among `my_stage` (the members of `me`'s stage) include `me`."""
    mine = set(my_stage)
    return {c for c in next_stage if me in parents(c, mine, fan_out)}


class PhaseFan:
    """The part of `phases.Phases` that computes a relay's children and parents for an iteration and passes the
    phase signals to them (it reads and writes the phase's own tables: a base class, not a machine of its own)."""

    @property
    def can_take_sent(self):
        """The iterations whose CAN TAKE this relay sent (the keys of `can_take_to`)."""
        return self.can_take_to.keys()

    def _children(self, it: int) -> set[str] | None:
        """The members of the next stage this relay passes BEGIN of `it` to and waits for (phasefan.py); None
        where that is every member (no fan-out, no groups, or this relay is not in its stage's group)."""
        g = self.groups.get(it)
        if self.fan_out is None or g is None or self.me not in g.get(self.stage, ()):
            return None
        return children(self.me, g[self.stage], g.get(self.stage + 1, ()), self.fan_out)

    def _parents(self, it: int) -> frozenset[str] | None:
        """The members of the stage before that this relay sends CAN TAKE of `it` to (phasefan.py); None where
        that is every member (no fan-out, no groups, or nobody of that stage is left in BEGIN's group)."""
        g = self.groups.get(it)
        if self.fan_out is None or g is None or self.stage <= 0 or not g.get(self.stage - 1):
            return None
        return parents(self.me, g[self.stage - 1], self.fan_out)

    def _pass_begin(self, now: float, it: int, to: Iterable[str]) -> list[Send | SetTimer]:
        sent = self.passed.setdefault(it, set())
        out = begin_for(self.begin_msgs[it], self.stage + 1)
        eff: list[Send | SetTimer] = []
        for r in sorted(set(to) - self.gone - {self.me} - sent):
            sent.add(r)
            eff += self._send(now, PhaseKind.BEGIN, it, r, out)
        return eff

    def _tell_can_take(self, now: float, it: int, to: Iterable[str]) -> list[Send | SetTimer]:
        sent = self.can_take_to.setdefault(it, set())
        eff: list[Send | SetTimer] = []
        for p in sorted(set(to) - self.gone - {self.me} - sent):
            sent.add(p)
            eff += self._send(now, PhaseKind.CAN_TAKE, it, p, CanTake(it, self.stage))
        return eff

    def _can_take_again(self, now: float, sender: str, iteration: int) -> list[Send | SetTimer]:
        """A duplicate BEGIN from `sender` after this relay sent its CAN TAKE: the sender is upstream and asks for
        the CAN TAKE it misses (`phasewaits.py`).  Resent while not acknowledged, also where this node held the
        sender gone when it sent it (left out then, a false death) and where it was acknowledged already (lost
        after the ack: the sender would not ask)."""
        if self.is_data or iteration not in self.can_take_sent or sender == self.me:
            return []
        self.stats.resent += 1
        return self._send(now, PhaseKind.CAN_TAKE, iteration, sender, CanTake(iteration, self.stage))

"""Stage copies that stepped apart: which copy every member keeps.

The copies of a stage stay identical because every member of the stage's
all-reduce adds the same sums in the same order (runtime/node/allreduce.py).  A
round that loses a member is redone among the survivors, and each member
decides for itself who survived: a member it forgot since the round began
stays out (runtime/node/aggregation.py).  Two members can therefore decide
differently: one forgot the other (presumed dead under load, a restart, a
partition), or both forgot each other, and each sums a group of its own.
Both step, and from that step on their parameters differ; every later
round adds the same sums to two different states, so nothing closes the
gap by itself.

Every relay therefore keeps a short record of how each of its recent steps
was summed: a `RoundOf` (the count of contributions the step divided by, and
the sorted members of the round that summed them), keyed by the steps the
state holds after that step.  A state handed to another node travels with
its records (StageState `rounds`), so the records always describe the
history of the parameters they sit beside.

When a relay stepped in a round that left out a member the leader named, or
when a stage peer it had presumed dead says Hello again at its own step, it
asks that peer for its steps, parameter hash and records (a hash-only
StageStateRequest) and `decide`s:

* different steps: `WAIT` (one of them is stepping; ask again);
* the same hash: `SAME`;
* different hashes: the first step at which their records name different
  rounds is where they parted; the copy whose round there ranks higher is
  kept (`KEEP`), the other copy is replaced by a download (`YIELD`).  The
  rank is the count summed (the copy that holds more of the iteration's
  gradient), then the round's size, then the sorted member list
  (lexicographically smaller first): a total order both sides compute alike,
  so exactly one of them yields, and members that summed together rank
  alike;
* different hashes and no record that tells them apart (records older than
  `KEEP_ROUNDS` steps, a state restored from a checkpoint): the caller's
  fallback, which is `YIELD` for a node that was cut off from every data
  node meanwhile (it was the one away from the run: runtime/node/cutcheck.py)
  and `KEEP` otherwise.

Pure: no I/O, clocks or randomness.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .messages import RoundRecord

KEEP_ROUNDS = 64  # the records a relay keeps (and sends): its last steps


@dataclass(frozen=True, slots=True)
class RoundOf:
    """How one step was summed: the count divided by, and the sorted members of the round."""

    count: float
    members: tuple[str, ...]


def ranks_higher(a: RoundOf, b: RoundOf) -> bool:
    """True if the copy stepped in round `a` is kept over the one stepped in round `b` (module doc: more
    contributions, then a larger round, then the smaller sorted member list)."""
    if a.count != b.count:
        return a.count > b.count
    if len(a.members) != len(b.members):
        return len(a.members) > len(b.members)
    return a.members < b.members


class Verdict(enum.Enum):
    SAME = "same"  # identical parameters: nothing to do
    KEEP = "keep"  # they differ and this copy is kept: the peer downloads it
    YIELD = "yield"  # they differ and the peer's copy is kept: this node downloads it
    WAIT = "wait"  # different steps: not comparable now


@dataclass(frozen=True, slots=True)
class Copy:
    """One member's copy of the stage: steps applied, parameter hash, records by steps."""

    steps: int
    params_sha256: str
    rounds: dict[int, RoundOf]


def parted_at(mine: dict[int, RoundOf], theirs: dict[int, RoundOf]) -> int | None:
    """The first steps at which both hold a record and the records name different rounds (None: none)."""
    for s in sorted(set(mine) & set(theirs)):
        if mine[s].members != theirs[s].members:
            return s
    return None


def decide(mine: Copy, theirs: Copy, fallback: Verdict) -> tuple[Verdict, int | None]:
    """(verdict, the steps at which the copies parted, if a record says) for this node's copy against a peer's."""
    if mine.steps != theirs.steps:
        return Verdict.WAIT, None
    if mine.params_sha256 == theirs.params_sha256:
        return Verdict.SAME, None
    at = parted_at(mine.rounds, theirs.rounds)
    if at is None:
        return fallback, None
    return (Verdict.KEEP if ranks_higher(mine.rounds[at], theirs.rounds[at]) else Verdict.YIELD), at


def from_records(records: tuple[RoundRecord, ...], up_to: int | None = None) -> dict[int, RoundOf]:
    """A StageState's round records by steps (those up to `up_to` steps, if given), the last KEEP_ROUNDS."""
    return trim({r.steps: RoundOf(r.count, tuple(r.members)) for r in records if up_to is None or r.steps <= up_to})


def to_records(rounds: dict[int, RoundOf], up_to: int) -> tuple[RoundRecord, ...]:
    """The records of the steps up to `up_to`, in order, as a StageState carries them."""
    return tuple(RoundRecord(s, r.count, r.members) for s, r in sorted(rounds.items()) if s <= up_to)


def trim(rounds: dict[int, RoundOf]) -> dict[int, RoundOf]:
    """The last KEEP_ROUNDS records."""
    if len(rounds) <= KEEP_ROUNDS:
        return rounds
    return {s: rounds[s] for s in sorted(rounds)[-KEEP_ROUNDS:]}

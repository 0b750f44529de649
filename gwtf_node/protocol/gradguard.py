"""Outlier contributions to a stage's all-reduce: which ones a part's owner leaves out of the sum.

Every member of a stage sends each part owner its slice of the gradient sum
and its microbatch count (runtime/node/allreduce.py).  One member with a huge
gradient (a bug, a bit flip, or a hostile member) would move every copy of
the stage as far as it likes, since the update is the mean.  The owner of a
part therefore judges each contribution to its part before summing: the
*rate* of a contribution is the root mean square of its slice per
microbatch, `||slice|| / sqrt(len(slice)) / count`, which does not grow with
the number of microbatches a member carried nor with the slice's length.
A contribution is refused when

* its count is outside [0, the microbatches of the iteration] (a member
  cannot have carried more than were completed; an inflated count would
  shrink everybody's step), or
* its count is 0 but its slice is not all zeros (a member that carried no
  microbatch has nothing to add), or
* its rate exceeds `OUTLIER_FACTOR` times the reference: the median of the
  last `HISTORY_ROUNDS` accepted rates of this slice.  During warm-up (fewer
  than `WARMUP_ROUNDS` rounds in the history of this slice) the reference is
  the median of the round's own rates if the round has at least
  `MIN_ROUND_FOR_MEDIAN` contributions, and nothing is refused by rate
  otherwise (two members alone cannot tell which of them is the outlier).

Accepted rates enter the history; refused ones never do, so a member that
keeps sending huge gradients cannot drag the reference up.  The history is
the owner's own and is keyed by the slice (its bounds in the flat vector):
when the group changes the slices change and the warm-up starts again.  Every
member copies the owner's sum of its part (allreduce.py), so copies stay
identical whatever each owner decides; a refused contribution is treated as
one lost with a relay: the part's mean is over the contributions accepted
(the survivors' mean, recovery/).

What this does not do: a hostile *owner* of a part decides that part's sum
alone (see docs/security.md).  This module is pure: numbers in,
decisions out.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# A stage's honest gradient rates swing widely while it trains, most in the slices
# that hold the token embedding, whose rows get a gradient only from the tokens a
# microbatch holds: the default model with two data nodes (seq_len 16, 4
# microbatches each) saw one data node's embedding slice at 2,450 times the median
# of its recent history and 3,500 times the other data node's in the same round
# (iteration 15: a factor of 1000 refuses that honest contribution, and the run
# departs from the centralized reference).  Ten thousand times the recent median is
# the bound here; what passes below it is bounded by the step itself
# (`grad_clip_norm`, and one optimizer step per iteration).
OUTLIER_FACTOR = 10_000.0
# Accepted rates remembered per slice: enough for a stable median, short enough
# to follow the decay of gradient norms during training.
HISTORY_ROUNDS = 8
# Rounds of a slice before its history alone is the reference.
WARMUP_ROUNDS = 2
# A round's own median is a reference only with at least this many contributions
# (with two, either one could be the outlier).
MIN_ROUND_FOR_MEDIAN = 3


@dataclass(frozen=True)
class Contribution:
    sender: str
    count: float  # microbatches it carried
    sq_norm: float  # squared L2 norm of its slice
    length: int  # floats in the slice


@dataclass(frozen=True)
class Verdict:
    refused: dict[str, str]  # sender -> why, one line with the numbers

    def accepted(self, senders: list[str]) -> list[str]:
        return [s for s in senders if s not in self.refused]


def rate(c: Contribution) -> float:
    """Root mean square of the slice per microbatch (0 for an empty slice or no microbatch)."""
    if c.count <= 0 or c.length == 0:
        return 0.0
    return (c.sq_norm / c.length) ** 0.5 / c.count


@dataclass
class GradGuard:
    """One node's judge of the contributions to the parts it owns (history per slice)."""

    history: dict[tuple[int, int, int], deque] = field(default_factory=dict)  # (lo, hi, length) -> rates
    rounds: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def judge(self, slot: tuple[int, int, int], contribs: list[Contribution], max_count: float | None) -> Verdict:
        """Which contributions to the slice `slot` = (lo, hi, vector length) are left out, and why."""
        refused: dict[str, str] = {}
        for c in contribs:
            if c.count < 0 or (max_count is not None and c.count > max_count):
                refused[c.sender] = f"count {c.count:g} outside [0, {max_count:g}] microbatches of the iteration"
            elif c.count == 0 and c.sq_norm > 0:
                refused[c.sender] = f"no microbatch but a gradient of norm {c.sq_norm ** 0.5:.3g}"
        hist = self.history.setdefault(slot, deque(maxlen=HISTORY_ROUNDS))
        live = [c for c in contribs if c.sender not in refused and c.count > 0]
        ref = None
        if self.rounds.get(slot, 0) >= WARMUP_ROUNDS and hist:
            ref = statistics.median(hist)
        elif len(live) >= MIN_ROUND_FOR_MEDIAN:
            ref = statistics.median(rate(c) for c in live)
        for c in live:
            r = rate(c)
            if ref and r > OUTLIER_FACTOR * ref:  # (a slice whose gradients were all 0 has no scale to judge by)
                refused[c.sender] = (f"gradient rate {r:.3g} per microbatch is over {OUTLIER_FACTOR:g} x the "
                                     f"reference {ref:.3g} (median of recent accepted contributions)")
        for c in live:
            if c.sender not in refused:
                hist.append(rate(c))
        self.rounds[slot] = self.rounds.get(slot, 0) + 1
        return Verdict(refused)

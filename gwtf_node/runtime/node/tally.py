"""What this node's microbatches came to since it started: completed, deferred, lost, loss, useful and wasted compute.

The dashboard and the Prometheus counters read these totals (status.py,
metrics.py); the recovery machine's own counters (reroutes, probes, ...) are
in `Microbatches.stats()`.

Counting.  A *data node* counts its own microbatches once per iteration,
when they are all settled (the figures of its IterationDone): completed end
to end, deferred to the next iteration, and lost (neither: still pending or
in flight when the iteration closed, which must stay 0).  Its loss is the
mean over its completed microbatches of that iteration.  A *relay* counts
the contributions it adds to its stage's all-reduce (the microbatches whose
backward it computed and that count, named at BEGIN AGGREGATION); deferral
and loss are decided by the data nodes, so a relay has none to count.

Wasted compute.  `LocalStage.compute` adds the seconds of each stage
computation to its microbatch key (`key_compute_s`).  When an iteration is
settled here (a data node: its microbatches settled; a relay: BEGIN
AGGREGATION named its contributions), the seconds of every key of that
iteration or an earlier one move out of that table: to *useful* if the key
counted (a data node: completed; a relay: a contribution), else to *wasted*
(a dead attempt, a microbatch deferred after work was done on it, a
recomputation elsewhere that did not count here).  Work that ends after its
iteration was settled is wasted at the next settlement.  A key counts as a
whole: on a relay, an earlier dead attempt of a microbatch that later
counted on the same relay is counted as useful (both attempts share the
key), so the waste is a lower bound there.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    key_compute_s: dict[tuple, float]  # the stage's table (LocalStage.key_compute_s), emptied here
    completed: int = 0
    deferred: int = 0
    lost: int = 0
    contributions: int = 0  # a relay: microbatches counted in its stage's all-reduce
    useful_compute_s: float = 0.0
    wasted_compute_s: float = 0.0
    last_iteration: int | None = None  # the last iteration settled here
    last_loss: float | None = None  # a data node: mean loss of its completed microbatches of that iteration
    losses: dict[int, float] = field(default_factory=dict)  # iteration -> that loss (the newest few)

    def data_settled(self, iteration: int, me: str, counts: dict[str, int], done: dict[int, float]) -> None:
        """A data node's microbatches of `iteration` are settled: `done` maps each completed seq to its loss."""
        self.completed += len(done)
        self.deferred += counts.get("deferred", 0)
        self.lost += counts.get("pending", 0) + counts.get("inflight", 0)
        if done:
            self.last_loss = sum(done[s] for s in sorted(done)) / len(done)
            self.losses[iteration] = self.last_loss
            for old in sorted(self.losses)[:-16]:
                del self.losses[old]
        self._settle(iteration, {(me, seq, iteration) for seq in done})

    def relay_counted(self, iteration: int, contributions: frozenset) -> None:
        """A relay at BEGIN AGGREGATION of `iteration`: the microbatch keys it adds to the all-reduce."""
        self.contributions += len(contributions)
        self._settle(iteration, set(contributions))

    def _settle(self, iteration: int, counted: set) -> None:
        self.last_iteration = iteration if self.last_iteration is None else max(self.last_iteration, iteration)
        for key in [k for k in list(self.key_compute_s) if k[2] <= iteration]:
            seconds = self.key_compute_s.pop(key)
            if key in counted:
                self.useful_compute_s += seconds
            else:
                self.wasted_compute_s += seconds

    def to_json(self, role: str) -> dict:
        data = role == "data"
        return {
            "completed": self.completed if data else self.contributions,
            "deferred": self.deferred if data else None,
            "lost": self.lost if data else None,
            "useful_compute_s": round(self.useful_compute_s, 4),
            "wasted_compute_s": round(self.wasted_compute_s, 4),
        }

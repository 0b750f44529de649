"""Training phases of a run, as pure bookkeeping (section V-E of the paper).

Theory of operation
-------------------
An *iteration* is one batch: every data node pushes its microbatches into the
pipeline along the flows that the flow machines (`flow/`) formed.  Units of
flow are microbatch *slots*: a data node keeps at most `out[d][j]` of its
microbatches in flight through next hop j, and a relay that receives a
microbatch of data node d picks a next hop among its own outflows of d the
same way (`pick_next_hop`).  When a slot frees (the microbatch came back) the
next waiting microbatch takes it, so a data node whose demand exceeds the
flow it was granted still finishes its iteration, in waves.

When a data node's microbatches of the iteration are all settled, the
aggregation phase follows (BEGIN AGGREGATION front to back, CAN TAKE back to
front): `phases.py`, re-exported here (`Phases`, `StartStep`, ...).

This module keeps the microbatch bookkeeping: the choice of a next hop among
free units (`pick_next_hop`, `fallback_hop`), a data node's `Ledger` of every
microbatch's status per iteration and `DataIteration`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .phases import CanTakeRule, LeftOut, OpenIteration, OutOfStep, Phases, StartStep

__all__ = ["CanTakeRule", "DataIteration", "Ledger", "LeftOut", "MbStatus", "OpenIteration", "OutOfStep", "Phases",
           "StartStep", "fallback_hop", "pick_next_hop"]


class MbStatus(enum.Enum):
    PENDING = "pending"  # not pushed yet in this iteration
    INFLIGHT = "inflight"  # pushed, its backward pass has not come back
    COMPLETED = "completed"  # forward and backward done end to end
    DEFERRED = "deferred"  # given up in this iteration, queued for the next


def pick_next_hop(
    flow_out: Mapping[str, int],
    inflight: Mapping[str, int],
    costs: Mapping[str, float] | Mapping[str, tuple[float, float]],
    alive: Iterable[str] | None = None,
) -> str | None:
    """The cheapest next hop that still has a free unit of flow, or None.

    `costs` may be any ordered keys (a data node ranks its units by measured round trip, then link cost).

    `flow_out[j]` units of flow go to j; `inflight[j]` microbatches are on
    their way through j.  Ties break on the peer id so every run is repeatable.
    """
    ok = set(alive) if alive is not None else None
    best: tuple[float, str] | None = None
    for j, units in flow_out.items():
        if units - inflight.get(j, 0) <= 0 or (ok is not None and j not in ok):
            continue
        key = (costs.get(j, float("inf")), j)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def fallback_hop(costs: Mapping[str, float], inflight: Mapping[str, int]) -> str | None:
    """With no flow of this commodity here (flows still forming): the least loaded, then cheapest, next hop."""
    if not costs:
        return None
    return min(costs, key=lambda j: (inflight.get(j, 0), costs[j], j))


@dataclass
class Ledger:
    """A data node's record of every microbatch, per iteration (`iteration -> seq -> status`)."""

    entries: dict[int, dict[int, MbStatus]] = field(default_factory=dict)

    def add(self, iteration: int, seqs: Iterable[int]) -> None:
        row = self.entries.setdefault(iteration, {})
        for s in seqs:
            if s in row:
                raise ValueError(f"microbatch {s} is already in the ledger of iteration {iteration}")
            row[s] = MbStatus.PENDING

    def mark(self, iteration: int, seq: int, status: MbStatus) -> None:
        row = self.entries.get(iteration)
        if row is None or seq not in row:
            raise KeyError(f"microbatch {seq} is not in the ledger of iteration {iteration}")
        if row[seq] is MbStatus.COMPLETED and status is not MbStatus.COMPLETED:
            raise ValueError(f"microbatch {seq} of iteration {iteration} is already completed")
        row[seq] = status

    def status(self, iteration: int, seq: int) -> MbStatus:
        return self.entries[iteration][seq]

    def counts(self, iteration: int) -> dict[str, int]:
        out = {s.value: 0 for s in MbStatus}
        for st in self.entries.get(iteration, {}).values():
            out[st.value] += 1
        return out

    def completed_everywhere(self) -> list[int]:
        """Every seq completed in any iteration (a seq must appear at most once: trained once)."""
        return [s for row in self.entries.values() for s, st in row.items() if st is MbStatus.COMPLETED]


@dataclass
class DataIteration:
    """One data node's microbatches of one iteration: which wait, which fly where, which are done."""

    iteration: int
    seqs: list[int]
    waiting: list[int] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)  # seq -> first hop, while in flight
    done: dict[int, float] = field(default_factory=dict)  # seq -> loss

    def __post_init__(self) -> None:
        self.waiting = list(self.seqs)

    def inflight_per_hop(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.where.values():
            out[j] = out.get(j, 0) + 1
        return out

    def launchable(
        self, flow_out: Mapping[str, int], costs: Mapping[str, float], *, flows_formed: bool
    ) -> list[tuple[int, str]]:
        """(seq, first hop) of every waiting microbatch that can go now; marks them in flight."""
        out: list[tuple[int, str]] = []
        while self.waiting:
            inflight = self.inflight_per_hop()
            hop = pick_next_hop(flow_out, inflight, costs)
            if hop is None and not flows_formed and not self.where:
                hop = fallback_hop(costs, inflight)  # no flow at all yet: one at a time
            if hop is None:
                break
            seq = self.waiting.pop(0)
            self.where[seq] = hop
            out.append((seq, hop))
        return out

    def complete(self, seq: int, loss: float) -> bool:
        """Record that `seq` finished its backward pass; False if it was not in flight here."""
        if seq not in self.where:
            return False
        del self.where[seq]
        self.done[seq] = loss
        return True

    @property
    def finished(self) -> bool:
        return not self.waiting and not self.where

    @property
    def loss_sum(self) -> float:
        return sum(self.done[s] for s in sorted(self.done))

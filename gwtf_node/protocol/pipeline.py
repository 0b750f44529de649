"""Training phases of a run, as pure bookkeeping (section V-E of the paper).

Theory of operation
-------------------
An *iteration* is one batch: every data node pushes its microbatches into the
pipeline along the flows that the flow machines (`flow.py`) formed.  Units of
flow are microbatch *slots*: a data node keeps at most `out[d][j]` of its
microbatches in flight through next hop j, and a relay that receives a
microbatch of data node d picks a next hop among its own outflows of d the
same way (`pick_next_hop`).  When a slot frees (the microbatch came back) the
next waiting microbatch takes it, so a data node whose demand exceeds the
flow it was granted still finishes its iteration, in waves.

When a data node has completed all its microbatches of the iteration it
tells the leader (`IterationDone`).  The leader, once it heard from every
data node, opens the aggregation phase: `BeginAggregation` goes to every data
node and to the relays of stage 0, and each relay passes it on to the relays
of the next stage it knows (front to back).  Every relay then all-reduces
its gradient sum and microbatch count with the relays of its stage and
applies the optimizer step; data nodes do the same among themselves for the
embedding and the head.  `CanTake` travels back to front: the last stage
sends it as soon as its step is applied, stage k once its own step is done
*and* every relay of stage k+1 it knows said CanTake, the data node opens the
next iteration once its own step is done and every stage-0 relay said
CanTake.  So no microbatch of iteration t+1 meets a parameter of iteration t.

Everything here is a pure function of the events handed in; the daemon
(`runtime/node.py`) executes the effects: `Send` a control message,
`StartStep` (all-reduce then optimizer step, in torch), `OpenIteration`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .effects import Send
from .messages import BeginAggregation, CanTake, IterationDone, StageMembers


class MbStatus(enum.Enum):
    PENDING = "pending"  # not pushed yet in this iteration
    INFLIGHT = "inflight"  # pushed, its backward pass has not come back
    COMPLETED = "completed"  # forward and backward done end to end
    DEFERRED = "deferred"  # given up in this iteration, queued for the next


@dataclass(frozen=True, slots=True)
class StartStep:
    """All-reduce the gradient sums of `group` and apply the optimizer step of `iteration`."""

    iteration: int
    microbatches: int  # completed end to end in the iteration, all data nodes


@dataclass(frozen=True, slots=True)
class LeftOut:
    """BEGIN AGGREGATION of `iteration` does not count this node in: its state falls behind; resync it."""

    iteration: int


@dataclass(frozen=True, slots=True)
class OpenIteration:
    """The previous iteration's steps are applied everywhere: push the microbatches of `iteration`."""

    iteration: int


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


class Phases:
    """One node's view of the aggregation phase (BEGIN AGGREGATION front to back, CAN TAKE back to front).

    `stage` is the relay's stage, or -1 for a data node; `last_stage` is S-1.
    Peers are given as the ids this node knows; the caller keeps them current.
    """

    def __init__(self, me: str, stage: int, last_stage: int, *, leader: str | None = None) -> None:
        self.me = me
        self.stage = stage
        self.last_stage = last_stage
        self.leader = leader
        self.iteration = 0  # the iteration in progress (data nodes) / last opened
        self.begun: set[int] = set()
        self.stepped: set[int] = set()
        self.can_take_from: dict[int, set[str]] = {}
        self.can_take_sent: set[int] = set()
        self.done_reports: dict[int, dict[str, IterationDone]] = {}
        self.opened: set[int] = {0}
        self.groups: dict[int, dict[int, set[str]]] = {}  # iteration -> stage -> members (from BEGIN)
        self.gone: set[str] = set()  # peers forgotten (crashed, left): never waited for again

    @property
    def is_data(self) -> bool:
        return self.stage < 0

    # ---- leader -----------------------------------------------------------
    def on_iteration_done(
        self, sender: str, msg: IterationDone, data_nodes: Iterable[str], stage0: Iterable[str],
        groups: Mapping[int, Iterable[str]] | None = None,
    ) -> list:
        """The leader collects IterationDone; with every data node heard, it opens the aggregation.

        `groups` (stage -> members; -1 for the data nodes) says who takes part in
        each stage's all-reduce: the leader decides it once and BEGIN
        AGGREGATION carries it, so every member of a stage uses the same group
        and every CAN TAKE waits for the same senders.
        """
        reports = self.done_reports.setdefault(msg.iteration, {})
        reports[sender] = msg
        dn = sorted(set(data_nodes))
        if msg.iteration in self.begun or any(d not in reports for d in dn):
            return []
        total = sum(reports[d].completed for d in dn)
        members = tuple(StageMembers(k, tuple(sorted(set(v)))) for k, v in sorted((groups or {}).items()))
        begin = BeginAggregation(msg.iteration, total, members)
        eff: list = [Send(d, begin) for d in dn if d != self.me]
        eff += [Send(r, begin) for r in sorted(set(stage0))]
        eff += self.on_begin(begin, next_stage=())
        return eff

    def iteration_loss(self, iteration: int) -> tuple[int, float]:
        """(completed microbatches, loss sum) over every data node's report of `iteration` (leader only)."""
        reports = self.done_reports.get(iteration, {})
        return sum(r.completed for r in reports.values()), sum(r.loss_sum for r in reports.values())

    # ---- everyone ---------------------------------------------------------
    def group(self, iteration: int, stage: int) -> set[str] | None:
        """The members of `stage` taking part in the aggregation of `iteration`, if BEGIN named them."""
        g = self.groups.get(iteration)
        return None if g is None else g.get(stage, set())

    def on_begin(self, msg: BeginAggregation, next_stage: Iterable[str]) -> list:
        """BEGIN AGGREGATION arrived (or, at the leader, was decided): pass it on once, start the step.

        A node that BEGIN's groups leave out of its stage (a newcomer whose
        state is not ready for this iteration) passes it on but takes no step
        and sends no CAN TAKE: nobody waits for it.
        """
        if msg.iteration in self.begun:
            return []
        self.begun.add(msg.iteration)
        if msg.groups:  # (a peer this node already knows to be gone stays out: BEGIN may be older news)
            self.groups[msg.iteration] = {g.stage: set(g.peers) - self.gone for g in msg.groups}
        eff: list = []
        if not self.is_data and self.stage < self.last_stage:
            eff += [Send(r, msg) for r in sorted(set(next_stage))]
        mine = self.group(msg.iteration, self.stage)
        if mine is not None and self.me not in mine:
            eff.append(LeftOut(msg.iteration))
            return eff
        eff.append(StartStep(msg.iteration, msg.microbatches))
        return eff

    def forget(self, peer: str, next_stage: Iterable[str], prev_stage: Iterable[str]) -> list:
        """`peer` crashed or left: nobody waits for its CAN TAKE any more (section V-E with churn).

        It leaves every aggregation group; iterations whose step is applied here
        and that waited only for it go on."""
        self.gone.add(peer)
        for it, reports in self.done_reports.items():  # a dead data node's microbatches do not count (recovery.py)
            if it not in self.begun:
                reports.pop(peer, None)
        for g in self.groups.values():
            for members in g.values():
                members.discard(peer)
        nxt, prv = list(next_stage), list(prev_stage)
        eff: list = []
        for it in sorted(self.stepped):
            eff += self._maybe_can_take(it, nxt, prv)
        return eff

    def on_step_done(self, iteration: int, next_stage: Iterable[str], prev_stage: Iterable[str]) -> list:
        self.stepped.add(iteration)
        return self._maybe_can_take(iteration, next_stage, prev_stage)

    def on_can_take(
        self, sender: str, msg: CanTake, next_stage: Iterable[str], prev_stage: Iterable[str]
    ) -> list:
        self.can_take_from.setdefault(msg.iteration, set()).add(sender)
        return self._maybe_can_take(msg.iteration, next_stage, prev_stage)

    def _maybe_can_take(self, iteration: int, next_stage: Iterable[str], prev_stage: Iterable[str]) -> list:
        if iteration not in self.stepped:
            return []
        heard = self.can_take_from.get(iteration, set())
        downstream = set(next_stage)
        groups = self.groups.get(iteration)
        if groups is not None:  # wait for exactly the members the leader named
            downstream = groups.get(0 if self.is_data else self.stage + 1, set())
        if self.is_data:
            # a data node's "next stage" here is stage 0: the last link of the CAN TAKE chain
            if not downstream <= heard or iteration + 1 in self.opened:
                return []
            self.opened.add(iteration + 1)
            self.iteration = iteration + 1
            return [OpenIteration(iteration + 1)]
        if self.stage < self.last_stage and not downstream <= heard:
            return []
        if iteration in self.can_take_sent:
            return []
        self.can_take_sent.add(iteration)
        msg = CanTake(iteration, self.stage)
        return [Send(p, msg) for p in sorted(set(prev_stage))]

"""Microbatches: the recovery machine (`protocol/recovery/`, sections V-D/V-E) driven with torch.

Every node runs one `RecoveryNode`, the pure machine that the simulator runs
in virtual time, for the lifecycle of its microbatches: launch, Forward /
Complete / Backward along the flows, DENY, and crash recovery (hop deadlines,
BackwardStuck, the data node's watchdog, Probe / MbState, RepairOrder,
Recover / Resume, Release).  This component owns the machine: it turns
frames into machine events and carries out the machine's effects itself,
through its driver (driver.py: a peer's messages in order, with their
tensors, `send_in_order`; timers; `Compute` on torch, `_run_compute`) and its
own handlers (`IterationSettled`, `OpenIteration`).  The machine hears of
everything through events, when it changes, never re-synced before an event:
its neighbours and their capacities (`set_neighbours`, on a Hello, a peer
gone or back, the flows' link costs, the iteration opened or stepped:
`neighbours_changed`, told only what differs), this node's standing
(`leave_after`, `standing_changed`), a peer presumed dead on a hop deadline
that the liveness check still hears (`peer_alive`: at once if the check hears
it then, else at its next frame, `peer_heard`), the flows (`set_flows`, when
the flow machine changed them: `flows_changed`), a peer gone (`peer_gone`),
BEGIN AGGREGATION and the applied step (`begin_aggregation`,
`aggregation_done`).  The aggregation reads the iteration in flight through
`MicrobatchesView`, never this component's fields.

The aggregation phase is `phases.Phases` (aggregation.py): when a data node's
microbatches of an iteration are all completed or deferred the machine says
so (`IterationSettled`) and the aggregation component reports it to the
leader.

Compression.  Forward, Recover and Backward carry their tensor dense, or
its Top-K when the manifest's `train.compression` says so for the link
(`linkcompress.py`); the store keeps the dense tensor, and the receiver
rebuilds a dense one (`StageModel` never sees a sparse tensor).  An
activation that came sparse keeps its indices beside it (`Slot.IN_KEPT`), and
with `train.compression_gradients = aligned` its gradient goes back at those
indices (`model/adatopk.py`: the exact gradient of the sparsified pass).

Tensors live in a `TensorStore`, per microbatch key: a received tensor is
kept only if the machine takes the message (it asks for a computation on
it), and every key the machine forgot is dropped after each event.  A middle
relay that takes a Forward or Backward hears its data node (`FRESH_MSGS`).

Numbering.  A data node's microbatch is named by its seq, and
`MicrobatchSource.get(seq)` is a pure function of it: iteration t offers the
microbatches deferred from t-1 and then seqs t*M .. t*M+M-1 (M =
microbatches_per_iteration), as `reference.train_centralized` trains on at
t.  The machine counts fresh seqs on from the first iteration it opens, so
`start(first_iteration)` hands it `first_seq = first_iteration * M`: a data
node restarted at the run's step s pushes the microbatches of iteration s,
not those of iteration 0 (the deferred ones carried into the iteration in
flight when it died are lost with the in-memory ledger).

Exactness.  A relay's backward keeps the microbatch's parameter gradients
apart (`StageModel.backward(hold=True)`); at BEGIN AGGREGATION the machine
names the contributions that count (protocol/completions.py) and only
those are added, in sorted key order.  A data node holds the head
gradients of a microbatch until its final backward.  The step divides the
all-reduced sum by the all-reduced count of contributions, so with no crash
every stage divides by the number of microbatches completed end to end (the
invariant), and after a crash by what the survivors hold.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

from ...model.adatopk import INDEX_BYTES
from ...model.tensors import sparse_indices
from ...protocol import messages as m
from ...protocol.pipeline import DataIteration, MbStatus, OpenIteration
from ...protocol.recovery import (
    MB_MESSAGES, Compute, ComputeKind, IterationSettled, MbTimer, RecoveryConfig, RecoveryNode,
)
from ...protocol.recovery.priors import HOP_PRIOR_S, e2e_prior_s, hop_priors
from .faults import Faults
from .flows import Flows
from .linkcompress import LinkCompression
from .liveness import Liveness
from ..net.peers import Peers
from .stage import LocalStage
from .tally import Tally
from .tensorstore import Keep, Slot, TensorStore
from .driver import Drivers, Owner
from ..net.wire import FrameRefused, Wire, now
from .snapshots import MicrobatchesStatus
from .waits import wait_entry

log = logging.getLogger("gwtf.node")

MB_MSGS = MB_MESSAGES  # what the recovery machine takes
KEYED = tuple(t for t in MB_MSGS if t not in (m.Room, m.Lend))
TENSOR_MSGS = (m.Forward, m.Recover, m.Backward)
FRESH_MSGS = (m.Forward, m.Backward)  # a pass its data node started within a pipeline's time (a Recover may replay an
# old one): taken at a middle relay, they count as hearing from the data node (liveness.py's loose watch of it)
# (the timing priors, hand-off -> Complete and launch -> final backward before anything is measured, are the rule of
# protocol/recovery/priors.py, which the simulator runs too: a compute allowance plus the link's transfer)
PROBE_WAIT_S = 2.0
PAUSE_CHECK_S = 1.0  # a paused data node looks again this often (and at every Hello)
PAUSE_TIMER = "pause.check"
PAUSE_FLOWS_WAIT_S = 10.0  # ... then waits this long at most for its flows to place a unit through the new relay
IN_SLOT = {ComputeKind.FORWARD: Slot.IN, ComputeKind.RECOMPUTE: Slot.IN, ComputeKind.LOSS: Slot.IN,
           ComputeKind.BACKWARD: Slot.GRAD_IN,
           ComputeKind.FINAL: Slot.GRAD_IN}  # where the tensor of a message goes, by the computation it feeds


@dataclass(frozen=True)
class Pause:
    """A data node does not open `iteration`: `stages` have no relay ready for it (since `since`)."""

    iteration: int
    stages: tuple[int, ...]
    since: float  # the node's clock (now())
    since_wall: float  # wall time, for status.json
    served_at: float | None = None  # when every stage had a ready relay again (the flows through it then form)


class MicrobatchesView:
    """What the aggregation and the status read of a data node's iteration in flight (`Microbatches`), read
    only: they never hold the iteration itself."""

    def __init__(self, mb: "Microbatches") -> None:
        self._mb = mb

    @property
    def started(self) -> bool:
        return self._mb.rec is not None

    def in_flight(self) -> int | None:
        """The data node's iteration in flight (None: none, or a relay)."""
        cur = self._mb.current
        return cur.iteration if cur is not None else None

    def report(self, t: int) -> m.IterationDone | None:
        """This data node's report of iteration `t` (its completed microbatches, their loss, the ledger's deferred
        and still pending ones), if `t` is the iteration in flight."""
        mb, cur = self._mb, self._mb.current
        if cur is None or cur.iteration != t:
            return None
        c = mb.counts(t)
        seqs = tuple(sorted(cur.done))
        e = mb.settled  # the machine's report names the attempts and holders that completed them (completions.py)
        named = e is not None and e.iteration == t and e.completed_seqs == seqs
        return m.IterationDone(t, len(cur.done), cur.loss_sum, c["deferred"], c["pending"] + c["inflight"], seqs,
                               e.completed_attempts if named else (), e.completed_holders if named else ())

    def completed(self, t: int) -> int:
        """The microbatches of iteration `t` this data node completed (0 if `t` is not in flight)."""
        cur = self._mb.current
        return len(cur.done) if cur is not None and cur.iteration == t else 0

    def seconds(self) -> float:
        """Since the iteration in flight opened."""
        return now() - self._mb.iter_started

    def pipeline_seconds(self, t: int) -> float:
        """Iteration `t`'s open to its last microbatch settled (NaN if it did not settle here)."""
        return self._mb.pipeline_s.get(t, math.nan)


class Microbatches:
    def __init__(self, wire: Wire, peers: Peers, liveness: Liveness, flows: Flows, stage: LocalStage,
                 drivers: Drivers, faults: Faults, *, policy: str, lend: bool, iterations: int,
                 on_settled: Callable[[int], None], on_finished: Callable[[], None]) -> None:
        self.wire = wire
        self.peers = peers
        self.liveness = liveness
        self.flows = flows
        self.stage = stage
        # the recovery machine's driver: a peer's messages in order, with their tensors; computations on torch
        self.driver = drivers.make(Owner.MICROBATCHES, self.on_timer, in_order=self.send_in_order,
                                   compute=self._run_compute)
        self.own = {IterationSettled: self.on_settled, OpenIteration: self.on_opened}  # the machine's own effects
        self.faults = faults
        self.policy = policy
        self.lend = lend
        self.iterations = iterations  # data nodes: stop after this many (0: run forever)
        self.report_settled = on_settled  # a data node's microbatches of an iteration are settled: it reports them
        self.on_finished = on_finished  # a data node trained its iterations
        self.rec: RecoveryNode | None = None
        self.store = TensorStore()
        self.current: DataIteration | None = None  # a data node's iteration in flight
        self.iter_started = 0.0
        self.pipeline_s: dict[int, float] = {}  # iteration -> open to last microbatch settled
        self.settled: IterationSettled | None = None  # the machine's last settled iteration, as it reported it
        self._flow_stamp: float | None = None  # the flow machine's last change the machine was told of
        self._told: tuple | None = None  # the neighbours (next, previous, capacities) the machine was told last
        self._presumed: set[str] = set()  # peers the machine presumes dead (not reported gone), as last seen
        self.paused: Pause | None = None  # a data node: the iteration it does not open while a stage is empty
        self.off_step = 0  # computations on parameters not of their microbatch's iteration (`_at_step`)
        # the manifest's Top-K of tensors on slow links (train.compression): the ratio of each link we send on
        self.compression = LinkCompression(stage.manifest, peers, flows.links_cfg)
        self.tally = Tally(stage.key_compute_s)  # what the microbatches came to since start (the dashboard)
        self.view = MicrobatchesView(self)  # what the aggregation reads

    # ------------------------------------------------------------------ reading
    @property
    def started(self) -> bool:
        return self.rec is not None

    def iteration_now(self) -> int:
        if self.current is not None:
            return self.current.iteration
        return max(0, self.stage.applied_steps)

    def reported(self, t: int) -> bool:
        """A data node's microbatches of iteration `t` are all settled (completed or deferred)."""
        return self.rec is not None and t in self.rec.reported

    def counts(self, t: int) -> dict[str, int]:
        return self.rec.ledger.counts(t) if self.rec is not None else {}

    def stats(self) -> dict:
        return dict(vars(self.rec.stats)) if self.rec is not None else {}

    # Read-only accessors for the node's status (status.py reads none of this component's fields).
    def is_paused(self) -> bool:
        """A data node holds its next iteration back while a stage is empty (`paused_status`)."""
        return self.paused is not None

    def status_counters(self) -> dict:
        """status.json's counters of the microbatches: the machine's (`recovery`), what this relay holds, the
        computations on parameters not of their microbatch's iteration (a warning each; 0 in an exact run), Top-K
        on the links (ratio per peer, bytes sent vs dense), and a data node's pause (`paused_status`)."""
        return {"recovery": self.stats(), "holding": self.holding(), "computed_off_step": self.off_step,
                "compression": self.compression.stats(), "paused": self.paused_status()}

    def tally_json(self, role: str) -> dict:
        """What the microbatches came to since start (tally.py), for the dashboard."""
        return self.tally.to_json(role)

    def losses(self) -> tuple[float | None, int | None, dict[int, float]]:
        """A data node's last mean loss, the iteration it is of, and the recent ones by iteration (a copy)."""
        return self.tally.last_loss, self.tally.last_iteration, dict(self.tally.losses)

    def holding(self) -> dict[str, int]:
        """Microbatches this relay holds, by phase (fwd/sending/sent: forward pass; bwd/grad/done: backward)."""
        out: dict[str, int] = {}
        if self.rec is not None and self.peers.role == "relay":
            for r in self.rec.mbs.values():
                out[r.phase.value] = out.get(r.phase.value, 0) + 1
        return out

    # ------------------------------------------------------------------ the machine
    def start(self, first_iteration: int = 0) -> None:
        """The flows are formed: start the microbatch machine (data nodes then open `first_iteration`, the run's
        step: seqs are numbered from it, see "Numbering")."""
        relay = self.peers.role == "relay"
        cap = self.peers.capacity if relay else self.stage.manifest.data.microbatches_per_iteration
        links_ms = {**self.flows.prev_costs, **self.flows.next_costs}  # d(i, j) of each link, ms (flows.py)
        cfg = RecoveryConfig(
            node_id=self.wire.me, stage=self.peers.stage if relay else -1, last_stage=self.peers.n_stages - 1,
            capacity=cap, data_nodes=tuple(self.peers.data_nodes()),
            next_peers=dict(self.flows.next_costs), prev_peers=dict(self.flows.prev_costs),
            peer_capacity={p.peer_id: p.capacity for p in self.peers.infos()},
            prior_s=hop_priors(links_ms), default_prior_s=HOP_PRIOR_S,
            e2e_prior_s=e2e_prior_s(self.peers.n_stages, self.flows.next_costs.values()), probe_wait_s=PROBE_WAIT_S,
            policy=self.policy, swarm_assumed_capacity=max(1, cap),
            lend=self.lend and self.policy == "gwtf", fastest_unit=True,  # (SWARM: greedy, ignores it)
            hold_limit=self.stage.hold_limit if relay else 0)
        seed = int.from_bytes(self.wire.me.encode()[-8:], "big")
        per_iteration = self.stage.manifest.data.microbatches_per_iteration
        self.rec = RecoveryNode(cfg, random.Random(seed), first_seq=0 if relay else first_iteration * per_iteration)
        self.standing_changed()
        self.flows_changed()

    # ------------------------------------------------------------------ what the machine is told, when it changes
    def standing_changed(self) -> None:
        """This node's standing changed (`Peers.set_standing`): leaving after an iteration, or ready from one."""
        if self.rec is None:
            return
        if self.peers.place.leaving:
            self.rec.leave_after(self.peers.place.leave_after)
        self.neighbours_changed()

    def neighbours_changed(self) -> None:
        """The peers, their standing or capacity, the flows' link costs or the iteration changed: the machine is
        told its neighbours (next hops that may take a microbatch of the iteration now) if they differ from
        what it was told last."""
        if self.rec is None:
            return
        me, usable = self.wire.me, self.peers.usable(self.iteration_now())
        nxt = {j: c for j, c in self.flows.next_costs.items() if j in usable or j == me}
        prv = {j: c for j, c in self.flows.prev_costs.items() if j in self.peers or j == me}
        caps = {j: self.peers.get(j).capacity for j in nxt if j in self.peers}
        if (nxt, prv, caps) == self._told:
            return
        self._told = (nxt, prv, caps)
        self._apply(self.rec.set_neighbours(now(), nxt, prv, caps, hop_priors({**prv, **nxt})))

    def flows_changed(self) -> None:
        """The flow machine ran (flows.py): its link costs and, when its flows changed, the flows."""
        if self.rec is None:
            return
        self.neighbours_changed()
        stamp = self.flows.last_change()
        if self.policy == "gwtf" and stamp is not None and self._flow_stamp != stamp:
            self._flow_stamp = stamp
            # (a data node launches waiting microbatches on units that became free)
            self._apply(self.rec.set_flows(self.flows.out(), now()))

    def peer_heard(self, peer: str) -> None:
        """A frame of `peer` came: if the machine presumed it dead on a hop deadline, it is alive."""
        if self.rec is not None and peer in self._presumed:
            self._presumed.discard(peer)
            self._apply(self.rec.peer_alive(now(), peer))

    def _unpresume_heard(self) -> None:
        """Peers the machine presumed dead on a hop deadline since it last did so that the liveness check still
        hears are alive (it un-presumes by itself only a peer that sends it something: a data node that presumed
        its last stage-0 relay dead would defer every microbatch from then on); the others are told alive when
        they are heard again (`peer_heard`)."""
        presumed = self.rec.dead - self.rec.gone
        fresh, self._presumed = presumed - self._presumed, presumed
        for p in sorted(fresh):
            if self.liveness.hears(p):
                self._presumed.discard(p)
                self._apply(self.rec.peer_alive(now(), p))

    def _apply(self, effects: list) -> None:
        """The machine's effects, carried out here (its driver and `own`); then the tensors of keys it forgot are
        dropped."""
        self.driver.carry(effects, self.own)
        self.store.apply(self.store.drops_beside(self.rec.mbs))
        self._unpresume_heard()

    def on_settled(self, e: IterationSettled) -> None:
        """The machine's effect: this data node's microbatches of an iteration are all completed or deferred."""
        self.pipeline_s.setdefault(e.iteration, now() - self.iter_started)
        cur = self.current
        self.settled = e
        if cur is not None and cur.iteration == e.iteration:
            self.tally.data_settled(e.iteration, self.wire.me, self.counts(e.iteration), dict(cur.done))
        self.report_settled(e.iteration)

    def on_opened(self, e: OpenIteration) -> None:
        """The machine's effect: it opened the iteration this node asked it to open (`open_iteration`)."""

    # ------------------------------------------------------------------ frames
    async def on_message(self, peer: str, msg: Any, payload) -> None:
        if self.rec is None:
            raise FrameRefused(f"{type(msg).__name__} before this node's flows exist", ban=False)
        if isinstance(msg, KEYED):
            if msg.data_node not in self.peers and msg.data_node != self.wire.me:
                if self.peers.is_gone(msg.data_node):  # (a late frame of its microbatches: not the sender's fault)
                    log.debug("%s for %s, which is gone: dropped", type(msg).__name__, self.peers.who(msg.data_node))
                    return
                raise FrameRefused(f"{type(msg).__name__} for unknown data node {msg.data_node[:16]}")
            if self.peers.role == "data" and msg.data_node != self.wire.me:
                raise FrameRefused(f"{type(msg).__name__} of another data node's microbatch")
        if isinstance(msg, m.Lend):
            if self.peers.role != "data" or peer not in self.peers.data_nodes():
                raise FrameRefused("Lend is from one data node to another")
        tensor = kept_at = None
        if isinstance(msg, TENSOR_MSGS):
            tensor = self.stage.unpack(msg, payload, type(msg).__name__)
            if self.compression.aligned and not isinstance(msg, m.Backward):  # an activation: its gradient goes
                kept_at = sparse_indices(msg.tensor, payload)  # back at these indices (None: it came dense)
            if isinstance(msg, m.Backward) and payload is not None:  # a gradient back over a link this node measures
                self.flows.meter.observe(peer, len(payload), getattr(payload, "seconds", None))
        elif getattr(msg, "tensor", None) is not None:
            raise FrameRefused(f"{type(msg).__name__} with a tensor it should not carry")
        if self.peers.role == "relay":
            self.rec.parameters_at(self.stage.applied_steps)
        eff = self.rec.on_message(now(), peer, msg)
        if tensor is not None:
            key = (msg.data_node, msg.seq, msg.iteration)
            slots = [IN_SLOT[e.kind] for e in eff if isinstance(e, Compute) and e.key == key and e.kind in IN_SLOT]
            if slots and isinstance(msg, FRESH_MSGS) and self.peers.watches_loosely(msg.data_node):
                self.peers.heard(msg.data_node, now())  # its microbatch's pass, taken: the data node is at work
            self.store.apply([Keep(key, slot, tensor) for slot in slots])
            if Slot.IN in slots and self.compression.aligned:
                self.store.keep(key, Slot.IN_KEPT, kept_at)
        self._apply(eff)

    async def send_in_order(self, peer: str, msgs: list) -> None:
        """The machine's messages to one peer, in order; Forward, Recover and Backward with their tensor."""
        for msg in msgs:
            if isinstance(msg, TENSOR_MSGS):
                slot = Slot.GRAD_OUT if isinstance(msg, m.Backward) else Slot.OUT
                key = (msg.data_node, msg.seq, msg.iteration)
                t = self.store.get(key, slot)
                if t is None:
                    log.warning("%s of microbatch %d: its tensor is gone here, not sent", type(msg).__name__, msg.seq)
                    continue
                at = self.store.get(key, Slot.IN_KEPT) if slot is Slot.GRAD_OUT else None  # (aligned gradients)
                kept = self.compression.kept(peer, t) if at is None else int(at.numel())
                if await self.wire.send_tensor(peer, msg, t, kept=kept, at=at):
                    dense = t.numel() * t.element_size()
                    self.compression.count(dense, dense if kept is None else kept * (INDEX_BYTES + t.element_size()),
                                           aligned=at is not None)
            else:
                await self.wire.send(peer, msg)

    def on_timer(self, key: MbTimer | str) -> None:
        if key == PAUSE_TIMER:
            self.recheck_paused()
            return
        if self.rec is not None:
            self._apply(self.rec.on_timer(now(), key))

    # ------------------------------------------------------------------ torch
    def _at_step(self, fn, key, kind: ComputeKind):
        """`fn`, run in the worker after saying so if the part's parameters are not those of the microbatch's
        iteration (`applied_steps` must equal it: the step of the iteration before was applied, and not yet the
        step of this one), the condition of exactness; it still computes (the machine's rules decide)."""
        def run(*args):
            if self.stage.applied_steps != key[2]:
                self.off_step += 1
                log.warning("%s of microbatch %s of iteration %d computed on parameters of %d steps", kind,
                            key[1], key[2], self.stage.applied_steps)
            return fn(*args)
        return run

    async def _run_compute(self, e: Compute) -> None:
        key, kind = e.key, e.kind
        sm, st = self.stage.model, self.store
        self.faults.point(kind)
        try:
            if self.peers.role == "relay":
                if kind in (ComputeKind.FORWARD, ComputeKind.RECOMPUTE):
                    st.keep(key, Slot.OUT, await self.stage.compute(self._at_step(sm.forward, key, kind), key,
                                                                    _need(st, key, Slot.IN)))
                elif kind is ComputeKind.BACKWARD:
                    st.keep(key, Slot.GRAD_OUT, await self.stage.compute(
                        self._at_step(functools.partial(sm.backward, hold=True), key, kind), key,
                        st.take(key, Slot.GRAD_IN)))
                else:
                    return
            else:
                if kind is ComputeKind.FORWARD:
                    ids, tgt = self.stage.source.get(key[1])
                    st.keep(key, Slot.TARGET, tgt)
                    st.keep(key, Slot.OUT, await self.stage.compute(self._at_step(sm.embed, key, kind), key, ids))
                elif kind is ComputeKind.LOSS:
                    loss, grad = await self.stage.compute(
                        self._at_step(functools.partial(sm.head_loss, hold=True), key, kind),
                        key, st.take(key, Slot.IN), _need(st, key, Slot.TARGET))
                    st.keep(key, Slot.LOSS, loss)
                    st.keep(key, Slot.GRAD_OUT, grad)
                elif kind is ComputeKind.FINAL:
                    def final(k, g):
                        sm.count_held(k)  # the head gradients of a completed microbatch count
                        sm.embed_backward(k, g)

                    await self.stage.compute(self._at_step(final, key, kind), key, st.take(key, Slot.GRAD_IN))
                else:
                    return
        except (KeyError, ValueError, RuntimeError) as err:
            # its inputs gone meanwhile (a release, a newer attempt, a stage state loaded over the stash): a relay's
            # machine forgets the microbatch, which its data node then repairs; a data node's defers it
            # (RecoveryNode.on_compute_failed)
            log.warning("%s of microbatch %s not computed: %s", kind, key[1], err)
            if self.rec is not None:
                self._apply(self.rec.on_compute_failed(now(), key, kind))
            return
        if self.rec is None:
            return
        loss = st.get(key, Slot.LOSS) if kind is ComputeKind.FINAL else None
        eff = self.rec.on_compute_done(now(), key, kind)
        if kind is ComputeKind.FINAL and self.current is not None and key[2] == self.current.iteration:
            if self.rec.ledger.status(key[2], key[1]) is MbStatus.COMPLETED and loss is not None:
                self.current.done[key[1]] = loss
        self._apply(eff)

    # ------------------------------------------------------------------ iterations and the phase
    def empty_stages(self, t: int) -> list[int]:
        """Stages with no relay ready for iteration `t` (none that is not joining, ready from `t`, not leaving)."""
        groups = self.peers.groups(t)
        return [k for k in range(self.peers.n_stages) if not groups[k]]

    def open_iteration(self, t: int) -> None:
        """A data node: the previous iteration's steps are applied everywhere; push the microbatches of `t`.

        With a stage that has no relay ready for `t` the iteration is not
        opened: every microbatch would be deferred at once and the phase would
        open the next one at once, a busy loop of empty iterations.  The run
        pauses instead (`paused`, in status.json), and `recheck_paused` opens
        `t` as soon as every stage has a ready member again (on a peer's Hello,
        and every PAUSE_CHECK_S).
        """
        if self.iterations and t >= self.iterations:
            log.info("finished %d iterations", t)
            self.on_finished()
            return
        empty = self.empty_stages(t)
        if empty:
            if self.paused is None or self.paused.stages != tuple(empty):
                since = self.paused.since if self.paused is not None else now()
                wall = self.paused.since_wall if self.paused is not None else time.time()
                self.paused = Pause(t, tuple(empty), since, wall)
                log.warning("iteration %d not opened: stage %s has no live relay ready for it; the run is paused "
                            "until a relay with that stage's state joins", t, ", ".join(map(str, empty)))
            self.driver.set_timer(PAUSE_TIMER, now() + PAUSE_CHECK_S)
            return
        if self.paused is not None:
            p = self.paused
            if p.served_at is None:
                self.paused = p = Pause(t, p.stages, p.since, p.since_wall, served_at=now())
            if not self._units_placed() and now() - p.served_at < PAUSE_FLOWS_WAIT_S:
                # the flows through the stage's new relay are forming: without a unit placed every microbatch
                # would be deferred at once
                self.driver.set_timer(PAUSE_TIMER, now() + PAUSE_CHECK_S / 4)
                return
            log.info("stage %s has a ready relay again: opening iteration %d after a pause of %.1f s",
                     ", ".join(map(str, self.paused.stages)), t, now() - self.paused.since)
            self.paused = None
            self.driver.cancel_timer(PAUSE_TIMER)
        eff = self.rec.open_iteration(now(), t)
        seqs = sorted(self.rec.ledger.entries.get(t, {}))
        self.current = DataIteration(t, seqs)
        self.current.waiting = []  # the recovery machine owns the microbatches
        self.iter_started = now()
        self._apply(eff)
        self.neighbours_changed()  # (the iteration: next hops that leave before it are none any more)

    def _units_placed(self) -> bool:
        """This data node's flows place a unit on a relay of stage 0."""
        return sum(self.flows.out().get(self.wire.me, {}).values()) > 0

    def recheck_paused(self) -> None:
        """A peer event or the pause timer: open the iteration the run waits for if every stage is served now."""
        if self.paused is not None:
            self.open_iteration(self.paused.iteration)

    def paused_status(self) -> dict | None:
        """status.json's `paused`: the empty stages, since when (wall time), the iteration that waits."""
        p = self.paused
        if p is None:
            return None
        return {"empty_stages": list(p.stages), "since": p.since_wall, "seconds": round(now() - p.since, 1),
                "iteration": p.iteration}

    def begin_aggregation(self, iteration: int, completed: Mapping[str, Collection[int]] | None = None) -> frozenset:
        """A relay: BEGIN AGGREGATION of `iteration`; the contributions that count (keys held here whose
        microbatch is among `completed`, each data node's completed seqs that BEGIN names)."""
        if self.rec is None or self.peers.role != "relay":
            return frozenset()
        eff, contrib = self.rec.begin_aggregation(now(), iteration, completed)
        self.tally.relay_counted(iteration, contrib)
        self._apply(eff)
        return contrib

    def aggregation_done(self, iteration: int) -> None:
        """The step of `iteration` is applied here (a relay's iteration is its steps: its next hops may change)."""
        if self.rec is not None:
            self._apply(self.rec.aggregation_done(now(), iteration))
            self.neighbours_changed()

    def peer_back(self, peer: str, *, same: bool = False) -> None:
        """`peer` was reported gone and said Hello again: alive, and (a data node) one of the run's again; `same`:
        with the incarnation it had (it was alive: the contributions it left orphaned here still count)."""
        if self.rec is not None:
            info = self.peers.get(peer)
            self._apply(self.rec.peer_back(now(), peer, data_node=info is not None and info.role == "data",
                                           same=same))
            self.neighbours_changed()

    def peer_gone(self, peer: str) -> None:
        if self.rec is not None:
            self.neighbours_changed()
            self._apply(self.rec.peer_gone(now(), peer))
            if self.peers.role == "data":  # its first stage may be empty now: what needs it cannot complete
                self._apply(self.rec.give_up_stranded(now()))

    def peers_in_flight(self) -> set[str]:
        """The peers this node's microbatches in flight came from or went to (liveness.py's `at_work`)."""
        return self.rec.peers_in_flight() if self.rec is not None else set()

    def waits(self, t: float) -> list[dict]:
        """status.json's `waiting_for` here: a data node holding its next iteration back while a stage is empty."""
        p = self.paused
        if p is None:
            return []
        return [wait_entry("paused_stage", p.since, t, iteration=p.iteration, stages=list(p.stages))]

    def status(self) -> MicrobatchesStatus:
        """What the status shows of the microbatches (snapshots.py): copies, built now."""
        cur = self.view.in_flight()
        last_loss, last_iteration, losses = self.losses()
        return MicrobatchesStatus(
            self.started, cur, self.view.seconds() if cur is not None else None,
            self.counts(cur) if cur is not None else None, cur is not None and self.reported(cur),
            self.paused_status(), self.status_counters(), self.stats(), self.holding(),
            self.tally_json(self.peers.role), last_loss, last_iteration, losses)



def _need(store: TensorStore, key: tuple, slot: Slot) -> Any:
    v = store.get(key, slot)
    if v is None:
        raise KeyError(key)
    return v

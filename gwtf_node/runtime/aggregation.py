"""Aggregation: the phase between iterations (section V-E), the all-reduce, the optimizer step, metrics.

A data node whose microbatches of the iteration are settled sends
`IterationDone` to the acting leader, and again to a new leader if the
leader changes before BEGIN AGGREGATION arrives.  The leader, once it heard
from every data node, opens the phase (`pipeline.Phases`): BEGIN AGGREGATION
travels front to back and names the members of each stage's all-reduce (the
data nodes, and every relay the leader knows that is not joining and whose
state is ready for this iteration), so all copies of a stage reduce over the
same group and CAN TAKE waits for exactly the members that step.  CAN TAKE
travels back to front and opens the next iteration at the data nodes.

The step.  Every member of a stage's group takes part in the all-reduce of
the gradient sum and the count of contributions, whether or not it carried a
microbatch, so all copies stay identical; the update is the sum divided by
the count (with no crash: the microbatches completed end to end).  A relay
counts the contributions the recovery machine names at BEGIN AGGREGATION,
of the data nodes that BEGIN names (a data node that died before the leader
opened the phase is left out by the leader, and so are its microbatches,
even at a relay that has not yet noticed the death).
If a member dies during the all-reduce, the round is cancelled and redone
among the survivors (the round's key names its group, so peers only meet on
the same group); the contributions that died with it are counted in
`lost_contributions` (the survivors' mean: they are not trained again).

After the step: a checkpoint every `checkpoint_every` iterations, and the
leader appends one JSON object per iteration to `metrics.jsonl`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import trio

from ..protocol import messages as m
from ..protocol.effects import Send
from ..protocol.pipeline import Phases, StartStep
from .faults import Faults
from .leadership import Leadership
from .microbatches import Microbatches
from .peers import Peers
from .stage import LocalStage
from .wire import ApplyEffects, FrameRefused, Owner, Wire, now

log = logging.getLogger("gwtf.node")

ALLREDUCE_TIMEOUT_S = 120.0
GROUP_CHANGE_WAIT_S = 60.0
REPORT_EVERY_S = 0.5  # a data node checks this often whether its IterationDone must go (again) to a leader


class Aggregation:
    def __init__(self, wire: Wire, peers: Peers, stage: LocalStage, microbatches: Microbatches,
                 leadership: Leadership, allreducer: Any, effects: ApplyEffects, faults: Faults, *,
                 state_dir: Path, checkpoint_every: int, on_stepped: Callable[[int], None]) -> None:
        self.wire = wire
        self.peers = peers
        self.stage = stage
        self.microbatches = microbatches
        self.leadership = leadership
        self.allreducer = allreducer
        self.effects = effects
        self.faults = faults
        self.state_dir = state_dir
        self.checkpoint_every = checkpoint_every
        self.on_stepped = on_stepped  # the step of an iteration is applied here
        self.phases: Phases | None = None  # once this node has a stage
        self.contrib_for: dict[int, frozenset] = {}  # a relay: iteration -> contributions held (from BEGIN)
        self.step_counts: dict[int, int] = {}
        self.done_sent: dict[int, str] = {}  # iteration -> the leader its IterationDone went to
        self.lost_contributions: dict[int, int] = {}
        self.last_iteration: int | None = None  # the last iteration whose step this node applied
        self._ar_scopes: dict[str, tuple[set[str], trio.CancelScope]] = {}

    # ------------------------------------------------------------------ reading
    def group(self, iteration: int, stage: int) -> set[str] | None:
        return self.phases.group(iteration, stage) if self.phases is not None else None

    def can_take_sent(self, iteration: int) -> bool:
        return self.phases is not None and iteration in self.phases.can_take_sent

    # ------------------------------------------------------------------ the phase
    def new_phases(self) -> None:
        """This node has a stage now: it takes part in the phase from here on."""
        self.phases = Phases(self.wire.me, self.peers.stage, self.peers.n_stages - 1)

    def _apply(self, effects: list) -> None:
        self.effects(Owner.AGGREGATION, effects)

    def on_begin(self, peer: str, msg: m.BeginAggregation) -> None:
        if self.phases is None:
            raise FrameRefused("BeginAggregation before this node has a stage")
        if msg.iteration not in self.phases.begun:
            contrib = self.microbatches.begin_aggregation(msg.iteration)
            if self.peers.role == "relay" and self.microbatches.started:
                named = [set(g.peers) for g in msg.groups if g.stage == -1]
                if named:  # a data node that BEGIN leaves out died before it: its microbatches do not count
                    contrib = frozenset(k for k in contrib if k[0] in set.union(*named))
                self.contrib_for[msg.iteration] = contrib
        self._apply(self.phases.on_begin(msg, self.peers.next_stage_ids()))

    def on_can_take(self, peer: str, msg: m.CanTake) -> None:
        if self.phases is None:
            raise FrameRefused("CanTake before this node has a stage")
        self._apply(self.phases.on_can_take(peer, msg, self.peers.next_stage_ids(), self.peers.prev_stage_ids()))

    def on_iteration_done(self, sender: str, msg: m.IterationDone) -> None:
        if self.peers.role != "data":
            raise FrameRefused("IterationDone sent to a relay")
        self._collect_done(sender, msg)

    def _collect_done(self, sender: str, msg: m.IterationDone) -> None:
        if not self.leadership.is_leader():
            log.info("IterationDone from %s while not the acting leader: ignored (it resends)", self.peers.who(sender))
            return
        self.leadership.iteration_aggregating(msg.iteration)
        eff = self.phases.on_iteration_done(sender, msg, self.peers.data_nodes(), self.peers.ids("relay", 0),
                                            self.peers.groups(msg.iteration))
        if any(isinstance(e, Send) and isinstance(e.msg, m.BeginAggregation) for e in eff):
            log.info("iteration %d: opening the aggregation", msg.iteration)
            self.faults.point("begin_open")  # the leader opens the phase; no BEGIN has left yet
        self._apply(eff)

    async def send(self, peer: str, msg: Any) -> bool:
        """Send a phase signal (BEGIN AGGREGATION, CAN TAKE, IterationDone), through the fault points."""
        if self.faults.lose_first(type(msg).__name__, getattr(msg, "iteration", -1), peer):
            return True  # lost on the way, as far as the sender knows
        ok = await self.wire.send(peer, msg)
        if ok and isinstance(msg, m.BeginAggregation):
            self.faults.point("begin_sent")
        return ok

    async def report_done(self) -> None:
        """Send this data node's IterationDone to the current leader (again, if the leader changed)."""
        it = self.microbatches.current
        if self.peers.role != "data" or it is None or not self.microbatches.reported(it.iteration):
            return
        if self.phases is None or it.iteration in self.phases.begun:
            return
        lead = self.leadership.leader()
        if lead is None or self.done_sent.get(it.iteration) == lead:
            return
        self.done_sent[it.iteration] = lead
        c = self.microbatches.counts(it.iteration)
        done = m.IterationDone(it.iteration, len(it.done), it.loss_sum, c["deferred"], c["pending"] + c["inflight"])
        if lead == self.wire.me:
            self._collect_done(self.wire.me, done)
        else:
            await self.send(lead, done)

    def report_soon(self) -> None:
        self.wire.spawn(self.report_done)

    async def report_loop(self) -> None:
        """Data nodes: keep reporting to the current leader."""
        while True:
            await trio.sleep(REPORT_EVERY_S)
            await self.report_done()

    # ------------------------------------------------------------------ peers
    def peer_back(self, peer: str) -> None:
        """A peer said Hello again after it was forgotten (a restart keeps its peer id)."""
        if self.phases is not None:
            self.phases.gone.discard(peer)

    def forget(self, peer: str) -> None:
        """`peer` crashed or left: nobody waits for its CAN TAKE any more."""
        if self.phases is not None:
            self._apply(self.phases.forget(peer, self.peers.next_stage_ids(), self.peers.prev_stage_ids()))

    def after_gone(self, peer: str) -> None:
        """The leader need not wait for a gone data node's IterationDone; an all-reduce waiting for it is redone."""
        if self.peers.role == "data" and self.phases is not None and self.leadership.is_leader():
            for it, reports in sorted(self.phases.done_reports.items()):
                if it not in self.phases.begun and reports:
                    sender, msg = next(iter(sorted(reports.items())))
                    self._collect_done(sender, msg)
        for gkey, (group, scope) in list(self._ar_scopes.items()):
            if peer in group:
                log.info("all-reduce %s waits for %s, which is gone: redone among the survivors", gkey,
                         self.peers.who(peer))
                scope.cancel()

    # ------------------------------------------------------------------ the step
    def start_step(self, e: StartStep) -> None:
        self.wire.spawn(self._step, e)

    async def _step(self, e: StartStep) -> None:
        t0 = now()
        relay = self.peers.role == "relay"
        keys: list = []  # relay: the contributions the recovery machine names (backward computed here, attempt
        if relay:  # not released), as (data node, seq, iteration)
            keys = sorted(self.contrib_for.pop(e.iteration, frozenset()))
            log.info("iteration %d: aggregating %d contributions held here", e.iteration, len(keys))
        self.faults.point("aggregate")
        if keys:
            self.faults.point("aggregate_holding")
        model = self.stage.model
        if not relay:
            cur = self.microbatches.current
            mine = len(cur.done) if cur is not None and cur.iteration == e.iteration else 0
        else:
            def commit() -> int:
                return sum(1 for k in keys if model.commit(k))

            mine = await self.stage.run(commit)
        grad = await self.stage.run(model.grad_vector)
        stage = self.peers.stage
        named = self.phases.group(e.iteration, stage)
        group = sorted(named) if named is not None else self.peers.stage_group()
        total, count = await self._all_reduce_survivors(f"s{stage}/it{e.iteration}", group, grad, float(mine))
        if relay and count < e.microbatches:
            # the survivors' mean (recovery.py): the missing contributions died with a relay
            self.lost_contributions[e.iteration] = int(e.microbatches - count)
            log.warning("iteration %d: stage %d holds %d of %d contributions (the rest died with a relay)",
                        e.iteration, stage, int(count), e.microbatches)
        await self.stage.run(self.stage.apply_step, total, count, e.iteration)
        self.microbatches.aggregation_done(e.iteration)
        self.stage.steps_done()
        self.on_stepped(e.iteration)
        self.step_counts[e.iteration] = e.microbatches
        if self.checkpoint_every and (e.iteration + 1) % self.checkpoint_every == 0:
            await self.stage.run(self.checkpoint)
        if not relay and self.leadership.leader() == self.wire.me:  # the leader that opened this aggregation
            self._record_metrics(e.iteration, now() - t0)
        self.last_iteration = e.iteration
        self._apply(self.phases.on_step_done(e.iteration, self.peers.next_stage_ids(), self.peers.prev_stage_ids()))

    def checkpoint(self) -> None:
        """Save this node's part (parameters and optimizer state) with the last iteration it stepped."""
        it = -1 if self.last_iteration is None else self.last_iteration
        self.stage.checkpoint(self.state_dir / "checkpoint.pt", self.peers.stage, it)

    def _record_metrics(self, t: int, step_s: float) -> None:
        ph = self.phases
        completed, loss_sum = ph.iteration_loss(t)
        seconds = now() - self.microbatches.iter_started
        data = self.stage.manifest.data
        rec = {
            "iteration": t,
            "loss": loss_sum / completed if completed else None,
            "microbatches": completed,
            "samples": completed * data.microbatch_size,
            "completed": completed,
            "deferred": sum(r.deferred for r in ph.done_reports.get(t, {}).values()),
            "lost": sum(r.lost for r in ph.done_reports.get(t, {}).values()),
            "seconds": round(seconds, 4),
            "aggregation_seconds": round(step_s, 4),
            "pipeline_seconds": round(self.microbatches.pipeline_s.get(t, math.nan), 4),
            "relays": sum(len(v) for k, v in (ph.groups.get(t) or {}).items() if k >= 0),
            "time": time.time(),
        }
        with open(self.state_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        log.info("iteration %d loss %.4f microbatches %d %.2f s", t, rec["loss"] or math.nan, completed, seconds)

    async def on_chunk(self, peer: str, msg: m.AllReduceChunk, payload) -> None:
        await self.allreducer.on_chunk(peer, msg, payload)

    async def _all_reduce_survivors(self, base: str, named: list[str], grad, mine: float):
        """All-reduce among the members of `named` still alive; redone when one dies meanwhile."""
        from .allreduce import AllReduceError

        me = self.wire.me

        def alive() -> list[str]:
            return sorted(p for p in named if p == me or (p in self.peers and not self.peers.is_gone(p)))

        tried: set[str] = set()
        while True:
            group = alive()
            digest = hashlib.sha256(",".join(group).encode()).hexdigest()[:12]
            gkey = f"{base}/{digest}"
            if gkey in tried:
                deadline = now() + GROUP_CHANGE_WAIT_S
                while now() < deadline:
                    await trio.sleep(0.2)
                    if alive() != group:
                        break
                else:
                    log.error("all-reduce %s failed again with the same group: stepping on this node's gradient only",
                              base)
                    return grad, mine
                continue
            tried.add(gkey)
            if len(group) == 1:
                return grad, mine
            with trio.CancelScope() as scope:
                self._ar_scopes[gkey] = (set(group), scope)
                try:
                    return await self.allreducer.all_reduce(gkey, group, grad, mine, timeout=ALLREDUCE_TIMEOUT_S)
                except Exception as e:  # noqa: BLE001 - AllReduceError, alone or in a nursery's group
                    if not _all_reduce_failure(e, AllReduceError):
                        raise
                    log.warning("all-reduce %s failed: %s", gkey, _leaf(e))
                finally:
                    self._ar_scopes.pop(gkey, None)
            await trio.sleep(0.2)


def _leaves(e: BaseException):
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            yield from _leaves(x)
    else:
        yield e


def _all_reduce_failure(e: BaseException, kind: type) -> bool:
    """True if `e` (maybe an exception group from a nursery) holds nothing but all-reduce failures."""
    return all(isinstance(x, kind) for x in _leaves(e))


def _leaf(e: BaseException) -> BaseException:
    return next(iter(_leaves(e)), e)

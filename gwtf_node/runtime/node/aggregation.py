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
among the survivors (regroup.py: the round's key names its group; a member
presumed dead keeps its place for a grace, and one back with its incarnation
was never dead); the contributions that died with a member are counted in
`lost_contributions` (the survivors' mean: they are not trained again).
Members decide who survived each for itself, so two of them can step in
different rounds (each forgot the other): a relay records how each step was
summed (`rounds`, protocol/roundcheck.py), and after a step that left out a
member BEGIN named it compares its parameters with that member's and one of
the two copies is replaced by the other (cutcheck.py).
A contribution that a part owner refuses as an outlier (allreduce.py,
protocol/gradguard.py) is counted there too: the part's mean is over the
contributions accepted, as if the refused one had died with its relay.

After the step: a checkpoint every `checkpoint_every` iterations, its state taken at once and written in the
background (checkpointer.py), and the leader appends one JSON object per iteration to `metrics.jsonl`.

Logs.  A relay logs one INFO line per step: the round that summed it, the contributions held here, and the time its
parts took (logger `gwtf.steps`, like a data node's lines of each iteration: node.log only, not stderr).  What it
announces before each round (the contributions it brings) is at DEBUG, with the all-reduce's and the checkpoint's own
lines.

Timing.  Each step logs what its aggregation was made of (`parts`: a relay's held gradients added (`commit`), the
gradient vector, the all-reduce, the optimizer step, the checkpoint's state taken (its file is written while the
next iteration runs), in seconds; also `aggregation_parts` in metrics.jsonl).  The torch work runs in the stage's
worker thread and the all-reduce's tensor work in its own (allreduce.py), so the event loop answers pings
throughout.  Two waits scale with what the node measured: the all-reduce's timeout (`allreduce_timeout_s`) and the
phase signals' retransmission period (`phase_retry_s`).

A data node also keeps, per stage, the optimizer steps the stage's state holds in the run (`stage_steps`): the
run's step, except that an iteration whose aggregation found the stage with no member does not move it.  A relay
that comes back to an empty stage compares its checkpoint with it (resume.py).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import trio

from ...protocol import messages as m
from ...protocol.effects import Send
from ...protocol.completions import completed_named
from ...protocol.phases import NOT_READY, RETRY_S, LeftOut, OpenIteration, OutOfStep, Overdue, PhaseTimer, WatchTimer
from ...protocol.phasewaits import peers_at_work
from ...protocol.pipeline import Phases, StartStep
from ...protocol.roundcheck import RoundOf, from_records, to_records, trim
from .checkpointer import Checkpointer
from .faults import Faults
from .leadership import Leadership
from .snapshots import AggregationStatus
from .microbatches import MicrobatchesView
from ..net.peers import Peers
from .stage import LocalStage
from . import waits
from .driver import Drivers, Owner
from .regroup import GROUP_CHANGE_WAIT_S, REJOIN_GRACE_S, Regroup
from ..net.wire import FrameRefused, Wire, now

log = logging.getLogger("gwtf.node")
steps_log = logging.getLogger("gwtf.steps")  # the lines of every iteration: node.log only (runtime/ops/logs.py)

ALLREDUCE_TIMEOUT_S = 120.0  # the all-reduce timeout's floor ...
ALLREDUCE_FACTOR = 4.0  # ... and its factor over the last all-reduce's duration (allreduce_timeout_s)
RETRY_CAP_S = 30.0  # the phase signals' retransmission period grows with the work measured, up to this
LEADER_CHECK_S = 0.5  # a data node looks this often at who leads (a lease ends without an event)


class Aggregation:
    """The phase machine's owner: it carries out the phase's effects through its driver (driver.py: signals by
    `send`, through the fault points, BEGIN stamped with the term led; timers) and its own handlers: `StartStep`
    (the step), `OutOfStep` (`abstain`), `Overdue` (waits.py), and events the node wires: `LeftOut` and
    `OutOfStep` to `on_left_out` (joining.py resyncs), `OpenIteration` to `on_open` (the microbatches open it).
    It reads the iteration in flight through `MicrobatchesView`, and tells the microbatch machine BEGIN and the
    step applied through the events it is handed (`begin_aggregation`, `aggregation_done`)."""

    def __init__(self, wire: Wire, peers: Peers, stage: LocalStage, microbatches: MicrobatchesView,
                 begin_aggregation: Callable[[int, Any], frozenset], aggregation_done: Callable[[int], None],
                 leadership: Leadership, allreducer: Any, drivers: Drivers, faults: Faults, *,
                 state_dir: Path, checkpoint_every: int, checkpoint_keep: int = 3,
                 on_stepped: Callable[[int], None]) -> None:
        self.wire = wire
        self.peers = peers
        self.stage = stage
        self.microbatches = microbatches  # read only: a data node's iteration in flight
        self.begin_aggregation = begin_aggregation  # events to the microbatch machine: BEGIN came, ...
        self.aggregation_done = aggregation_done  # ... the step is applied
        self.leadership = leadership
        self.allreducer = allreducer
        self.driver = drivers.make(Owner.AGGREGATION, self.on_timer, send=self.send)
        self.own = {StartStep: self.start_step, LeftOut: lambda e: self.on_left_out(e.iteration),
                    OutOfStep: self._out_of_step, OpenIteration: self._opened,
                    Overdue: lambda e: waits.log_overdue(e, peers.who)}  # the phase's own effects
        self.faults = faults
        self.state_dir = state_dir
        self.checkpointer = Checkpointer(stage, state_dir, lambda: peers.stage, every=checkpoint_every,
                                         keep=checkpoint_keep)
        self.on_stepped = on_stepped  # the step of an iteration is applied here
        self.phases: Phases | None = None  # once this node has a stage
        # the phase's work here lately (s): "aggregation", a step from BEGIN on (its all-reduce too); "can_take", a data
        # node's wait for CAN TAKE after its step (the relays' all-reduce): what bounds its waits (`wait_bound_s`)
        self.phase_work_s: dict[str, float] = {}
        self._stepped: tuple[int, float] | None = None  # a data node: (iteration, when its step was applied here)
        self.contrib_for: dict[int, frozenset] = {}  # a relay: iteration -> contributions held (from BEGIN)
        self.step_counts: dict[int, int] = {}
        self.lost_contributions: dict[int, int] = {}
        # data nodes: the IterationDone reports of each iteration, for the metrics record of whoever leads when its
        # step ends (also a report that reaches a new leader after BEGIN; Phases keeps only those before BEGIN)
        self.reports: dict[int, dict[str, m.IterationDone]] = {}
        self.opened: set[int] = set()  # a data node: the recent iterations whose aggregation it opened (leading)
        self.my_reports: dict[int, m.IterationDone] = {}
        self._leader: str | None = None  # the leader the phase was last handed
        self.last_iteration: int | None = None  # the last iteration whose step this node applied
        self.regroup = Regroup(wire.me, peers)  # who takes part in the rounds of the all-reduce (regroup.py)
        # a data node: stage -> the optimizer steps that stage's state holds in the run (an iteration whose
        # aggregation found the stage empty does not step it); `stage_steps`
        self.stage_held: dict[int, int] = {}
        self._held_from = stage.applied_steps
        self.allreduce_s = 0.0  # the last all-reduce round that summed, seconds (its waits included)
        self.rounds: dict[int, RoundOf] = {}  # a relay: steps -> how the step to them was summed (roundcheck.py)
        self.on_parted: Callable[[int, list[str], float], None] = lambda it, left_out, patience_s: None
        # (events the node wires: the phase opened an iteration; this node is left out of, or behind, a step)
        self.on_open: Callable[[int], None] = lambda iteration: None
        self.on_left_out: Callable[[int], None] = lambda iteration: None
        self.parts: dict[str, float] = {}  # the last step's aggregation, piece by piece (module doc), seconds

    # ------------------------------------------------------------------ reading
    def has_phases(self) -> bool:
        """This node takes part in the phase (it has a stage: `new_phases`)."""
        return self.phases is not None

    def aggregating(self) -> bool:
        """An aggregation begun here and not stepped yet."""
        ph = self.phases
        return ph is not None and any(it not in ph.stepped for it in ph.begun)

    def waiting(self, t: float) -> list:
        """What the phase waits for at `t` (`Phases.waiting`: status.json's `waiting_for`)."""
        return self.phases.waiting(t) if self.phases is not None else []

    def peers_at_work(self, t: float) -> set[str]:
        """The peers the phase waits for at `t` and this node's stage-mates in the aggregations begun and not
        stepped here (their all-reduce; liveness.py's `at_work`)."""
        return peers_at_work(self.phases, t, self.peers.stage) if self.phases is not None else set()

    def group(self, iteration: int, stage: int) -> set[str] | None:
        return self.phases.group(iteration, stage) if self.phases is not None else None

    def round_records(self, steps: int) -> tuple[m.RoundRecord, ...]:
        """How the steps up to `steps` of the state held here were summed, as far as recorded (roundcheck.py)."""
        return to_records(self.rounds, steps)

    def adopt_rounds(self, records: tuple[m.RoundRecord, ...], steps: int) -> None:
        """A state of `steps` steps was installed from a peer: its round records are this node's now."""
        self.rounds = from_records(records, steps)

    def stepping(self, iteration: int) -> bool:
        """BEGIN AGGREGATION of `iteration` reached this node and its step is not applied yet (its all-reduce may
        be running: a member that leaves first would leave its stage-mates' round without its parts)."""
        return (self.phases is not None and iteration in self.phases.begun
                and (self.last_iteration is None or self.last_iteration < iteration))

    def can_take_sent(self, iteration: int) -> bool:
        return self.phases is not None and iteration in self.phases.can_take_sent

    def stage_steps(self, stage: int) -> int:
        """A data node: optimizer steps the state of `stage` holds in the run, as far as this node knows.

        It is the run's step, except after aggregations in which the stage had
        no member (its state did not move then): what a relay coming back to an
        empty stage compares its checkpoint with (resume.py)."""
        held = self.stage_held.get(stage, self._held_from)
        if self.phases is not None:
            for it in sorted(self.phases.begun):
                if it >= held and self.phases.group(it, stage):
                    held = it + 1
        return held

    def run_steps(self) -> int:
        """A data node: the first iteration whose aggregation a stage state installed now can take part in."""
        begun = self.phases.begun if self.phases is not None else set()
        return max([self.stage.applied_steps] + [it + 1 for it in begun])

    def iteration_opened(self, iteration: int) -> None:
        """A data node opens `iteration` (CAN TAKE of the one before came back): the stages whose group stepped
        in the one before hold `iteration` steps."""
        if self.phases is None or iteration < 1:
            return
        for k in range(self.peers.n_stages):
            if self.phases.group(iteration - 1, k):
                self.stage_held[k] = iteration
            else:
                self.stage_held.setdefault(k, self.stage_steps(k))

    # ------------------------------------------------------------------ the phase
    def new_phases(self, *, ready: bool = True) -> None:
        """This node has a stage now: it takes part in the phase from here on; not `ready`: its state is not
        settled yet (a relay back with a checkpoint): a BEGIN naming it finds it out of step until `resynced`."""
        self.phases = Phases(self.wire.me, self.peers.stage, self.peers.n_stages - 1,
                             applied=self.stage.applied_steps if ready else NOT_READY,
                             retry_s=phase_retry_s(self.stage.busiest_s()), wait_bound_s=self.wait_bound_s())

    def wait_bound_s(self) -> float:
        """The bound of the phase's waits (waits.py `wait_bound_s`) from the longest work measured here: a piece of
        work of the stage, or the phase's own work lately (`phase_work_s`: over a slow uplink an all-reduce takes
        minutes, and every wait of the phase spans one)."""
        from .waits import wait_bound_s

        return wait_bound_s(max([self.stage.busiest_s(), *self.phase_work_s.values()]))

    def _phase_work(self, what: str, seconds: float) -> None:
        self.phase_work_s[what] = seconds
        if self.phases is not None:
            self.phases.wait_bound_s = self.wait_bound_s()

    def _apply(self, effects: list) -> None:
        if self.peers.role == "data":  # BEGIN that a data node sends as the leader carries the term it led
            effects = [Send(e.to, self._stamped(e.msg))
                       if isinstance(e, Send) and isinstance(e.msg, m.BeginAggregation) else e for e in effects]
        self.driver.carry(effects, self.own)

    def _stamped(self, msg: m.BeginAggregation) -> m.BeginAggregation:
        """BEGIN as this data node sends it: the term it led, on a BEGIN it made (term 0) or hands on as the
        acting leader; the leader's own term on a copy of the leader's BEGIN that it sends again to ask for a
        CAN TAKE (phasewaits.py; relays take that copy from any data node, authorize.py `duplicate_begin`)."""
        if msg.term and not self.leadership.is_leader():
            return msg
        return replace(msg, term=self.leadership.led_term)

    def _require_phases(self, msg: Any) -> Phases:
        if self.phases is None:
            raise FrameRefused(f"{type(msg).__name__} before this node has a stage", ban=False)
        return self.phases

    def on_timer(self, key: PhaseTimer | WatchTimer) -> None:
        if self.phases is not None:
            self._apply(self.phases.on_timer(now(), key))

    def on_ack(self, peer: str, msg: m.PhaseAck) -> None:
        self._apply(self._require_phases(msg).on_ack(now(), peer, msg))

    def on_begin(self, peer: str, msg: m.BeginAggregation) -> None:
        ph = self._require_phases(msg)
        fresh = msg.iteration not in ph.begun and msg.iteration >= ph.floor
        eff = ph.on_begin(now(), peer, msg, self.peers.next_stage_ids())
        begin = ph.begin_msgs.get(msg.iteration) if fresh else None  # (applied: groups by digest filled in)
        if begin is not None:
            contrib = self.begin_aggregation(begin.iteration, completed_named(begin))
            if self.peers.role == "relay" and self.microbatches.started:
                named = [set(g.peers) for g in begin.groups if g.stage == -1]
                if named:  # a data node that BEGIN leaves out died before it: its microbatches do not count
                    contrib = frozenset(k for k in contrib if k[0] in set.union(*named))
                self.contrib_for[begin.iteration] = contrib
        self._apply(eff)

    def on_can_take(self, peer: str, msg: m.CanTake) -> None:
        ph = self._require_phases(msg)
        self._apply(ph.on_can_take(now(), peer, msg, self.peers.next_stage_ids(), self.peers.prev_stage_ids()))

    def on_iteration_done(self, sender: str, msg: m.IterationDone) -> None:
        if self.peers.role != "data":
            raise FrameRefused("IterationDone sent to a relay")
        ph = self._require_phases(msg)
        self.reports.setdefault(msg.iteration, {})[sender] = msg
        leading = self.leadership.is_leader()
        if not leading:
            log.info("IterationDone from %s while not the acting leader: ignored (it resends)", self.peers.who(sender))
        else:
            self.leadership.iteration_aggregating(msg.iteration)
        self._open(ph.on_iteration_done(now(), sender, msg, leading=leading,
                                        data_nodes=self.peers.data_nodes_ready(msg.iteration),
                                        stage0=self.peers.ids("relay", 0), groups=self.peers.groups(msg.iteration)))

    def _maybe_begin(self, iteration: int) -> None:
        """At the acting leader: BEGIN AGGREGATION of `iteration` once every live data node reported it."""
        leading = self.leadership.is_leader()
        if leading and self.phases is not None:
            self._open(self.phases.maybe_begin(now(), iteration, leading=leading,
                                               data_nodes=self.peers.data_nodes_ready(iteration),
                                               stage0=self.peers.ids("relay", 0),
                                               groups=self.peers.groups(iteration)))

    def _open(self, eff: list) -> None:
        """Effects at the leader that may open an aggregation: the fault point sits before any BEGIN leaves."""
        for it in sorted({e.iteration for e in eff if isinstance(e, StartStep)}):
            if any(isinstance(e, Send) and isinstance(e.msg, m.BeginAggregation) for e in eff):
                self.opened = {i for i in self.opened if i >= it - 2} | {it}
                steps_log.info("iteration %d: opening the aggregation", it)
                self.faults.point("begin_open")
        self._apply(eff)

    def iteration_settled(self, iteration: int) -> None:
        """A data node's microbatches of `iteration` are all completed or deferred: report it to the leader."""
        done = self.microbatches.report(iteration)
        if self.phases is None or done is None:
            return
        steps_log.info("iteration %d settled: completed %s, deferred %d", iteration,
                       json.dumps(list(done.completed_seqs)), done.deferred)
        self.my_reports = {i: r for i, r in self.my_reports.items() if i >= iteration - 1}
        self.my_reports[iteration] = done
        self.reports.setdefault(iteration, {})[self.wire.me] = done
        if self.leadership.is_leader():  # (its own report counts too: alone, no other data node's would come)
            self.leadership.iteration_aggregating(iteration)
        self._apply(self.phases.report_done(now(), done))
        self._maybe_begin(iteration)

    def leader_changed(self) -> None:
        """A data node hands the phase the leader the election names now (a pending report follows it)."""
        if self.peers.role != "data" or self.phases is None:
            return
        lead = self.leadership.leader()
        front = self.peers.data_nodes() + self.peers.ids("relay", 0)
        self._apply(self.phases.set_leader(now(), lead, front=front))
        if lead == self.wire.me:
            for it in self.phases.pending_iterations():
                self._maybe_begin(it)
        if lead != self._leader and lead not in (None, self.wire.me):
            # the metrics report of an iteration that began under the old leader (Phases resends only reports of
            # iterations not begun): the new leader records that iteration when its step ends
            begun = [i for i in self.my_reports if i in self.phases.begun]
            if begun:
                self.wire.post(lead, self.my_reports[max(begun)])
        self._leader = lead

    async def leader_loop(self) -> None:
        """Data nodes: a lease can end without an event; look at who leads every LEADER_CHECK_S."""
        while True:
            await trio.sleep(LEADER_CHECK_S)
            self.leader_changed()

    async def send(self, peer: str, msg: Any) -> bool:
        """Send a phase signal (IterationDone, BEGIN AGGREGATION, CAN TAKE, PhaseAck), through the fault points."""
        kind = type(msg).__name__ + (f".{msg.kind.name}" if isinstance(msg, m.PhaseAck) else "")
        if self.faults.lose_first(kind, msg.iteration, peer):
            return True  # lost on the way, as far as the sender knows
        ok = await self.wire.send(peer, msg)
        if ok and isinstance(msg, m.BeginAggregation):
            self.faults.point("begin_sent")
        return ok

    # ------------------------------------------------------------------ peers
    def peer_back(self, peer: str) -> None:
        """A peer said Hello again after it was forgotten (a restart keeps its peer id)."""
        if self.phases is not None:  # (the signals it missed while forgotten go to it again)
            self._apply(self.phases.peer_back(now(), peer))

    def returned(self, peer: str, *, same_incarnation: bool) -> None:
        """A forgotten peer is back; with its incarnation it was alive throughout (regroup.py)."""
        self.regroup.returned(peer, same_incarnation=same_incarnation)

    def forget(self, peer: str, *, presumed: bool = False) -> None:
        """`peer` crashed (`presumed` dead) or left: nobody waits for its signals any more, none is resent to it."""
        self.regroup.forget(peer, presumed=presumed)
        if self.phases is not None:
            for it, reports in self.reports.items():  # as Phases: a dead data node's report does not count
                if it not in self.phases.begun:
                    reports.pop(peer, None)
            self._apply(self.phases.forget(now(), peer, self.peers.next_stage_ids(), self.peers.prev_stage_ids()))

    def after_gone(self, peer: str) -> None:
        """The leader need not wait for a gone data node's IterationDone; an all-reduce waiting for it is redone."""
        if self.peers.role == "data" and self.phases is not None:
            for it in self.phases.pending_iterations():
                self._maybe_begin(it)
        self.regroup.after_gone(peer, self.wire.spawn)

    def resynced(self, applied: int) -> None:
        """The stage state was installed with `applied` steps (a joiner, or after LeftOut / OutOfStep)."""
        if self.phases is not None:
            self._apply(self.phases.resynced(now(), applied, self.peers.next_stage_ids(), self.peers.prev_stage_ids()))

    # ------------------------------------------------------------------ the step
    def abstain(self, iteration: int) -> None:
        """BEGIN of `iteration` names this node but its state is behind that step (OutOfStep: a newcomer that
        loaded its state while the aggregation before ran).  Its stage-mates' all-reduce waits for every member
        named, so it takes part with nothing: a zero sum and a zero count, which change neither the stage's sum
        nor its count; it does not step, and fetches the state after that step from a stage peer
        (joining.resync)."""
        stage = self.peers.stage
        named = self.phases.group(iteration, stage) if self.phases is not None and stage is not None else None
        if not named or self.wire.me not in named or not self.stage.built:
            return
        self.wire.spawn(self._abstain, iteration, stage, sorted(named))

    async def _abstain(self, iteration: int, stage: int, group: list[str]) -> None:
        import torch

        model = self.stage.model
        log.info("iteration %d: out of step, taking part in the stage's all-reduce with nothing", iteration)
        try:
            zeros = await self.stage.run(lambda: torch.zeros_like(model.grad_vector()))
            await self._all_reduce_survivors(f"s{stage}/it{iteration}", group, zeros, 0.0)
        except Exception as e:  # noqa: BLE001 - the stage-mates then go on without it, as before
            log.warning("iteration %d: taking part with nothing failed: %s", iteration, e)

    def _out_of_step(self, e: OutOfStep) -> None:
        self.abstain(e.iteration)
        self.on_left_out(e.iteration)

    def _opened(self, e: OpenIteration) -> None:
        """The phase's effect: CAN TAKE came back, a data node opens the next iteration (or pauses)."""
        if self._stepped is not None and self._stepped[0] == e.iteration - 1:
            self._phase_work("can_take", now() - self._stepped[1])
        self._stepped = None
        self.iteration_opened(e.iteration)
        self.on_open(e.iteration)

    def start_step(self, e: StartStep) -> None:
        self.wire.spawn(self._step, e)

    async def _step(self, e: StartStep) -> None:
        t0, cpu0 = now(), time.process_time()
        relay = self.peers.role == "relay"
        keys: list = []  # relay: the contributions the recovery machine names (backward computed here, attempt
        if relay:  # not released), as (data node, seq, iteration)
            keys = sorted(self.contrib_for.pop(e.iteration, frozenset()))
            log.debug("iteration %d: aggregating %d contributions held here", e.iteration, len(keys))
        self.faults.point("aggregate")
        if keys:
            self.faults.point("aggregate_holding")
        model = self.stage.model
        if not relay:
            mine = self.microbatches.completed(e.iteration)
        else:
            mine = await self.stage.run(model.commit_many, keys)
        t_wait = now()
        await self.checkpointer.before_all_reduce()  # the checkpoint before is on disk on the CPU (checkpointer.py)
        t_grad = now()
        grad = self.faults.poison(await self.stage.run(model.grad_vector), e.iteration)
        t_ar = now()
        stage = self.peers.stage
        named = self.phases.named_group(e.iteration, stage)  # (as sent: regroup.py waits for one presumed dead)
        group = sorted(named) if named is not None else self.peers.stage_group()
        held = json.dumps(sorted([self.peers.who(d), seq] for d, seq, _it in keys))

        def announce(gkey: str) -> None:  # before each round: a member that dies after its round still said it
            if relay:
                log.debug("iteration %d: round %s: contributions %s", e.iteration, gkey, held)

        total, count, gkey, members = await self._all_reduce_survivors(
            f"s{stage}/it{e.iteration}", [self.wire.me] if self.faults.alone(e.iteration) else group, grad,
            float(mine), on_round=announce, max_count=e.microbatches)
        del grad  # (the sum is `total`: this part's gradient vector is not held through the step and checkpoint)
        t_step = now()
        if relay and count < e.microbatches:
            # the survivors' mean (protocol/recovery/): the missing contributions died with a relay
            self.lost_contributions[e.iteration] = int(e.microbatches - count)
            log.warning("iteration %d: stage %d holds %d of %d contributions (the rest died with a relay)",
                        e.iteration, stage, int(count), e.microbatches)
        if self.faults.busy_step_s:  # (fault injection: a step as long as a large model's)
            await self.stage.run(self.faults.busy_step)
        if relay:  # (recorded before the state holds the step: a snapshot taken meanwhile has no record of it)
            self.rounds = trim({**self.rounds, e.iteration + 1: RoundOf(float(count), tuple(members))})
        await self.stage.run(self.stage.apply_step, total, count, e.iteration)
        del total  # (nor is the summed vector held through the checkpoint: model/memory.py counts it so)
        t_ck = now()
        self.aggregation_done(e.iteration)
        self.stage.steps_done()
        self.on_stepped(e.iteration)
        self.step_counts[e.iteration] = e.microbatches
        if self.checkpointer.due(e.iteration):
            await self.checkpointer.after_step(self.wire.spawn)
        # the checkpoint: the state taken after this step, and the wait for the last one's file before the gradient
        self.stage.aggregation_cpu_s += time.process_time() - cpu0  # (all threads: status.json)
        self.parts = {"commit": t_wait - t0, "gradient": t_ar - t_grad, "all_reduce": t_step - t_ar,
                      "step": t_ck - t_step, "checkpoint": now() - t_ck + t_grad - t_wait}
        # one line per step (module doc "Logs"): at a relay the round that summed it and the contributions held here,
        # once they are in the stage's sum (what the tests rebuild the centralized reference from)
        took = f"aggregation {now() - t0:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in self.parts.items())
        if relay:
            steps_log.info("iteration %d: summed in round %s: contributions %s; %s", e.iteration, gkey, held, took)
        else:
            log.debug("iteration %d: %s", e.iteration, took)
        self.phases.retry_s = phase_retry_s(self.stage.busiest_s())
        self._phase_work("aggregation", now() - t0)
        self._stepped = None if relay else (e.iteration, now())
        if not relay and (self.leadership.leader() == self.wire.me or e.iteration in self.opened):
            self._record_metrics(e.iteration, now() - t0)
        self.last_iteration = e.iteration
        left_out = sorted(set(group) - set(members) - {self.wire.me})
        if relay and left_out:  # a member named may have stepped in a round of its own (cutcheck.py)
            self.on_parted(e.iteration, left_out, self.allreduce_timeout_s() + GROUP_CHANGE_WAIT_S + REJOIN_GRACE_S
                            + RETRY_CAP_S)
        self._apply(self.phases.on_step_done(now(), e.iteration, self.peers.next_stage_ids(),
                                             self.peers.prev_stage_ids()))

    def checkpoint(self) -> None:
        """This node's part written now (parameters and optimizer state, with the steps applied to it), after a write
        in flight: when the node leaves or stops (checkpointer.py)."""
        self.checkpointer.write_now()

    def _record_metrics(self, t: int, step_s: float) -> None:
        """metrics.jsonl's record of iteration `t`, at the data node that opened its aggregation or leads when its
        step ends, from the reports of the data nodes its BEGIN named (a dead one's died with it: the data part
        steps on the survivors').  A node missing a live one's records nothing: one that believed itself leader
        for a moment during an election held its own report only, while the leader that began has them all or
        was handed them (`leader_changed`)."""
        ph = self.phases
        reports = self.reports.get(t, {})
        begin = ph.begin_msgs.get(t)
        if begin is not None and begin.completed:
            named = {c.data_node for c in begin.completed}
            if not {d for d in named if not self.peers.is_gone(d)} <= set(reports):
                log.info("iteration %d: no metrics record here (reports of %s missing)", t,
                         ", ".join(self.peers.who(d) for d in sorted(named - set(reports))))
                return
            reports = {d: reports[d] for d in named if d in reports}
        completed = sum(r.completed for r in reports.values())
        loss_sum = sum(reports[d].loss_sum for d in sorted(reports))
        seconds = self.microbatches.seconds()
        data = self.stage.manifest.data
        rec = {
            "iteration": t,
            "loss": loss_sum / completed if completed else None,
            "microbatches": completed,
            "samples": completed * data.microbatch_size,
            "completed": completed,
            "deferred": sum(r.deferred for r in reports.values()),
            "lost": sum(r.lost for r in reports.values()),
            "seconds": round(seconds, 4),
            "aggregation_seconds": round(step_s, 4),
            "aggregation_parts": {k: round(v, 4) for k, v in self.parts.items()},
            "pipeline_seconds": round(self.microbatches.pipeline_seconds(t), 4),
            "relays": sum(len(v) for k, v in (ph.groups.get(t) or {}).items() if k >= 0),
            "time": time.time(),
        }
        with open(self.state_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        steps_log.info("iteration %d loss %.4f microbatches %d %.2f s", t, rec["loss"] or math.nan, completed, seconds)
        for i in [i for i in self.reports if i < t]:
            del self.reports[i]

    def allreduce_timeout_s(self) -> float:
        """max(ALLREDUCE_TIMEOUT_S, ALLREDUCE_FACTOR x the last all-reduce's duration) (120 s, 4x: a large model
        over a slow link takes minutes)."""
        return max(ALLREDUCE_TIMEOUT_S, ALLREDUCE_FACTOR * self.allreduce_s)

    async def on_chunk(self, peer: str, msg: m.AllReduceChunk, payload) -> None:
        await self.allreducer.on_chunk(peer, msg, payload)

    async def _all_reduce_survivors(self, base: str, named: list[str], grad, mine: float,
                                    on_round: Callable[[str], None] = lambda gkey: None,
                                    max_count: float | None = None):
        """All-reduce among the members of `named` still alive, redone when one dies meanwhile (regroup.py): (sum,
        count, the key of the round that summed them, its members).  `on_round(key)` is called before each round."""
        from .allreduce import RUN_WIRE

        async def run_round(gkey: str, group: list[str]):
            t0 = now()
            out = await self.allreducer.all_reduce(gkey, group, grad, mine, timeout=self.allreduce_timeout_s(),
                                                   max_count=max_count,
                                                   wire=RUN_WIRE[self.stage.manifest.train.wire_dtype])
            self.allreduce_s = now() - t0
            return out

        result, gkey, group = await self.regroup.all_reduce(base, named, run_round, on_round)
        total, count = result if result is not None else (grad, mine)
        return total, count, gkey, group

    def status(self) -> AggregationStatus:
        """What the status shows of the aggregation (snapshots.py): copies, built now."""
        last = getattr(self.allreducer, "last_round", None)
        return AggregationStatus(self.aggregating(), self.last_iteration, dict(self.parts),
                                 dict(last) if last is not None else None, dict(self.lost_contributions))


def phase_retry_s(busiest_s: float) -> float:
    """The phase signals' retransmission period: the longest work measured (`LocalStage.busiest_s`), within
    [pipeline RETRY_S, RETRY_CAP_S] (2 s to 30 s: a peer busy stepping for 20 s is not sent the same signal ten
    times, and a lost signal is still resent within 30 s)."""
    return min(RETRY_CAP_S, max(RETRY_S, busiest_s))


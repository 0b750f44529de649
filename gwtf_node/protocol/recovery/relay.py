"""A relay's side: taking a microbatch, handing it on along the flows or a recovery chain, answering probes and
repair orders (below, and rounds.py, "Backward pass, GWTF": what a relay executes there).

`RelaySide` owns a relay's records (`RelayRecord`, written only here) and
the contributions it holds for the aggregation (node.py); it reads the
neighbours and asks `node.routing` for next hops and deadlines.

Forward pass (both policies; V-D "as in SWARM")
-----------------------------------------------
A node that computed a stage sends `Complete` to the node it got the input
from, hands its output to a next hop and keeps it (the stash) until the
backward came back through it.  The hand-off waits for the next hop's
`Complete`: deadline `now + K * est(peer) * (1 + my hand-offs to that peer
still waiting) + MARGIN_S`, `est` an EWMA of measured hand-off -> Complete
times initialised from the prior of `priors.py` (the link's transfer plus a
compute allowance; the daemon and the simulator both use it).
No `Complete` in time: the next hop is presumed dead, its units of flow move
to live peers of its stage with room (local flow repair), and the output is
resent from the stash to another next hop (GWTF: along the flows; SWARM:
greedy).  A receiver without room answers `MbDeny`; a peer that sent
`MbDeny` gets no new work until it sends `Room` (a relay sends `Room` to
the peers it denied when a slot frees, when a next-stage peer sends it
`Room` or joins, never while it has no live next-stage peer).  With no next
hop that has room (or no live one at all), a relay *parks* the microbatch:
it keeps its output, its slot and any repair order, and tries again on a
`Room`, on a slot of its own freeing, on a next-stage joiner, or once after
a deadline (K x its slowest next-stage estimate, if a peer is left); that
retry failing, it sends `MbDeny` upstream and drops it (or, executing a
repair order, reports `BackwardStuck`); recursively up to the data node,
which parks it with its embedding output (a new attempt, the holders
released, no recompute) while others are in flight and retries on every
slot-freeing event (`DataSide.launch`), or defers it.  A data node whose recovery
finds every live stage-0 relay full parks it the same way.
Capacity counts microbatches whose activations
a node holds (taken until its backward is computed); the gradient a node
sent upstream is kept (one tensor, for recovery) until the microbatch is
released or the iteration aggregates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection, Mapping

from ..completions import counts
from ..effects import CancelTimer, Send, SetTimer
from ..messages import (
    Backward, BackwardStuck, Complete, Forward, MbDeny, MbState, Probe, Recover, Release, RepairOrder, Resume, Room,
)
from .records import Compute, ComputeKind, Key, MbTimer, RecoveryEffect, RelayPhase, TimerKind, cancel_timers

if TYPE_CHECKING:
    from .node import RecoveryNode


@dataclass
class RelayRecord:
    """A relay's record of one microbatch (one attempt)."""

    key: Key
    attempt: int
    prev: str
    path: tuple[str, ...]  # the path up to me, me included
    phase: RelayPhase = RelayPhase.FWD
    next: str | None = None
    rest: tuple[str, ...] = ()  # recovery chain: the stages after me ("" = replace, else resume there)
    tried: set[str] = field(default_factory=set)  # next hops tried ("": the parked retry is spent)
    sent_at: float = 0.0
    ordered: bool = False  # executing a RepairOrder: my stash is the original forward's, keep it on failure
    parked: bool = False  # no next hop with room: output (and any repair order) kept, retried (relay.py)
    chain: tuple[str, ...] = ()  # the relays after me that computed the backward I got (`Backward.chain`)


class RelaySide:
    """A relay's microbatches (`records`) and the contributions it holds for the aggregation (node.py)."""

    def __init__(self) -> None:
        self.records: dict[Key, RelayRecord] = {}
        self.contrib: dict[int, set[Key]] = {}  # iteration -> keys whose backward this relay computed
        self.orphaned: dict[int, set[Key]] = {}  # contributions of data nodes gone before BEGIN (node.py's rule)
        self.attempt_of: dict[Key, int] = {}  # a contribution held -> the attempt whose backward computed it
        # the aggregation phase, as the driver reports it (begin_aggregation, aggregation_done)
        self.begun: set[int] = set()
        self.stepped: set[int] = set()
        self.last_iteration: int | None = None  # leaving: the last iteration it takes microbatches of
        self.applied: int | None = None  # the steps its part's parameters hold, as the driver tells (`parameters_at`)

    # -- its records and contributions
    def drop(self, node: RecoveryNode, key: Key, eff: list[RecoveryEffect]) -> None:
        if self.records.pop(key, None) is None:
            return
        cancel_timers(key, eff)
        self.room(node, eff)

    def contribute(self, key: Key, attempt: int) -> None:
        """It computed the backward of `key` in `attempt`; the gradient counts in its iteration if BEGIN names that
        attempt (`begin_aggregation`)."""
        self.contrib.setdefault(key.iteration, set()).add(key)
        self.attempt_of[key] = attempt

    def uncontribute(self, key: Key) -> None:
        """The gradient of `key` it holds is void (a Release, or a new attempt)."""
        self.contrib.get(key.iteration, set()).discard(key)
        self.attempt_of.pop(key, None)

    def data_node_gone(self, node: RecoveryNode, peer: str, eff: list[RecoveryEffect]) -> None:
        """Data node `peer` died: its microbatches are dropped; its contributions of iterations not begun here
        count only if BEGIN names them (`orphaned`, node.py's module doc)."""
        for key in [k for k in self.records if k.data_node == peer]:
            self.drop(node, key, eff)
        for it, keys in self.contrib.items():
            if it not in self.begun:
                self.orphaned.setdefault(it, set()).update(k for k in keys if k.data_node == peer)
                self.contrib[it] = {k for k in keys if k.data_node != peer}

    def unorphan(self, peer: str) -> None:
        """`peer` is back: what its old incarnation left orphaned here is forgotten."""
        for keys in self.orphaned.values():
            keys -= {k for k in keys if k.data_node == peer}

    def parameters_at(self, applied: int) -> None:
        """Its part holds `applied` steps now (`RecoveryNode.parameters_at`)."""
        self.applied = applied

    def leave_after(self, it: int) -> None:
        self.last_iteration = it

    def begin(self, node: RecoveryNode, it: int, completed: Mapping[str, Collection[int]] | None,
              eff: list[RecoveryEffect]) -> frozenset[Key]:
        """BEGIN AGGREGATION of `it`: drop what is left of its microbatches; the contributions that count
        (`RecoveryNode.begin_aggregation`)."""
        self.begun.add(it)
        if not node.is_data:
            for key in [k for k in self.records if k.iteration <= it]:
                self.drop(node, key, eff)
            node.peers.new_iteration(relay=True)
        held = self.contrib.get(it, set())
        orphans = self.orphaned.pop(it, set())
        if completed is None:
            return frozenset(held)
        counted = frozenset(k for k in held | orphans if self._named(node, k, completed))
        node.stats.bump(uncounted=len(held) - len(counted))
        return counted

    def _named(self, node: RecoveryNode, key: Key, completed: Mapping[str, Collection[int]]) -> bool:
        """BEGIN names `key`'s microbatch and, where it names them, the attempt and this stage's holder that
        completed it are this relay's gradient's (protocol/completions.py)."""
        return counts(completed, key.data_node, key.seq, node.stage, node.me, self.attempt_of.get(key))

    def stepped_at(self, node: RecoveryNode, it: int, eff: list[RecoveryEffect]) -> None:
        """The step of `it` is applied here: room again for the next iteration's microbatches.  The contributions
        of `it` and of any earlier iteration it never aggregated (a state downloaded instead) are gone with the
        step, as the part's held gradients are (`StageModel.apply_mean_grad`)."""
        self.stepped.add(it)
        if self.applied is not None:
            self.applied = max(self.applied, it + 1)
        self.contrib = {i: keys for i, keys in self.contrib.items() if i > it}
        self.orphaned = {i: keys for i, keys in self.orphaned.items() if i > it}
        self.attempt_of = {k: a for k, a in self.attempt_of.items() if k.iteration > it}
        self.room(node, eff)

    # -- what it tells others
    def room(self, node: RecoveryNode, eff: list[RecoveryEffect]) -> None:
        peers = node.peers
        if peers.denied and not node.is_data and (
                node.stage == node.cfg.last_stage or node.routing.live_next(node)):
            free = node.routing.room_left(node)
            if free > 0:
                for p in sorted(peers.denied):
                    eff.append(Send(p, Room(free)))
                peers.room_told()

    def deny(self, node: RecoveryNode, to: str, key: Key, attempt: int, eff: list[RecoveryEffect]) -> None:
        node.stats.bump(denies_sent=1)
        node.peers.deny(to)
        eff.append(Send(to, MbDeny(*key, attempt)))

    def report(self, node: RecoveryNode, key: Key, attempt: int, state: RelayPhase,
               eff: list[RecoveryEffect]) -> None:
        eff.append(Send(key.data_node, MbState(*key, attempt, node.stage, state.value)))

    def message(self, node: RecoveryNode, now: float, sender: str, key: Key, msg, eff: list[RecoveryEffect]) -> None:
        """A microbatch message at a relay, handed to its handler (`RELAY_HANDLERS`, at the end of this module)."""
        t = type(msg)
        a = msg.attempt
        r: RelayRecord | None = self.records.get(key)
        handler = RELAY_ANY_ATTEMPT.get(t)
        if handler is not None:
            handler(self, node, now, sender, key, msg, r, eff)
            return
        if r is None or a < r.attempt:
            if r is not None:
                node.stats.bump(stale=1)
            stale = RELAY_STALE.get(t)
            if stale is not None:
                stale(self, node, sender, key, msg, eff)
            return
        r.attempt = a
        handler = RELAY_HANDLERS.get(t)
        if handler is not None:
            handler(self, node, now, sender, key, msg, r, eff)

    def _on_probe(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Probe, r: RelayRecord | None,
                  eff: list[RecoveryEffect]) -> None:
        a = msg.attempt
        self.report(node, key, a, RelayPhase.NONE if r is None or r.attempt > a else r.phase, eff)
        if r is not None and r.attempt < a:
            r.attempt = a

    def _on_release(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Release, r: RelayRecord | None,
                    eff: list[RecoveryEffect]) -> None:
        if r is None or r.attempt <= msg.attempt:
            self.uncontribute(key)
            self.drop(node, key, eff)

    def _stale_resume(self, node: RecoveryNode, sender: str, key: Key, msg: Resume, eff: list[RecoveryEffect]) -> None:
        eff.append(Send(sender, MbDeny(*key, msg.attempt)))  # I hold nothing to resume from

    def _stale_repair(self, node: RecoveryNode, sender: str, key: Key, msg: RepairOrder,
                      eff: list[RecoveryEffect]) -> None:
        self.report(node, key, msg.attempt, RelayPhase.NONE, eff)

    def _on_complete(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Complete, r: RelayRecord,
                     eff: list[RecoveryEffect]) -> None:
        if r.phase is RelayPhase.SENDING and sender == r.next:
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            if not (r.rest and r.rest[0] == sender):  # (the answer to a Resume is no hand-off time)
                node.peers.measure(sender, now - r.sent_at)
            r.phase, r.rest, r.ordered = RelayPhase.SENT, (), False
            r.tried.clear()
        elif r.phase is RelayPhase.GRAD and sender == r.prev:
            eff.append(CancelTimer(MbTimer(TimerKind.BK, key)))
            node.peers.measure(sender, now - r.sent_at)
            r.phase = RelayPhase.DONE

    def _on_deny(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: MbDeny, r: RelayRecord,
                 eff: list[RecoveryEffect]) -> None:
        # (also after its Complete: the next hop acknowledged, then found no route on and handed it back)
        if r.phase in (RelayPhase.SENDING, RelayPhase.SENT) and sender == r.next:
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            r.tried.add(sender)
            node.stats.bump(reroutes=1)
            self._route(node, now, r, eff)

    def _on_backward(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Backward, r: RelayRecord,
                     eff: list[RecoveryEffect]) -> None:
        if r.phase in (RelayPhase.SENT, RelayPhase.SENDING):
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            r.next, r.phase, r.rest, r.chain = sender, RelayPhase.BWD, (), tuple(msg.chain)
            eff.append(Compute(ComputeKind.BACKWARD, key))

    def _on_resume(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Resume, r: RelayRecord,
                   eff: list[RecoveryEffect]) -> None:
        # the sender recomputed the stage before me (or the data node asks me to resend): it is my upstream
        a = msg.attempt
        newprev = msg.path[-1] if msg.path else sender
        r.prev = newprev
        eff.append(Send(newprev, Complete(*key, a)))
        if r.phase in (RelayPhase.GRAD, RelayPhase.DONE):
            node.stats.bump(resends=1)
            r.phase, r.sent_at = RelayPhase.GRAD, now
            eff.append(Send(newprev, Backward(*key, None, a, (node.me, *r.chain))))
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), node.routing.deadline(node, now, newprev)))

    def _on_repair(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: RepairOrder, r: RelayRecord,
                   eff: list[RecoveryEffect]) -> None:
        if r.phase is not RelayPhase.SENT:
            self.report(node, key, msg.attempt, r.phase, eff)  # (sending: my own deadline covers it)
            return
        r.ordered = True
        if node.stage < node.cfg.last_stage:
            node.routing.presume_dead(node, r.next)
        tried_before = r.tried
        r.tried = {r.next} if r.next is not None and r.next not in node.cfg.data_nodes else set()
        r.tried |= {""} & tried_before  # (a parked record's one deadline retry is spent)
        r.rest = tuple(msg.rest)
        node.stats.bump(reroutes=1)
        self._route(node, now, r, eff)

    def _fw_timer(self, node: RecoveryNode, now: float, r: RelayRecord, eff: list[RecoveryEffect]) -> None:
        """A hand-off's deadline passed (the next hop is presumed dead), or a parked microbatch's retry is due."""
        if r.phase is RelayPhase.SENDING:
            node.stats.bump(reroutes=1)
            node.routing.presume_dead(node, r.next)
            r.tried.add(r.next)
            self._route(node, now, r, eff)
        elif r.parked:
            node.peers.offer_again()  # no Room came: offer it to them again, once
            r.tried = {""}
            self._route(node, now, r, eff)

    def _bk_timer(self, node: RecoveryNode, now: float, r: RelayRecord, eff: list[RecoveryEffect]) -> None:
        """My gradient's hand-off upstream was not acknowledged in time: GWTF tells the data node."""
        if r.phase is RelayPhase.GRAD and not node.swarm:
            eff.append(Send(r.key.data_node, BackwardStuck(*r.key, node.stage, r.attempt)))

    def _on_take(self, node: RecoveryNode, now: float, sender: str, key: Key, msg, r: RelayRecord | None,
                 eff: list[RecoveryEffect]) -> None:
        a = msg.attempt
        if r is not None:
            if a < r.attempt or (a == r.attempt and type(msg) is Forward):
                # stale, or a second branch of the same attempt (an upstream presumed me dead): keep mine
                node.stats.bump(stale=1)
                if r.phase != RelayPhase.FWD:
                    eff.append(Send(sender, Complete(*key, a)))
                return
            if a > r.attempt:
                self.uncontribute(key)  # the old attempt's gradient is not trained on
            self.drop(node, key, eff)  # a newer attempt, or a repair the data node ordered: it supersedes mine
        aggregating = (msg.iteration - 1) in self.begun and (msg.iteration - 1) not in self.stepped
        leaving = self.last_iteration is not None and msg.iteration > self.last_iteration
        off_step = self.applied is not None and self.applied != msg.iteration  # (left out of a step: behind)
        if msg.iteration in self.begun or aggregating or off_step or leaving or node.routing.room_left(node) <= 0:
            self.deny(node, sender, key, a, eff)  # (aggregating, off step: my parameters are not this iteration's)
            return
        recover = type(msg) is Recover
        self.records[key] = RelayRecord(key, a, sender, tuple(msg.path) + (node.me,),
                                        rest=tuple(msg.rest) if recover else ())
        self.report(node, key, a, RelayPhase.REC if recover else RelayPhase.FWD, eff)
        eff.append(Compute(ComputeKind.RECOMPUTE if recover else ComputeKind.FORWARD, key))

    def compute_done(self, node: RecoveryNode, now: float, r: RelayRecord, kind: ComputeKind,
                     eff: list[RecoveryEffect]) -> None:
        key = r.key
        if r.phase is RelayPhase.FWD and kind in (ComputeKind.FORWARD, ComputeKind.RECOMPUTE):
            eff.append(Send(r.prev, Complete(*key, r.attempt)))
            self._route(node, now, r, eff)
        elif r.phase is RelayPhase.BWD and kind is ComputeKind.BACKWARD:
            self.contribute(key, r.attempt)
            eff.append(Send(r.next, Complete(*key, r.attempt)))
            eff.append(Send(r.prev, Backward(*key, None, r.attempt, (node.me, *r.chain))))
            r.phase, r.sent_at = RelayPhase.GRAD, now
            self.report(node, key, r.attempt, RelayPhase.GRAD, eff)  # backward progress (the data node's act_on_gone)
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), node.routing.deadline(node, now, r.prev)))
            self.room(node, eff)
            self.retry_parked(node, now, eff)  # my slot at my next hop freed

    def compute_failed(self, node: RecoveryNode, r: RelayRecord, kind: ComputeKind,
                       eff: list[RecoveryEffect]) -> None:
        """The driver could not run `kind` for `r`: its input or its stashed activations are gone (a stage state
        loaded over them, a release).  A computation of the record's phase is not to come, so the microbatch is
        forgotten here: a probe finds it NONE and the data node repairs it, where a record left computing would
        be waited for (rounds.py's waits)."""
        fwd = r.phase is RelayPhase.FWD and kind in (ComputeKind.FORWARD, ComputeKind.RECOMPUTE)
        if fwd or (r.phase is RelayPhase.BWD and kind is ComputeKind.BACKWARD):
            self.drop(node, r.key, eff)

    def retry_parked(self, node: RecoveryNode, now: float, eff: list[RecoveryEffect]) -> None:
        """A route again (a Room, a slot freed at the next hop, a next peer back): the parked ones try again."""
        for r in [r for r in self.records.values() if r.parked]:
            r.parked, r.tried = False, set()
            self._route(node, now, r, eff)

    def _route(self, node: RecoveryNode, now: float, r: RelayRecord, eff: list[RecoveryEffect]) -> None:
        """Hand my stashed output on: along `rest` (a recovery chain) or the flows / greedy."""
        key, a = r.key, r.attempt
        r.parked = False
        recovering = bool(r.rest)
        if recovering and r.rest[0] != "" and not r.tried:
            j = r.rest[0]
            r.next, r.phase, r.sent_at = j, RelayPhase.SENDING, now
            eff.append(Send(j, Resume(*key, r.path, r.rest[1:], None, a)))
            # a Resume is a control message answered at once (Complete): no tensor hand-off to wait for
            eff.append(SetTimer(MbTimer(TimerKind.FW, key), now + node.cfg.probe_wait_s + node.cfg.margin_s))
            return
        j = node.routing.choose_next(node, key.data_node, r.tried)
        if recovering and r.rest[0] != "" and j is not None and r.tried:
            # the node to resume at did not answer: it is dead too, so its stage is recomputed as well
            r.rest = ("",) + r.rest[1:]
        if j is None:
            if node.stage < node.cfg.last_stage and "" not in r.tried and (
                    recovering or r.ordered or not node.cfg.one_wave):
                # every live next-stage peer is full (or none is left): keep my output (and a repair order) and
                # my slot; retried on a Room, a slot of mine freeing, a joiner of the next stage, or once on
                # this timer (then: as below)
                r.phase, r.next, r.parked = RelayPhase.SENT, None, True
                r.tried.clear()
                if r.ordered:
                    self.report(node, key, a, RelayPhase.SENT, eff)
                peers = node.routing.live_next(node) or list(node.peers.next_peers)
                prior = node.cfg.default_prior_s
                wait = max((node.peers.est.get(j, prior) for j in peers), default=prior)
                eff.append(SetTimer(MbTimer(TimerKind.FW, key), now + node.cfg.k * wait + node.cfg.margin_s))
                return
            if r.ordered:
                # I was ordered to repair and cannot: keep my stash, tell the data node (its next round decides)
                r.phase, r.rest, r.ordered = RelayPhase.SENT, (), False
                r.tried.clear()
                self.report(node, key, a, RelayPhase.SENT, eff)
                eff.append(Send(key.data_node, BackwardStuck(*key, node.stage, a)))
                return
            prev = r.prev
            self.records.pop(key, None)  # no Room for this freed slot: I have no route, not just no room
            cancel_timers(key, eff)
            self.deny(node, prev, key, a, eff)
            return
        r.next, r.phase, r.sent_at = j, RelayPhase.SENDING, now
        if recovering:
            node.stats.bump(recovers=1)
            eff.append(Send(j, Recover(*key, r.path, r.rest[1:], None, a)))
        else:
            eff.append(Send(j, Forward(*key, r.path, None, a)))
        eff.append(SetTimer(MbTimer(TimerKind.FW, key), node.routing.deadline(node, now, j)))


# Which handler takes which microbatch message at a relay.  Whatever its attempt: taking a microbatch (a newer
# attempt replaces the record, an older one is stale: `_on_take`), a probe, a release.
RELAY_ANY_ATTEMPT = {
    Forward: RelaySide._on_take,
    Recover: RelaySide._on_take,
    Probe: RelaySide._on_probe,
    Release: RelaySide._on_release,
}
# Of an attempt older than the record's, or of a microbatch not held (the stale answers; others are ignored).
RELAY_STALE = {
    Resume: RelaySide._stale_resume,
    RepairOrder: RelaySide._stale_repair,
}
# Of the record's attempt, or a newer one (the record takes its attempt); a type not here is ignored.
RELAY_HANDLERS = {
    Complete: RelaySide._on_complete,
    MbDeny: RelaySide._on_deny,
    Backward: RelaySide._on_backward,
    Resume: RelaySide._on_resume,
    RepairOrder: RelaySide._on_repair,
}
# A relay's timers (the data node's: data.DATA_TIMERS and rounds.ROUND_TIMERS).
RELAY_TIMERS = {
    TimerKind.FW: RelaySide._fw_timer,
    TimerKind.BK: RelaySide._bk_timer,
}

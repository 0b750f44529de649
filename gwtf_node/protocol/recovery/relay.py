"""A relay's side: taking a microbatch, handing it on along the flows or a recovery chain, answering probes and
repair orders (below, and rounds.py, "Backward pass, GWTF": what a relay executes there).

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
slot-freeing event (`_launch`), or defers it.  A data node whose recovery
finds every live stage-0 relay full parks it the same way.
Capacity counts microbatches whose activations
a node holds (taken until its backward is computed); the gradient a node
sent upstream is kept (one tensor, for recovery) until the microbatch is
released or the iteration aggregates.
"""

from __future__ import annotations

from ..effects import CancelTimer, Send, SetTimer
from ..messages import Backward, BackwardStuck, Complete, Forward, MbDeny, Probe, Recover, Release, RepairOrder, Resume
from .records import Compute, ComputeKind, Key, MbTimer, RecoveryEffect, RelayPhase, RelayRecord, TimerKind


class RelaySide:
    """Part of `RecoveryNode` (node.py): one mechanism of the machine, see the module docstring."""

    def _relay_message(self, now: float, sender: str, key: Key, msg, eff: list[RecoveryEffect]) -> None:
        """A microbatch message at a relay, handed to its handler (`RELAY_HANDLERS`, at the end of this module)."""
        t = type(msg)
        a = msg.attempt
        r: RelayRecord | None = self.mbs.get(key)
        handler = RELAY_ANY_ATTEMPT.get(t)
        if handler is not None:
            handler(self, now, sender, key, msg, r, eff)
            return
        if r is None or a < r.attempt:
            if r is not None:
                self.stats.bump(stale=1)
            stale = RELAY_STALE.get(t)
            if stale is not None:
                stale(self, sender, key, msg, eff)
            return
        r.attempt = a
        handler = RELAY_HANDLERS.get(t)
        if handler is not None:
            handler(self, now, sender, key, msg, r, eff)

    def _on_probe(self, now: float, sender: str, key: Key, msg: Probe, r: RelayRecord | None,
                  eff: list[RecoveryEffect]) -> None:
        a = msg.attempt
        self._report(key, a, RelayPhase.NONE if r is None or r.attempt > a else r.phase, eff)
        if r is not None and r.attempt < a:
            r.attempt = a

    def _on_release(self, now: float, sender: str, key: Key, msg: Release, r: RelayRecord | None,
                    eff: list[RecoveryEffect]) -> None:
        if r is None or r.attempt <= msg.attempt:
            self._uncontribute(key)
            self._drop(key, eff)

    def _stale_resume(self, sender: str, key: Key, msg: Resume, eff: list[RecoveryEffect]) -> None:
        eff.append(Send(sender, MbDeny(*key, msg.attempt)))  # I hold nothing to resume from

    def _stale_repair(self, sender: str, key: Key, msg: RepairOrder, eff: list[RecoveryEffect]) -> None:
        self._report(key, msg.attempt, RelayPhase.NONE, eff)

    def _on_complete(self, now: float, sender: str, key: Key, msg: Complete, r: RelayRecord,
                     eff: list[RecoveryEffect]) -> None:
        if r.phase is RelayPhase.SENDING and sender == r.next:
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            if not (r.rest and r.rest[0] == sender):  # (the answer to a Resume is no hand-off time)
                self._measure(sender, now - r.sent_at)
            r.phase, r.rest, r.ordered = RelayPhase.SENT, (), False
            r.tried.clear()
        elif r.phase is RelayPhase.GRAD and sender == r.prev:
            eff.append(CancelTimer(MbTimer(TimerKind.BK, key)))
            self._measure(sender, now - r.sent_at)
            r.phase = RelayPhase.DONE

    def _on_deny(self, now: float, sender: str, key: Key, msg: MbDeny, r: RelayRecord,
                 eff: list[RecoveryEffect]) -> None:
        # (also after its Complete: the next hop acknowledged, then found no route on and handed it back)
        if r.phase in (RelayPhase.SENDING, RelayPhase.SENT) and sender == r.next:
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            r.tried.add(sender)
            self.stats.bump(reroutes=1)
            self._route(now, r, eff)

    def _on_backward(self, now: float, sender: str, key: Key, msg: Backward, r: RelayRecord,
                     eff: list[RecoveryEffect]) -> None:
        if r.phase in (RelayPhase.SENT, RelayPhase.SENDING):
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            r.next, r.phase, r.rest = sender, RelayPhase.BWD, ()
            eff.append(Compute(ComputeKind.BACKWARD, key))

    def _on_resume(self, now: float, sender: str, key: Key, msg: Resume, r: RelayRecord,
                   eff: list[RecoveryEffect]) -> None:
        # the sender recomputed the stage before me (or the data node asks me to resend): it is my upstream
        a = msg.attempt
        newprev = msg.path[-1] if msg.path else sender
        r.prev = newprev
        eff.append(Send(newprev, Complete(*key, a)))
        if r.phase in (RelayPhase.GRAD, RelayPhase.DONE):
            self.stats.bump(resends=1)
            r.phase, r.sent_at = RelayPhase.GRAD, now
            eff.append(Send(newprev, Backward(*key, None, a)))
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), self._deadline(now, newprev)))

    def _on_repair(self, now: float, sender: str, key: Key, msg: RepairOrder, r: RelayRecord,
                   eff: list[RecoveryEffect]) -> None:
        if r.phase is not RelayPhase.SENT:
            self._report(key, msg.attempt, r.phase, eff)  # (sending: my own deadline covers it)
            return
        r.ordered = True
        if self.stage < self.cfg.last_stage:
            self._presume_dead(r.next)
        tried_before = r.tried
        r.tried = {r.next} if r.next is not None and r.next not in self.cfg.data_nodes else set()
        r.tried |= {""} & tried_before  # (a parked record's one deadline retry is spent)
        r.rest = tuple(msg.rest)
        self.stats.bump(reroutes=1)
        self._route(now, r, eff)

    def _fw_timer(self, now: float, r: RelayRecord, eff: list[RecoveryEffect]) -> None:
        """A hand-off's deadline passed (the next hop is presumed dead), or a parked microbatch's retry is due."""
        if r.phase is RelayPhase.SENDING:
            self.stats.bump(reroutes=1)
            self._presume_dead(r.next)
            r.tried.add(r.next)
            self._route(now, r, eff)
        elif r.parked:
            self.peers.offer_again()  # no Room came: offer it to them again, once
            r.tried = {""}
            self._route(now, r, eff)

    def _bk_timer(self, now: float, r: RelayRecord, eff: list[RecoveryEffect]) -> None:
        """My gradient's hand-off upstream was not acknowledged in time: GWTF tells the data node."""
        if r.phase is RelayPhase.GRAD and not self.swarm:
            eff.append(Send(r.key.data_node, BackwardStuck(*r.key, self.stage, r.attempt)))

    def _on_take(self, now: float, sender: str, key: Key, msg, r: RelayRecord | None,
                 eff: list[RecoveryEffect]) -> None:
        a = msg.attempt
        if r is not None:
            if a < r.attempt or (a == r.attempt and type(msg) is Forward):
                # stale, or a second branch of the same attempt (an upstream presumed me dead): keep mine
                self.stats.bump(stale=1)
                if r.phase != RelayPhase.FWD:
                    eff.append(Send(sender, Complete(*key, a)))
                return
            if a > r.attempt:
                self._uncontribute(key)  # the old attempt's gradient is not trained on
            self._drop(key, eff)  # a newer attempt, or a repair the data node ordered: it supersedes mine
        aggregating = (msg.iteration - 1) in self.begun and (msg.iteration - 1) not in self.stepped
        leaving = self.last_iteration is not None and msg.iteration > self.last_iteration
        if msg.iteration in self.begun or aggregating or leaving or self._slots_used() >= self.cfg.capacity:
            self._deny(sender, key, a, eff)  # (aggregating: my parameters are not those of this iteration yet)
            return
        recover = type(msg) is Recover
        self._keep(RelayRecord(key, a, sender, tuple(msg.path) + (self.me,), rest=tuple(msg.rest) if recover else ()))
        self._report(key, a, RelayPhase.REC if recover else RelayPhase.FWD, eff)
        eff.append(Compute(ComputeKind.RECOMPUTE if recover else ComputeKind.FORWARD, key))

    def _relay_compute_done(self, now: float, r: RelayRecord, kind: ComputeKind, eff: list[RecoveryEffect]) -> None:
        key = r.key
        if r.phase is RelayPhase.FWD and kind in (ComputeKind.FORWARD, ComputeKind.RECOMPUTE):
            eff.append(Send(r.prev, Complete(*key, r.attempt)))
            self._route(now, r, eff)
        elif r.phase is RelayPhase.BWD and kind is ComputeKind.BACKWARD:
            self._contribute(key)
            eff.append(Send(r.next, Complete(*key, r.attempt)))
            eff.append(Send(r.prev, Backward(*key, None, r.attempt)))
            r.phase, r.sent_at = RelayPhase.GRAD, now
            self._report(key, r.attempt, RelayPhase.GRAD, eff)  # backward progress (the data node's act_on_gone)
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), self._deadline(now, r.prev)))
            self._room(eff)
            self._retry_parked(now, eff)  # my slot at my next hop freed

    def _retry_parked(self, now: float, eff: list[RecoveryEffect]) -> None:
        """A route again (a Room, a slot freed at the next hop, a next peer back): the parked ones try again."""
        for r in [r for r in self.mbs.values() if r.parked]:
            r.parked, r.tried = False, set()
            self._route(now, r, eff)

    def _route(self, now: float, r: RelayRecord, eff: list[RecoveryEffect]) -> None:
        """Hand my stashed output on: along `rest` (a recovery chain) or the flows / greedy."""
        key, a = r.key, r.attempt
        r.parked = False
        recovering = bool(r.rest)
        if recovering and r.rest[0] != "" and not r.tried:
            j = r.rest[0]
            r.next, r.phase, r.sent_at = j, RelayPhase.SENDING, now
            eff.append(Send(j, Resume(*key, r.path, r.rest[1:], None, a)))
            # a Resume is a control message answered at once (Complete): no tensor hand-off to wait for
            eff.append(SetTimer(MbTimer(TimerKind.FW, key), now + self.cfg.probe_wait_s + self.cfg.margin_s))
            return
        j = self._choose_next(key.data_node, r.tried)
        if recovering and r.rest[0] != "" and j is not None and r.tried:
            # the node to resume at did not answer: it is dead too, so its stage is recomputed as well
            r.rest = ("",) + r.rest[1:]
        if j is None:
            if self.stage < self.cfg.last_stage and "" not in r.tried and (
                    recovering or r.ordered or not self.cfg.one_wave):
                # every live next-stage peer is full (or none is left): keep my output (and a repair order) and
                # my slot; retried on a Room, a slot of mine freeing, a joiner of the next stage, or once on
                # this timer (then: as below)
                r.phase, r.next, r.parked = RelayPhase.SENT, None, True
                r.tried.clear()
                if r.ordered:
                    self._report(key, a, RelayPhase.SENT, eff)
                peers = self._live_next() or list(self.peers.next_peers)
                wait = max((self.peers.est.get(j, self.cfg.default_prior_s) for j in peers), default=self.cfg.default_prior_s)
                eff.append(SetTimer(MbTimer(TimerKind.FW, key), now + self.cfg.k * wait + self.cfg.margin_s))
                return
            if r.ordered:
                # I was ordered to repair and cannot: keep my stash, tell the data node (its next round decides)
                r.phase, r.rest, r.ordered = RelayPhase.SENT, (), False
                r.tried.clear()
                self._report(key, a, RelayPhase.SENT, eff)
                eff.append(Send(key.data_node, BackwardStuck(*key, self.stage, a)))
                return
            prev = r.prev
            self._forget(key)  # no Room for this freed slot: I have no route, not just no room
            self._cancel(key, eff)
            self._deny(prev, key, a, eff)
            return
        r.next, r.phase, r.sent_at = j, RelayPhase.SENDING, now
        if recovering:
            self.stats.bump(recovers=1)
            eff.append(Send(j, Recover(*key, r.path, r.rest[1:], None, a)))
        else:
            eff.append(Send(j, Forward(*key, r.path, None, a)))
        eff.append(SetTimer(MbTimer(TimerKind.FW, key), self._deadline(now, j)))


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
# A relay's timers (the data node's: rounds.DATA_TIMERS).
RELAY_TIMERS = {
    TimerKind.FW: RelaySide._fw_timer,
    TimerKind.BK: RelaySide._bk_timer,
}

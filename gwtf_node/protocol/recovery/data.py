"""A data node's microbatches: launching along its units (own, lent, fastest first), the sink, parking and
deferring (relay.py, "Forward pass"), settling the iteration.

Lending (GWTF, `cfg.lend`; the simulator turns it on with the flow machines)
----------------------------------------------------------------------------
The flow machines place each data node's units first come, first served (on
the heterogeneous Table II settings a maximum flow of 4 is often split 1 / 3),
and a data node pushes its microbatches in waves on its own units, so the
iteration lasts as many waves as the smallest share needs while the other
data node's units sit idle once it is done.  With `lend`, unit by unit: a
data node with nothing left to launch in the iteration (nothing waiting or
parked) sends `Lend(iteration, hop)` to the other data nodes each time one of
its microbatches completes, naming the stage-0 relay of the unit that freed;
a receiver adds it to its own units at that relay for the iteration (so it
launches there while its count allows; a unit lent to two data nodes may
answer `MbDeny` to one of them, which then tries elsewhere or parks).  And a
relay with no free unit of a microbatch's data node uses a free unit of
another data node's flows before repairing locally (greedy), so the borrowed
microbatch follows the idle flow's path.  Lent units end with the iteration
(`_open` starts from the flows again).  Off by default; the daemon and the
simulator turn it on for GWTF.

Fastest unit first (GWTF, `cfg.fastest_unit`; on in the simulator and the daemon)
---------------------------------------------------------------------------------
The flows minimise the cost of the units, and a relay picks among its free
units the cheapest link; but the data node launches a microbatch, and what
matters to it is when the microbatch comes back.  A data node measures, per
stage-0 relay, the launch -> final time of its microbatches through it
(`rt`, an EWMA over those that needed no repair and no new attempt) and
launches each new microbatch on the free unit (own or lent) with the lowest
`rt` (a relay not measured yet counts as the data node's end-to-end
estimate; ties by link cost).  It is not a makespan plan: round trips
differ with the data node (a far data node's trips through the same unit are
longer), and a data node holding a microbatch back for its own fast unit
would lend that unit later (`--no-fastest-unit` in `sim train` measures it).

One wave (`cfg.one_wave`, off by default; the simulator's `one_wave`)
---------------------------------------------------------------------
The paper's reading of an iteration (V-D: DENY "can continue recursively up
to the source, which may defer the batch to the next iteration"): a data
node launches at the opening of the iteration what its first hops take and
defers the rest at once; a microbatch denied back to it is deferred instead
of parked; a relay with no next hop with room answers `MbDeny` upstream at
once instead of parking (a recovery chain or a repair order still parks: it
carries a microbatch in its backward pass).  Each iteration offers the
deferred microbatches first, topped up with new ones to `capacity`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..effects import CancelTimer, Send, SetTimer
from ..messages import Backward, BackwardStuck, Complete, Forward, Lend, MbDeny, MbState, Recover, Release, Resume
from ..pipeline import Ledger, MbStatus, OpenIteration
from .records import (
    EWMA_ALPHA, Compute, ComputeKind, DataRecord, IterationSettled, Key, MbTimer, RecoveryEffect, RelayPhase, Sink,
    Source, TimerKind, ewma,
)


@dataclass
class DataState:
    """A data node's iterations: what it launches, defers and settles (only this module changes it)."""

    next_seq: int = 0  # the seq of the next new microbatch
    e2e_est: float = 0.0  # EWMA of launch -> final time (the watchdog's scale)
    ledger: Ledger = field(default_factory=Ledger)  # each microbatch's status per iteration
    iteration: int = 0  # the iteration open here
    waiting: list[int] = field(default_factory=list)  # its seqs not launched yet
    carry: list[int] = field(default_factory=list)  # deferred seqs for the next iteration
    reported: set[int] = field(default_factory=set)  # iterations settled (IterationSettled sent)
    lent: dict[str, int] = field(default_factory=dict)  # stage-0 relay -> units other data nodes lent me this iteration
    rt: dict[str, float] = field(default_factory=dict)  # stage-0 relay -> EWMA of launch -> final time through it


class DataSide:
    """Part of `RecoveryNode` (node.py): one mechanism of the machine, see the module docstring."""

    def _data_message(self, now: float, sender: str, key: Key, msg, eff: list[RecoveryEffect]) -> None:
        """A microbatch message at its data node, handed to its handler (`DATA_HANDLERS`, at the end of this
        module) when it is of the attempt in flight."""
        m: DataRecord | None = self.mbs.get(key)
        if m is None or msg.attempt != m.attempt:
            if m is not None:
                self.stats.bump(stale=1)
            if isinstance(msg, (Forward, Recover)):
                # an attempt this node no longer runs: Complete stops the sender's hop deadline (a relay resending
                # a repair to the sink would resend forever), and an abandoned attempt is released again (the
                # Release sent when it was given up may have been lost)
                eff.append(Send(sender, Complete(*key, msg.attempt)))
                if (m is not None and msg.attempt < m.attempt) or (m is None and self._abandoned(key)):
                    eff.append(Send(sender, Release(*key, msg.attempt)))
            return
        handler = DATA_HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, now, sender, key, msg, m, eff)

    def _on_state(self, now: float, sender: str, key: Key, msg: MbState, m: DataRecord,
                  eff: list[RecoveryEffect]) -> None:
        state = RelayPhase.parse(msg.state)  # (None: a word no phase has)
        if state is not None and state is not RelayPhase.NONE:
            m.holders.add(sender)
            s = msg.stage
            if 0 <= s < self.nstages and (state is RelayPhase.REC or m.path[s] is None):
                m.path[s] = sender
                m.bwd_done.discard(s)  # (a recovery recomputes the stage: its backward is to come)
            if state in (RelayPhase.GRAD, RelayPhase.DONE) and 0 <= s < self.nstages and m.path[s] == sender:
                m.bwd_done.add(s)
        if m.collecting:
            m.snapshot[sender] = state
            wanted = {p for p in m.path if p is not None}
            if wanted <= set(m.snapshot):
                eff.append(CancelTimer(MbTimer(TimerKind.PR, key)))
                self._decide(now, m, eff)

    def _src_complete(self, now: float, sender: str, key: Key, msg: Complete, m: DataRecord,
                      eff: list[RecoveryEffect]) -> None:
        if m.src is Source.SENDING and sender == m.next:
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            self._measure(sender, now - m.sent_at)
            m.src, m.rest = Source.SENT, ()
            m.tried.clear()
        elif m.sink is Sink.GRAD and sender == m.path[-1]:
            eff.append(CancelTimer(MbTimer(TimerKind.BK, key)))
            self._measure(sender, now - m.sent_at)
            m.sink = Sink.WAIT

    def _src_deny(self, now: float, sender: str, key: Key, msg: MbDeny, m: DataRecord,
                  eff: list[RecoveryEffect]) -> None:
        if sender == m.next and (m.src is Source.SENDING or (m.src is Source.SENT and m.sink is None)):
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            m.tried.add(sender)
            self.stats.bump(reroutes=1)
            self._src_route(now, m, eff)

    def _at_sink(self, now: float, sender: str, key: Key, msg: Forward, m: DataRecord,
                 eff: list[RecoveryEffect]) -> None:
        eff.append(Send(sender, Complete(*key, m.attempt)))
        if m.sink is not None:
            return
        p = list(msg.path[1:])[: self.nstages]
        m.path = p + [None] * (self.nstages - len(p))
        m.holders.update(x for x in p)
        m.sink = Sink.LOSS
        eff.append(Compute(ComputeKind.LOSS, key))

    def _sink_resume(self, now: float, sender: str, key: Key, msg: Resume, m: DataRecord,
                     eff: list[RecoveryEffect]) -> None:
        """A recovery chain replaced the last stage: resend the loss gradient to it."""
        a = m.attempt
        newprev = msg.path[-1] if msg.path else sender
        m.path[-1] = newprev
        eff.append(Send(newprev, Complete(*key, a)))
        if m.sink in (Sink.GRAD, Sink.WAIT):
            self.stats.bump(resends=1)
            m.sink, m.sent_at = Sink.GRAD, now
            eff.append(Send(newprev, Backward(*key, None, a)))
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), self._deadline(now, newprev)))

    def _src_backward(self, now: float, sender: str, key: Key, msg: Backward, m: DataRecord,
                      eff: list[RecoveryEffect]) -> None:
        if m.sink in (Sink.GRAD, Sink.WAIT):
            eff.append(CancelTimer(MbTimer(TimerKind.BK, key)))
            m.sink, m.final_from = Sink.FINAL, sender
            eff.append(Compute(ComputeKind.FINAL, key))

    def _on_stuck(self, now: float, sender: str, key: Key, msg: BackwardStuck, m: DataRecord,
                  eff: list[RecoveryEffect]) -> None:
        if not self.swarm and not m.collecting and m.sink is not None and m.sink is not Sink.FINAL:
            self._round(now, m, eff)

    def _src_route(self, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """Hand my embedding-side output (the stash) to a stage-0 relay: a Forward, or a Recover chain."""
        key, a = m.key, m.attempt
        m.parked = False
        j = self._choose_next(self.me, m.tried)
        if j is None:
            if m.sink is None:
                self._put_back(now, m, eff)
            elif self._live_next():  # every live stage-0 relay is full: retried when a slot frees (`_launch`)
                m.src, m.next, m.parked = Source.SENT, None, True
            else:  # no stage-0 relay to recover through; the next round (or giving up) decides
                m.src, m.rest = Source.SENT, ()
            return
        m.next, m.src, m.sent_at = j, Source.SENDING, now
        if m.rest:
            self.stats.bump(recovers=1)
            eff.append(Send(j, Recover(*key, (self.me,), m.rest[1:], None, a)))
        else:
            eff.append(Send(j, Forward(*key, (self.me,), None, a)))
        eff.append(SetTimer(MbTimer(TimerKind.FW, key), self._deadline(now, j)))

    def _put_back(self, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """No first hop for a microbatch in its forward pass: wait for a slot keeping my stash, or defer it."""
        key = m.key
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*key, m.attempt)))
        self._cancel(key, eff)
        if not self.cfg.one_wave and any(
                mm.key.iteration == key.iteration and not mm.parked for mm in self.mbs.values() if mm is not m):
            # slots will free: park with my embedding output (no recompute), retried by `_launch`;
            # a new attempt, as the released holders' records are void
            m.attempt += 1
            m.src, m.next, m.rest, m.tried, m.parked = Source.PARKED, None, (), set(), True
            m.path, m.holders, m.bwd_done, m.sink = [None] * self.nstages, set(), set(), None
            self._arm_watchdog(now, m, eff)
            return
        self._forget(key)
        self._defer(key, eff)
        for s in list(self.data.waiting):
            self.data.waiting.remove(s)
            self._defer(Key(self.me, s, key.iteration), eff)
        for mm in [mm for mm in self.mbs.values() if mm.key.iteration == key.iteration and mm.src is Source.PARKED]:
            self._cancel(mm.key, eff)  # nothing else in flight will free a slot for them either
            self._forget(mm.key)
            self._defer(mm.key, eff)
        self._maybe_done(now, key.iteration, eff)

    def _on_lend(self, now: float, sender: str, msg: Lend, eff: list[RecoveryEffect]) -> None:
        if self.is_data and self.cfg.lend and not self.swarm and msg.iteration == self.data.iteration:
            self.data.lent[msg.hop] = self.data.lent.get(msg.hop, 0) + 1
            self.stats.bump(borrowed=1)
            self._launch(now, eff)

    def _defer(self, key: Key, eff: list[RecoveryEffect]) -> None:
        self.stats.bump(deferred=1)
        self.data.ledger.mark(key.iteration, key.seq, MbStatus.DEFERRED)
        self.data.carry.append(key.seq)

    def _data_compute_done(self, now: float, m: DataRecord, kind: ComputeKind, eff: list[RecoveryEffect]) -> None:
        key = m.key
        if kind is ComputeKind.FORWARD and m.src is Source.EMB:
            j = m.next
            if j is None or j in self.peers.dead or j in self.peers.full:
                j = self._choose_next(self.me, set())
            if j is None:
                self._put_back(now, m, eff)
                return
            m.next, m.src, m.sent_at = j, Source.SENDING, now
            eff.append(Send(j, Forward(*key, (self.me,), None, m.attempt)))
            eff.append(SetTimer(MbTimer(TimerKind.FW, key), self._deadline(now, j)))
        elif kind is ComputeKind.LOSS and m.sink is Sink.LOSS:
            target = m.path[-1]
            m.sink, m.sent_at = Sink.GRAD, now
            # a holder of the path reported gone while the forward was on its way here (`peer_gone` acts only on a
            # microbatch in its backward pass): act now, as the report would have, not on the watchdog
            gone = self.cfg.act_on_gone and self._gone_ahead(m, self.peers.gone)
            if gone and self.swarm:
                self._trouble(now, m, eff)  # (restart: no gradient sent down a path that cannot carry it)
                return
            eff.append(Send(target, Backward(*key, None, m.attempt)))
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), self._deadline(now, target)))
            self._arm_watchdog(now, m, eff)
            if gone:
                self._trouble(now, m, eff)
        elif kind is ComputeKind.FINAL and m.sink is Sink.FINAL:
            eff.append(Send(m.final_from or m.next, Complete(*key, m.attempt)))
            hop = m.path[0] if m.path[0] is not None else m.next  # the stage-0 relay of its unit
            if m.rounds == 0:
                self.data.e2e_est = (1 - EWMA_ALPHA) * self.data.e2e_est + EWMA_ALPHA * (now - m.launched_at)
                if m.attempt == 0 and hop is not None:  # the round trip through this unit ("Fastest unit first")
                    ewma(self.data.rt, hop, now - m.launched_at)
            # every holder off the final path had a duplicate branch: release it (and its contribution)
            final = set(p for p in m.path if p is not None)
            for p in sorted(m.holders - final):
                eff.append(Send(p, Release(*key, m.attempt)))
            self.data.ledger.mark(key.iteration, key.seq, MbStatus.COMPLETED)
            self._cancel(key, eff)
            self._forget(key)
            self._lend(key.iteration, hop, eff)
            self._launch(now, eff)
            self._maybe_done(now, key.iteration, eff)

    def _open(self, now: float, it: int, eff: list[RecoveryEffect]) -> None:
        self.data.iteration = it
        self.peers.new_iteration(relay=False)  # every relay dropped its stashes in the aggregation: room again
        self.data.lent.clear()  # lent units were lent for the iteration before
        # one wave: the deferred first, topped up with new ones to `capacity` per iteration; else all of them
        fresh = max(0, self.cfg.capacity - len(self.data.carry)) if self.cfg.one_wave else self.cfg.capacity
        seqs = list(self.data.carry) + list(range(self.data.next_seq, self.data.next_seq + fresh))
        self.data.next_seq += fresh
        self.data.carry = []
        self.data.ledger.add(it, seqs)
        self.data.waiting = list(seqs)
        eff.append(OpenIteration(it))
        self._launch(now, eff)
        self._maybe_done(now, it, eff)

    def _launch(self, now: float, eff: list[RecoveryEffect]) -> None:
        if not self.is_data:
            return
        it = self.data.iteration
        if it in self.data.reported:
            return
        for m in [m for m in self.mbs.values() if m.parked]:  # a slot may have freed: parked ones first
            if self.mbs.get(m.key) is m and m.parked:
                m.parked, m.tried = False, set()
                self._src_route(now, m, eff)
        while self.data.waiting:
            j = self._choose_next(self.me, set(), fresh=True)
            if j is None:
                break
            seq = self.data.waiting.pop(0)
            key = Key(self.me, seq, it)
            self.data.ledger.mark(it, seq, MbStatus.INFLIGHT)
            m = DataRecord(key, next=j, path=[None] * self.nstages, launched_at=now)  # the slot is reserved
            self._keep(m)
            eff.append(Compute(ComputeKind.FORWARD, key))
            self._arm_watchdog(now, m, eff)
        if self.data.waiting and (self.cfg.one_wave or not any(m.key.iteration == it for m in self.mbs.values())):
            # one wave: what the opening launch could not place; else: nothing in flight and no first hop to
            # take more.  Defer the rest
            for s in list(self.data.waiting):
                self.data.waiting.remove(s)
                self._defer(Key(self.me, s, it), eff)
            self._maybe_done(now, it, eff)

    def _lend(self, it: int, hop: str | None, eff: list[RecoveryEffect]) -> None:
        """Lending: a unit through `hop` freed and I have nothing left to launch in this iteration: lend it."""
        if not (self.cfg.lend and not self.swarm and hop is not None and it == self.data.iteration):
            return
        if self.data.waiting or any(m.parked for m in self.mbs.values() if m.key.iteration == it):
            return
        for d in self.cfg.data_nodes:
            if d != self.me and d not in self.peers.dead:
                self.stats.bump(lent=1)
                eff.append(Send(d, Lend(it, hop)))

    def _maybe_done(self, now: float, it: int, eff: list[RecoveryEffect]) -> None:
        if not self.is_data or it in self.data.reported or self.data.waiting:
            return
        if any(m.key.iteration == it for m in self.mbs.values()):
            return
        c = self.data.ledger.counts(it)
        if c["pending"] or c["inflight"]:
            return
        self.data.reported.add(it)
        done = tuple(sorted(s for s, st in self.data.ledger.entries.get(it, {}).items() if st is MbStatus.COMPLETED))
        eff.append(IterationSettled(it, c["completed"], c["deferred"], done))

    def _abandoned(self, key: Key) -> bool:
        """The ledger entry of `key` (data node, seq, iteration) was deferred: its attempts were given up."""
        entries = self.data.ledger.entries.get(key.iteration, {})
        return entries.get(key.seq) is MbStatus.DEFERRED


# Which handler takes which microbatch message of the attempt in flight at its data node; a type not here is
# ignored (a message of another attempt: `_data_message`).
DATA_HANDLERS = {
    MbState: DataSide._on_state,
    Complete: DataSide._src_complete,
    MbDeny: DataSide._src_deny,
    Forward: DataSide._at_sink,
    Resume: DataSide._sink_resume,
    Backward: DataSide._src_backward,
    BackwardStuck: DataSide._on_stuck,
}

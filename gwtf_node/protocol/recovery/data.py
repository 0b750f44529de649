"""A data node's microbatches: launching along its units (own, lent, fastest first), the sink, parking and
deferring (relay.py, "Forward pass"), settling the iteration.

`DataSide` owns a data node's records (`DataRecord`, written only here, but
for each record's `RoundState`, which is rounds.py's) and its iterations
(the ledger, what waits, what is carried over, the round-trip estimates).
Its recovery rounds (rounds.py) change a record by asking it: `reroute`,
`resend_loss_grad`, `restart`, `give_up`.

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
(`open` starts from the flows again).  Off by default; the daemon and the
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
from typing import TYPE_CHECKING

from ..completions import holder_tag
from ..effects import CancelTimer, Send, SetTimer
from ..messages import Backward, BackwardStuck, Complete, Forward, Lend, MbDeny, MbState, Recover, Release, Resume
from ..pipeline import Ledger, MbStatus, OpenIteration
from .records import (
    EWMA_ALPHA, K_E2E, Compute, ComputeKind, IterationSettled, Key, MbTimer, RecoveryEffect, RelayPhase, Sink, Source,
    TimerKind, cancel_timers, ewma,
)
from .rounds import RoundState

if TYPE_CHECKING:
    from .node import RecoveryNode


@dataclass
class DataRecord:
    """A data node's record of one of its microbatches in flight."""

    key: Key
    attempt: int = 0
    src: Source = Source.EMB
    next: str | None = None  # the stage-0 relay my stash went to
    rest: tuple[str, ...] = ()
    tried: set[str] = field(default_factory=set)
    sent_at: float = 0.0
    sink: Sink | None = None  # None: the forward is not back yet
    path: list[str | None] = field(default_factory=list)  # stage -> holder (None: unknown)
    holders: set[str] = field(default_factory=set)  # every node that reported taking this attempt
    launched_at: float = 0.0
    round: RoundState = field(default_factory=RoundState)  # its recovery rounds (rounds.py)
    final_from: str | None = None  # the stage-0 relay the last backward came from
    parked: bool = False  # a recovery found every live stage-0 relay full: retried when a slot frees
    bwd_done: set[int] = field(default_factory=set)  # stages whose holder reported its backward computed (MbState grad)
    chain: tuple[str, ...] = ()  # the relays that computed the backward that came back (`Backward.chain`)


class DataSide:
    """A data node's microbatches (`records`) and iterations: what it launches, defers and settles."""

    def __init__(self, *, next_seq: int = 0, e2e_est: float = 0.0) -> None:
        self.records: dict[Key, DataRecord] = {}
        self.next_seq = next_seq  # the seq of the next new microbatch
        self.e2e_est = e2e_est  # EWMA of launch -> final time (the watchdog's scale)
        self.ledger = Ledger()  # each microbatch's status per iteration
        self.iteration = 0  # the iteration open here
        self.waiting: list[int] = []  # its seqs not launched yet
        self.carry: list[int] = []  # deferred seqs for the next iteration
        self.reported: set[int] = set()  # iterations settled (IterationSettled sent)
        self.lent: dict[str, int] = {}  # stage-0 relay -> units other data nodes lent me this iteration
        self.rt: dict[str, float] = {}  # stage-0 relay -> EWMA of launch -> final time through it
        # a completed microbatch -> the attempt that completed it and its holders' tags (protocol/completions.py)
        self.completed_by: dict[Key, tuple[int, tuple[int, ...]]] = {}

    def message(self, node: RecoveryNode, now: float, sender: str, key: Key, msg, eff: list[RecoveryEffect]) -> None:
        """A microbatch message at its data node, handed to its handler (`DATA_HANDLERS`, at the end of this
        module) when it is of the attempt in flight."""
        m: DataRecord | None = self.records.get(key)
        if m is None or msg.attempt != m.attempt:
            if m is not None:
                node.stats.bump(stale=1)
            if isinstance(msg, (Forward, Recover)):
                # an attempt this node no longer runs: Complete stops the sender's hop deadline (a relay resending
                # a repair to the sink would resend forever), and an abandoned attempt is released again (the
                # Release sent when it was given up may have been lost)
                eff.append(Send(sender, Complete(*key, msg.attempt)))
                if (m is not None and msg.attempt < m.attempt) or (m is None and self._abandoned(node, key)):
                    eff.append(Send(sender, Release(*key, msg.attempt)))
            return
        handler = DATA_HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, node, now, sender, key, msg, m, eff)

    def _on_state(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: MbState, m: DataRecord,
                  eff: list[RecoveryEffect]) -> None:
        state = RelayPhase.parse(msg.state)  # (None: a word no phase has)
        if state is not None and state is not RelayPhase.NONE:
            m.holders.add(sender)
            s = msg.stage
            if 0 <= s < node.nstages and (state is RelayPhase.REC or m.path[s] is None):
                m.path[s] = sender
                m.bwd_done.discard(s)  # (a recovery recomputes the stage: its backward is to come)
            if state in (RelayPhase.GRAD, RelayPhase.DONE) and 0 <= s < node.nstages and m.path[s] == sender:
                m.bwd_done.add(s)
        node.rounds.answered(node, now, m, sender, state, eff)

    def _src_complete(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Complete, m: DataRecord,
                      eff: list[RecoveryEffect]) -> None:
        if m.src is Source.SENDING and sender == m.next:
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            node.peers.measure(sender, now - m.sent_at)
            m.src, m.rest = Source.SENT, ()
            m.tried.clear()
        elif m.sink is Sink.GRAD and sender == m.path[-1]:
            eff.append(CancelTimer(MbTimer(TimerKind.BK, key)))
            node.peers.measure(sender, now - m.sent_at)
            m.sink = Sink.WAIT

    def _src_deny(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: MbDeny, m: DataRecord,
                  eff: list[RecoveryEffect]) -> None:
        if sender == m.next and (m.src is Source.SENDING or (m.src is Source.SENT and m.sink is None)):
            eff.append(CancelTimer(MbTimer(TimerKind.FW, key)))
            m.tried.add(sender)
            node.stats.bump(reroutes=1)
            self.src_route(node, now, m, eff)

    def _at_sink(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Forward, m: DataRecord,
                 eff: list[RecoveryEffect]) -> None:
        eff.append(Send(sender, Complete(*key, m.attempt)))
        if m.sink is not None:
            return
        p = list(msg.path[1:])[: node.nstages]
        m.path = p + [None] * (node.nstages - len(p))
        m.holders.update(x for x in p)
        m.sink = Sink.LOSS
        eff.append(Compute(ComputeKind.LOSS, key))

    def _sink_resume(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Resume, m: DataRecord,
                     eff: list[RecoveryEffect]) -> None:
        """A recovery chain replaced the last stage: resend the loss gradient to it."""
        a = m.attempt
        newprev = msg.path[-1] if msg.path else sender
        m.path[-1] = newprev
        eff.append(Send(newprev, Complete(*key, a)))
        if m.sink in (Sink.GRAD, Sink.WAIT):
            self.resend_loss_grad(node, now, m, newprev, eff)

    def resend_loss_grad(self, node: RecoveryNode, now: float, m: DataRecord, target: str,
                         eff: list[RecoveryEffect]) -> None:
        """The loss gradient again, to the last stage's holder `target`."""
        node.stats.bump(resends=1)
        m.sink, m.sent_at = Sink.GRAD, now
        eff.append(Send(target, Backward(*m.key, None, m.attempt)))
        eff.append(SetTimer(MbTimer(TimerKind.BK, m.key), node.routing.deadline(node, now, target)))

    def _src_backward(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: Backward, m: DataRecord,
                      eff: list[RecoveryEffect]) -> None:
        if m.sink in (Sink.GRAD, Sink.WAIT):
            eff.append(CancelTimer(MbTimer(TimerKind.BK, key)))
            m.sink, m.final_from, m.chain = Sink.FINAL, sender, tuple(msg.chain)
            eff.append(Compute(ComputeKind.FINAL, key))

    def _on_stuck(self, node: RecoveryNode, now: float, sender: str, key: Key, msg: BackwardStuck, m: DataRecord,
                  eff: list[RecoveryEffect]) -> None:
        if not node.swarm and not m.round.collecting and m.sink is not None and m.sink is not Sink.FINAL:
            node.rounds.round(node, now, m, eff)

    def src_route(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """Hand my embedding-side output (the stash) to a stage-0 relay: a Forward, or a Recover chain."""
        key, a = m.key, m.attempt
        m.parked = False
        j = node.routing.choose_next(node, node.me, m.tried)
        if j is None:
            if m.sink is None:
                self._put_back(node, now, m, eff)
            elif node.routing.live_next(node):  # every live stage-0 relay is full: retried when a slot frees (`launch`)
                m.src, m.next, m.parked = Source.SENT, None, True
            else:  # no stage-0 relay to recover through; the next round (or giving up) decides
                m.src, m.rest = Source.SENT, ()
            return
        m.next, m.src, m.sent_at = j, Source.SENDING, now
        if m.rest:
            node.stats.bump(recovers=1)
            eff.append(Send(j, Recover(*key, (node.me,), m.rest[1:], None, a)))
        else:
            eff.append(Send(j, Forward(*key, (node.me,), None, a)))
        eff.append(SetTimer(MbTimer(TimerKind.FW, key), node.routing.deadline(node, now, j)))

    def arm_watchdog(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect],
                     scale: float = 1.0) -> None:
        """`m`'s watchdog: `scale` x (K_E2E x the end-to-end estimate + margin) from now (a wait's is longer:
        rounds.py)."""
        eff.append(SetTimer(MbTimer(TimerKind.WD, m.key), now + scale * (K_E2E * self.e2e_est + node.cfg.margin_s)))

    def _src_fw_timer(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """The stage-0 relay did not acknowledge my embedding output in time: presumed dead, another one."""
        if m.src is Source.SENDING:
            node.stats.bump(reroutes=1)
            node.routing.presume_dead(node, m.next)
            m.tried.add(m.next)
            self.src_route(node, now, m, eff)

    def reroute(self, node: RecoveryNode, now: float, m: DataRecord, tried: set[str],
                rest: tuple[str, ...] | None, eff: list[RecoveryEffect]) -> None:
        """A round's decision: my stash to another stage-0 relay than `tried` (with `rest`: a recovery chain)."""
        m.tried = tried
        if rest is not None:
            m.rest = rest
        self.src_route(node, now, m, eff)

    def restart(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """SWARM's restart: the old attempt released, a new one from the embedding."""
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*m.key, m.attempt)))
        cancel_timers(m.key, eff)
        m.attempt += 1
        m.src, m.next, m.rest, m.tried, m.sink, m.parked = Source.EMB, None, (), set(), None, False
        m.path, m.holders, m.bwd_done = [None] * node.nstages, set(), set()
        m.launched_at = now
        eff.append(Compute(ComputeKind.FORWARD, m.key))
        self.arm_watchdog(node, now, m, eff)

    def give_up(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """The attempt is given up: released everywhere, DEFERRED (pushed again next iteration)."""
        node.stats.bump(gave_up=1)
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*m.key, m.attempt)))
        cancel_timers(m.key, eff)
        self.records.pop(m.key, None)
        self._defer(node, m.key, eff)
        self.launch(node, now, eff)
        self.maybe_done(node, now, m.key.iteration, eff)

    def _put_back(self, node: RecoveryNode, now: float, m: DataRecord, eff: list[RecoveryEffect]) -> None:
        """No first hop for a microbatch in its forward pass: wait for a slot keeping my stash, or defer it."""
        key = m.key
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*key, m.attempt)))
        cancel_timers(key, eff)
        if not node.cfg.one_wave and any(
                mm.key.iteration == key.iteration and not mm.parked for mm in self.records.values() if mm is not m):
            # slots will free: park with my embedding output (no recompute), retried by `launch`;
            # a new attempt, as the released holders' records are void
            m.attempt += 1
            m.src, m.next, m.rest, m.tried, m.parked = Source.PARKED, None, (), set(), True
            m.path, m.holders, m.bwd_done, m.sink = [None] * node.nstages, set(), set(), None
            self.arm_watchdog(node, now, m, eff)
            return
        self.records.pop(key, None)
        self._defer(node, key, eff)
        for s in list(self.waiting):
            self.waiting.remove(s)
            self._defer(node, Key(node.me, s, key.iteration), eff)
        for mm in [mm for mm in self.records.values() if mm.key.iteration == key.iteration and mm.src is Source.PARKED]:
            cancel_timers(mm.key, eff)  # nothing else in flight will free a slot for them either
            self.records.pop(mm.key, None)
            self._defer(node, mm.key, eff)
        self.maybe_done(node, now, key.iteration, eff)

    def on_lend(self, node: RecoveryNode, now: float, sender: str, msg: Lend, eff: list[RecoveryEffect]) -> None:
        if node.is_data and node.cfg.lend and not node.swarm and msg.iteration == self.iteration:
            self.lent[msg.hop] = self.lent.get(msg.hop, 0) + 1
            node.stats.bump(borrowed=1)
            self.launch(node, now, eff)

    def _defer(self, node: RecoveryNode, key: Key, eff: list[RecoveryEffect]) -> None:
        node.stats.bump(deferred=1)
        self.ledger.mark(key.iteration, key.seq, MbStatus.DEFERRED)
        self.carry.append(key.seq)

    def compute_done(self, node: RecoveryNode, now: float, m: DataRecord, kind: ComputeKind,
                     eff: list[RecoveryEffect]) -> None:
        key = m.key
        if kind is ComputeKind.FORWARD and m.src is Source.EMB:
            j = m.next
            if j is None or j in node.peers.dead or j in node.peers.full:
                j = node.routing.choose_next(node, node.me, set())
            if j is None:
                self._put_back(node, now, m, eff)
                return
            m.next, m.src, m.sent_at = j, Source.SENDING, now
            eff.append(Send(j, Forward(*key, (node.me,), None, m.attempt)))
            eff.append(SetTimer(MbTimer(TimerKind.FW, key), node.routing.deadline(node, now, j)))
        elif kind is ComputeKind.LOSS and m.sink is Sink.LOSS:
            target = m.path[-1]
            m.sink, m.sent_at = Sink.GRAD, now
            # a holder of the path reported gone while the forward was on its way here (`peer_gone` acts only on a
            # microbatch in its backward pass): act now, as the report would have, not on the watchdog
            gone = node.cfg.act_on_gone and node.routing.gone_ahead(m, node.peers.gone)
            if gone and node.swarm:
                node.rounds.trouble(node, now, m, eff)  # (restart: no gradient sent down a path that cannot carry it)
                return
            eff.append(Send(target, Backward(*key, None, m.attempt)))
            eff.append(SetTimer(MbTimer(TimerKind.BK, key), node.routing.deadline(node, now, target)))
            self.arm_watchdog(node, now, m, eff)
            if gone:
                node.rounds.trouble(node, now, m, eff)
        elif kind is ComputeKind.FINAL and m.sink is Sink.FINAL:
            eff.append(Send(m.final_from or m.next, Complete(*key, m.attempt)))
            hop = m.path[0] if m.path[0] is not None else m.next  # the stage-0 relay of its unit
            if m.round.count == 0:
                self.e2e_est = (1 - EWMA_ALPHA) * self.e2e_est + EWMA_ALPHA * (now - m.launched_at)
                if m.attempt == 0 and hop is not None:  # the round trip through this unit ("Fastest unit first")
                    ewma(self.rt, hop, now - m.launched_at)
            # the relays whose backward came back are the path that completed it (a recovery ordered while the
            # first path was alive may have taken `path`'s place in this record); every other holder had a
            # duplicate branch: release it (and its contribution)
            done = list(m.chain) if len(m.chain) == node.nstages else m.path
            for p in sorted(m.holders - {p for p in done if p is not None}):
                eff.append(Send(p, Release(*key, m.attempt)))
            self.ledger.mark(key.iteration, key.seq, MbStatus.COMPLETED)
            self.completed_by[key] = (m.attempt, tuple(holder_tag(p) for p in done))
            cancel_timers(key, eff)
            self.records.pop(key, None)
            self._lend(node, key.iteration, hop, eff)
            self.launch(node, now, eff)
            self.maybe_done(node, now, key.iteration, eff)

    def compute_failed(self, node: RecoveryNode, now: float, m: DataRecord, kind: ComputeKind,
                       eff: list[RecoveryEffect]) -> None:
        """The driver could not run `kind` for `m` (its input gone, or refused): the attempt is given up and the
        microbatch deferred, where a record left computing would be waited for (rounds.py's waits)."""
        if ((kind is ComputeKind.FORWARD and m.src is Source.EMB) or (kind is ComputeKind.LOSS and m.sink is Sink.LOSS)
                or (kind is ComputeKind.FINAL and m.sink is Sink.FINAL)):
            self.give_up(node, now, m, eff)

    def open(self, node: RecoveryNode, now: float, it: int, eff: list[RecoveryEffect]) -> None:
        self.iteration = it
        node.peers.new_iteration(relay=False)  # every relay dropped its stashes in the aggregation: room again
        self.lent.clear()  # lent units were lent for the iteration before
        # one wave: the deferred first, topped up with new ones to `capacity` per iteration; else all of them
        fresh = max(0, node.cfg.capacity - len(self.carry)) if node.cfg.one_wave else node.cfg.capacity
        seqs = list(self.carry) + list(range(self.next_seq, self.next_seq + fresh))
        self.next_seq += fresh
        self.carry = []
        self.ledger.add(it, seqs)
        self.waiting = list(seqs)
        eff.append(OpenIteration(it))
        self.launch(node, now, eff)
        self.maybe_done(node, now, it, eff)

    def launch(self, node: RecoveryNode, now: float, eff: list[RecoveryEffect]) -> None:
        if not node.is_data:
            return
        it = self.iteration
        if it in self.reported:
            return
        for m in [m for m in self.records.values() if m.parked]:  # a slot may have freed: parked ones first
            if self.records.get(m.key) is m and m.parked:
                m.parked, m.tried = False, set()
                self.src_route(node, now, m, eff)
        while self.waiting:
            j = node.routing.choose_next(node, node.me, set(), fresh=True)
            if j is None:
                break
            seq = self.waiting.pop(0)
            key = Key(node.me, seq, it)
            self.ledger.mark(it, seq, MbStatus.INFLIGHT)
            m = DataRecord(key, next=j, path=[None] * node.nstages, launched_at=now)  # the slot is reserved
            self.records[key] = m
            eff.append(Compute(ComputeKind.FORWARD, key))
            self.arm_watchdog(node, now, m, eff)
        if self.waiting and (node.cfg.one_wave or not any(m.key.iteration == it for m in self.records.values())):
            # one wave: what the opening launch could not place; else: nothing in flight and no first hop to
            # take more.  Defer the rest
            for s in list(self.waiting):
                self.waiting.remove(s)
                self._defer(node, Key(node.me, s, it), eff)
            self.maybe_done(node, now, it, eff)

    def _lend(self, node: RecoveryNode, it: int, hop: str | None, eff: list[RecoveryEffect]) -> None:
        """Lending: a unit through `hop` freed and I have nothing left to launch in this iteration: lend it."""
        if not (node.cfg.lend and not node.swarm and hop is not None and it == self.iteration):
            return
        if self.waiting or any(m.parked for m in self.records.values() if m.key.iteration == it):
            return
        for d in node.cfg.data_nodes:
            if d != node.me and d not in node.peers.dead:
                node.stats.bump(lent=1)
                eff.append(Send(d, Lend(it, hop)))

    def maybe_done(self, node: RecoveryNode, now: float, it: int, eff: list[RecoveryEffect]) -> None:
        if not node.is_data or it in self.reported or self.waiting:
            return
        if any(m.key.iteration == it for m in self.records.values()):
            return
        c = self.ledger.counts(it)
        if c["pending"] or c["inflight"]:
            return
        self.reported.add(it)
        done = tuple(sorted(s for s, st in self.ledger.entries.get(it, {}).items() if st is MbStatus.COMPLETED))
        by = [self.completed_by.get(Key(node.me, s, it)) for s in done]
        self.completed_by = {k: a for k, a in self.completed_by.items() if k.iteration > it}
        named = all(b is not None for b in by)  # (else none named: every holder counts, as before attempts)
        eff.append(IterationSettled(it, c["completed"], c["deferred"], done,
                                    tuple(b[0] for b in by) if named else (),
                                    tuple(t for b in by for t in b[1]) if named else ()))

    def _abandoned(self, node: RecoveryNode, key: Key) -> bool:
        """The ledger entry of `key` (data node, seq, iteration) was deferred: its attempts were given up."""
        entries = self.ledger.entries.get(key.iteration, {})
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
# A data node's own hop timer; its other timers are its recovery rounds' (rounds.ROUND_TIMERS).
DATA_TIMERS = {
    TimerKind.FW: DataSide._src_fw_timer,
}

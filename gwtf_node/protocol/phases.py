"""The aggregation phase of an iteration, reliably (section V-E of the paper).

Theory of operation
-------------------
When a data node's microbatches of iteration t are all settled (completed or deferred: the recovery
machine says so) it reports `IterationDone(t)` to the leader (`report_done`).  The leader
(`protocol/leader.py` elects it; the driver says who leads through `set_leader` and whether this
node acts as the leader now through `leading=`), once it holds the report of every live data node,
decides BEGIN AGGREGATION: the number of microbatches completed end to end, per data node the seqs
of those microbatches (`completed`: a relay counts a gradient it holds only when its microbatch is
among them, so the gradient of an attempt its data node gave up never counts, even when the Release
that would have dropped it was lost) and, per stage, the members that take part in the stage's
all-reduce (`groups`).  BEGIN goes to every data node and to the stage-0 relays; each relay passes
it to its children in the next stage (phasefan.py: each member has two parents in the stage before).
Every member steps (`StartStep`: all-reduce, optimizer step); `CanTake(t)` travels back to front:
the last stage sends it to its parents once its step is applied, stage k once its step is applied
and its children said CanTake, and a data node opens t+1 (`OpenIteration`) once its own step is
applied and the stage-0 members said CanTake.

The rest sits with the code it governs: the CAN TAKE rule and why ALL
(`CanTakeRule`), a node whose parameters are not those of the iteration
(`OutOfStep`), an empty stage (`Phases._past_empty`), who passes a signal on
(`Phases`, phasefan.py).

Reliability
-----------
Every phase signal (IterationDone to the leader, BEGIN front to back, CanTake
back to front) is resent every `retry_s` until the receiver acknowledges it
(`PhaseAck(kind, iteration)`), or until the receiver is forgotten
(`forget`: what it had not acknowledged is held back and sent again if it
comes back, `peer_back`, as a node presumed dead while alive does).  The
deadline is held here: one timer per (signal, iteration),
key `PhaseTimer(kind, iteration)`, handed to `on_timer`.  A
receiver acknowledges every copy and applies a signal once per iteration (a
`Phases` instance serves one run, so the iteration names the (run,
iteration) pair): a duplicate is acknowledged, never re-applied.

A leader that dies at any point of an iteration costs one election, never a
hang.  Before BEGIN: every data node resends its pending report to the node
the election names next (`set_leader`).  While or after sending BEGIN: a data
node that applied BEGIN of t hands it to the new leader (`set_leader` sends
the latest BEGIN it applied); a new leader that holds BEGIN of t, or is handed
it, sends it again to every data node and stage-0 relay (`front`), so a
partially sent BEGIN is completed; receivers that had it acknowledge the
duplicate.  A data node whose report reaches a leader that already began
that iteration is sent the BEGIN again.

No silent wait
--------------
Every wait of the phase is visible in `waiting` and bounded when
`wait_bound_s` is set: `phasewaits.py` says which waits and how each is
resolved.

Everything here is pure: every method is handed `now` and returns effects
(`Send`, `SetTimer`, `CancelTimer`, `StartStep`, `OpenIteration`, `LeftOut`,
`OutOfStep`, `Overdue`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping

from .effects import CancelTimer, Send, SetTimer
from .completions import Completion, completed_named, completed_seqs
from .messages import BeginAggregation, CanTake, IterationDone, PhaseAck, PhaseKind, StageMembers
from .phasegroups import GroupDigests, by_digest
from .phasefan import FAN_OUT, PhaseFan
from .phasewaits import (  # noqa: F401 - for the drivers
    WATCH_TIMER, Overdue, PhaseWaits, Wait, WaitKind, WatchTimer, begin_for,
)

RETRY_S = 2.0  # a phase signal not acknowledged within this is sent again


class CanTakeRule(enum.Enum):
    """Which downstream members a stage waits for before it sends CAN TAKE upstream.

    CAN TAKE waits for every downstream member the leader named
    (`CanTakeRule.ALL`, the default), minus those reported gone (`forget`).  The
    paper's sentence ("detects that a downstream peer has also finished", V-E)
    read literally is `CanTakeRule.ANY`: one downstream peer.  ANY lets a
    microbatch of t+1 reach a stage-(k+1) relay whose step of t is not applied
    yet: a relay that began t and is still stepping refuses it (`MbDeny`,
    recovery/), but one whose BEGIN is still on its way (a retransmission after
    a lost frame, a long link) takes it with the parameters of t-1 and trains the
    stage on a mix of two iterations.  ALL never does, and waiting for a crashed
    member costs at most the membership layer's detection time (the report makes
    `forget` drop it from the group).  Measured in the simulator
    (docs/bench_churn.md, "CAN TAKE rule", GWTF, 4 seeds x 10 iterations): at 0 %
    churn ANY saves 0.1-0.3 % of the time per microbatch (the relays of a stage
    end their step within the same all-reduce); at 10 % churn ALL is as fast or
    faster (homogeneous 0.380 against 0.409 min): under ANY a data node opens
    t+1 while a downstream relay still steps t, its microbatches are refused
    there and rerouted.  So ALL: never slower where it matters, and correct.
    """

    ALL = "all"  # wait for CanTake from every downstream member BEGIN named (minus the gone): the default
    ANY = "any"  # one downstream member is enough (the paper's sentence read literally; see above)


@dataclass(frozen=True, slots=True)
class StartStep:
    """All-reduce the gradient sums of the stage's group and apply the optimizer step of `iteration`."""

    iteration: int
    microbatches: int  # completed end to end in the iteration, all data nodes


@dataclass(frozen=True, slots=True)
class LeftOut:
    """BEGIN AGGREGATION of `iteration` does not count this node in: its state falls behind; resync it."""

    iteration: int


@dataclass(frozen=True, slots=True)
class OutOfStep:
    """BEGIN AGGREGATION of `iteration` came, but this node's parameters are those of `applied`: resync it.

    A node checks that its parameters are those of the iteration it aggregates:
    `applied` counts the steps applied here (a joiner starts from the iteration
    whose stage state it downloaded).  BEGIN of t at a member with `applied != t`
    yields `OutOfStep(t, applied)` instead of a step: the driver resyncs the
    stage state; nobody waits for its CanTake only if the leader left it out, so
    the driver must resync quickly (the membership layer then reports it gone
    otherwise).
    """

    iteration: int
    applied: int


@dataclass(frozen=True, slots=True)
class OpenIteration:
    """The previous iteration's steps are applied everywhere: push the microbatches of `iteration`."""

    iteration: int


PhaseEffect = Send | SetTimer | CancelTimer | StartStep | OpenIteration | LeftOut | OutOfStep | Overdue
"""Every effect `Phases` returns (`SetTimer`/`CancelTimer` keys: `PhaseTimer`, `WATCH_TIMER`)."""


@dataclass
class PhaseStats:
    resent: int = 0  # phase signals sent again after their deadline
    duplicates: int = 0  # copies of a signal already applied (acknowledged again, not applied)
    refused_not_leading: int = 0  # IterationDone received while not the acting leader (the sender resends)
    out_of_step: int = 0  # BEGINs met with parameters of another iteration
    overdue: int = 0  # waits that passed their bound
    signals: int = 0  # phase signals sent, acknowledgements included (a resend counts in `resent` instead)
    steps: int = 0  # steps applied here after an all-reduce (`on_step_done`; a state loaded instead does not count)


@dataclass(frozen=True, slots=True, order=True)
class PhaseTimer:
    """The retransmission deadline of the phase signal `kind` of `iteration` (a `SetTimer` key)."""

    kind: PhaseKind
    iteration: int


def timer_key(kind: PhaseKind, iteration: int) -> PhaseTimer:
    return PhaseTimer(kind, iteration)


NOT_READY = -1  # `Phases.applied` of a member whose state is not settled: out of step for every BEGIN


class Phases(PhaseWaits, PhaseFan):
    """One node's view of the aggregation phase.

    `stage` is the relay's stage, or -1 for a data node; `last_stage` is S-1;
    `applied` the number of steps this node's parameters hold (0 at the start
    of a run; a joiner: the iteration whose stage state it downloaded;
    `NOT_READY`: a relay back with a checkpoint that has not yet settled which
    state it holds, resume.py, so that a BEGIN naming it, sent by a leader
    that has not yet heard its Hello, finds it out of step and it does not
    step).
    Peers are given as the ids this node knows; the caller keeps them current.

    Who passes a signal on.  BEGIN names each stage's members (`groups`), and that list, not only the peers a
    relay happens to know when BEGIN arrives, says where it goes: a stage-k relay passes BEGIN to its children
    among the members named for stage k+1 (`fan_out` parents each, phasefan.py; every member where `fan_out`
    is None) and to the stage-(k+1) relays it knows that BEGIN does not name, and sends CAN TAKE to its parents
    among the members named for stage k-1 (stage 0: to the data nodes BEGIN names).  Otherwise a relay that
    the leader already counts (a newcomer whose Hello reached the leader first) but not the stage before gets
    no BEGIN, and its parents wait for it forever.  A copy to a peer not reachable yet is resent every
    `retry_s` like any other.
    """

    def __init__(self, me: str, stage: int, last_stage: int, *, applied: int = 0, retry_s: float = RETRY_S,
                 can_take: CanTakeRule = CanTakeRule.ALL, wait_bound_s: float | None = None,
                 fan_out: int | None = FAN_OUT, groups_by_digest: bool = True) -> None:
        self.me = me
        self.digests = GroupDigests(groups_by_digest)  # BEGIN's groups sent once to each receiver (phasegroups.py)
        self.stage = stage
        self.last_stage = last_stage
        self.retry_s = retry_s
        self.can_take_rule = can_take
        self.fan_out = fan_out  # parents per member of a stage (phasefan.py); None: every member of the stage
        self.applied = applied
        self.iteration = applied  # data node: the iteration in progress
        self.leader: str | None = None
        self.front: tuple[str, ...] = ()  # leader: the data nodes and stage-0 relays BEGIN goes to
        self.begun: set[int] = set()
        self.begin_msgs: dict[int, BeginAggregation] = {}  # iteration -> the BEGIN applied here
        self.stepped: set[int] = set()
        self.can_take_from: dict[int, set[str]] = {}
        self.passed: dict[int, set[str]] = {}  # iteration -> the next-stage members this relay passed BEGIN to
        self.can_take_to: dict[int, set[str]] = {}  # iteration -> the members this relay sent CAN TAKE to
        self.begin_from: dict[int, set[str]] = {}  # iteration -> who passed this relay BEGIN (phasefan.py)
        self.done_reports: dict[int, dict[str, IterationDone]] = {}  # leader: iteration -> data node -> report
        self.my_reports: dict[int, IterationDone] = {}  # data node: its own reports
        self.opened: set[int] = {applied}
        self.groups: dict[int, dict[int, set[str]]] = {}  # iteration -> stage -> members (from BEGIN)
        self.gone: set[str] = set()  # peers forgotten (crashed, left): never waited for again
        self.unacked: dict[tuple[PhaseKind, int, str], object] = {}  # (signal, iteration, to) -> message
        self.held_back: dict[str, dict[tuple[PhaseKind, int], object]] = {}  # forgotten peer -> its unacked signals
        self.floor = 0  # iterations below this are over here and forgotten (`_prune`): their signals are old news
        self.stats = PhaseStats()
        self.wait_bound_s = wait_bound_s  # None: no watch timer, no Overdue (`waiting` still answers)
        self.reported_at: dict[int, float] = {}  # the waits (module doc): data node: its report was made then
        self.step_at: dict[int, float] = {}  # the step began (StartStep)
        self.stepped_at: dict[int, float] = {}  # the step was applied (then CAN TAKE is waited for)
        self.expected: dict[int, tuple[str, ...]] = {}  # leader: the data nodes whose reports it waits for
        self.overdue_since: dict[tuple[WaitKind, int], float] = {}  # waits that passed their bound: when last handled
        self.watch_at: float | None = None  # the watch timer's deadline (None: not set)

    @property
    def is_data(self) -> bool:
        return self.stage < 0

    # ---- sending reliably ------------------------------------------------------
    def _send(self, now: float, kind: PhaseKind, iteration: int, to: str, msg: object) -> list[PhaseEffect]:
        self.unacked[(kind, iteration, to)] = msg
        self.stats.signals += 1
        return [Send(to, self.digests.outgoing(to, msg)), SetTimer(timer_key(kind, iteration), now + self.retry_s)]

    def _ack(self, to: str, kind: PhaseKind, iteration: int) -> list[PhaseEffect]:
        self.stats.signals += to != self.me
        return [] if to == self.me else [Send(to, PhaseAck(kind, iteration))]

    def _drop_unacked(self, pred) -> list[PhaseEffect]:
        eff: list[PhaseEffect] = []
        for k in [k for k in self.unacked if pred(k)]:
            del self.unacked[k]
            if not any(o[:2] == k[:2] for o in self.unacked):
                eff.append(CancelTimer(timer_key(k[0], k[1])))
        return eff

    def on_ack(self, now: float, sender: str, msg: PhaseAck) -> list[PhaseEffect]:
        """The receiver has the signal: stop resending it there (or lacks the groups a BEGIN named: all go)."""
        if msg.kind is PhaseKind.GROUPS:
            return self.digests.missing(sender, self.unacked.get((PhaseKind.BEGIN, msg.iteration, sender)))
        self.digests.acked(sender, self.unacked.get((msg.kind, msg.iteration, sender)))
        return self._drop_unacked(lambda k: k == (msg.kind, msg.iteration, sender))

    def on_timer(self, now: float, key: PhaseTimer | WatchTimer) -> list[PhaseEffect]:
        """A retransmission deadline: send again every copy of this signal not acknowledged yet (or the check of
        the waits, `WATCH_TIMER`)."""
        if isinstance(key, WatchTimer):
            self.watch_at = None
            return self.check_waits(now)
        if not isinstance(key, PhaseTimer):
            return []
        kind, it = key.kind, key.iteration
        eff: list[PhaseEffect] = []
        for (k, i, to), msg in sorted(self.unacked.items(), key=lambda kv: kv[0][2]):
            if (k, i) == (kind, it):
                self.stats.resent += 1
                eff.append(Send(to, self.digests.outgoing(to, msg)))
        if eff:
            eff.append(SetTimer(key, now + self.retry_s))
        return eff

    # ---- data node: reporting --------------------------------------------------
    def report_done(self, now: float, msg: IterationDone) -> list[PhaseEffect]:
        """This data node's microbatches of `msg.iteration` are all settled: report them to the leader.

        At the leader itself the report is recorded here; the driver then calls `maybe_begin`."""
        self.my_reports = {i: r for i, r in self.my_reports.items() if i >= msg.iteration - 1}
        self.my_reports[msg.iteration] = msg
        self.reported_at.setdefault(msg.iteration, now)
        watch = self._watch(now)
        if self.leader is None or msg.iteration in self.begun:
            return watch
        if self.leader == self.me:
            self.done_reports.setdefault(msg.iteration, {})[self.me] = msg
            return watch
        return self._send(now, PhaseKind.DONE, msg.iteration, self.leader, msg) + watch

    def set_leader(self, now: float, leader: str | None, *, front: Iterable[str] = ()) -> list[PhaseEffect]:
        """The election names `leader` (None: nobody acts now).  `front`: when this node leads, the data
        nodes and stage-0 relays it knows (where BEGIN goes).

        A data node resends its pending report to a new leader and hands it the
        latest BEGIN it applied; a new leader that holds a BEGIN sends it again
        to the front (module doc, "Reliability")."""
        old, self.leader = self.leader, leader
        if leader == self.me:
            self.front = tuple(sorted(set(front) - {self.me} - self.gone))
        if leader == old or not self.is_data:
            return []
        eff = self._drop_unacked(lambda k: k[0] in (PhaseKind.DONE, PhaseKind.BEGIN) and k[2] == old
                                 and k[2] not in self.front)
        if leader is None:
            return eff
        pending = [i for i in self.my_reports if i not in self.begun]
        if leader == self.me:
            for i in pending:
                self.done_reports.setdefault(i, {})[self.me] = self.my_reports[i]
            if self.begun:
                t = max(self.begun)
                eff += self._fan_out(now, self.begin_msgs[t], exclude=())
            return eff
        for i in sorted(pending):
            eff += self._send(now, PhaseKind.DONE, i, leader, self.my_reports[i])
        if self.begun:
            t = max(self.begun)
            eff += self._send(now, PhaseKind.BEGIN, t, leader, self.begin_msgs[t])
        return eff

    # ---- leader ----------------------------------------------------------------
    def on_iteration_done(
        self, now: float, sender: str, msg: IterationDone, *, leading: bool, data_nodes: Iterable[str],
        stage0: Iterable[str], groups: Mapping[int, Iterable[str]] | None = None,
    ) -> list[PhaseEffect]:
        """The leader collects IterationDone; with every data node heard, it opens the aggregation.

        Not leading: ignored and not acknowledged (the sender resends to
        whoever the election names).  `groups` (stage -> members; -1 for the
        data nodes) says who takes part in each stage's all-reduce: the leader
        decides it once and BEGIN carries it, so every member of a stage uses
        the same group and every CAN TAKE waits for the same senders."""
        if not leading:
            self.stats.refused_not_leading += 1
            return []
        it = msg.iteration
        eff = self._ack(sender, PhaseKind.DONE, it)
        if it < self.floor:
            self.stats.duplicates += 1
            return eff
        if it in self.begun:  # its BEGIN was lost on the way (or sent by a leader that died): send it again
            self.stats.duplicates += 1
            if sender != self.me:
                eff += self._send(now, PhaseKind.BEGIN, it, sender, self.begin_msgs[it])
            return eff
        self.done_reports.setdefault(it, {})[sender] = msg
        return eff + self.maybe_begin(now, it, leading=leading, data_nodes=data_nodes, stage0=stage0, groups=groups)

    def maybe_begin(self, now: float, iteration: int, *, leading: bool, data_nodes: Iterable[str],
                    stage0: Iterable[str], groups: Mapping[int, Iterable[str]] | None = None) -> list[PhaseEffect]:
        """BEGIN AGGREGATION of `iteration` if this node leads and every data node in `data_nodes` reported.

        The driver calls it after its own report and after a data node is
        forgotten (the leader no longer waits for a dead one's report)."""
        reports = self.done_reports.get(iteration, {})
        dn = sorted(set(data_nodes) - self.gone)
        if leading and iteration not in self.begun:
            self.expected[iteration] = tuple(dn)
        if not leading or iteration in self.begun or any(d not in reports for d in dn):
            return []
        total = sum(reports[d].completed for d in dn)
        members = tuple(StageMembers(k, tuple(sorted(set(v)))) for k, v in sorted((groups or {}).items()))
        completed = tuple(completed_seqs(d, reports[d]) for d in dn)
        begin = BeginAggregation(iteration, total, members, completed=completed)
        named0 = {p for g in members if g.stage == 0 for p in g.peers}
        self.front = tuple(sorted((set(dn) | set(stage0) | named0) - {self.me} - self.gone))
        return self._fan_out(now, begin, exclude=()) + self._apply_begin(now, begin, next_stage=())

    def _fan_out(self, now: float, begin: BeginAggregation, exclude: Iterable[str]) -> list[PhaseEffect]:
        eff: list[PhaseEffect] = []
        skip = set(exclude) | {self.me} | self.gone
        for to in sorted(set(self.front) | self._past_empty(begin)):
            if to not in skip:
                eff += self._send(now, PhaseKind.BEGIN, begin.iteration, to, begin)
        return eff

    def _past_empty(self, begin: BeginAggregation) -> set[str]:
        """Members of the stages right after a stage with no member in `begin`'s groups: no relay of the empty
        stage passes BEGIN on to them, so the leader sends it to them itself.

        An empty stage (its last relay crashed or left, nobody took its place yet) passes BEGIN on to nobody:
        the leader sends it to the stage after, when it opens the phase and again when the member it named is
        forgotten meanwhile; those relays step and pass BEGIN on as usual.  The empty stage takes no step in
        that iteration, and a data node whose stage-0 group is empty waits for no CAN TAKE.  Opening the next
        iteration with a stage still empty is the driver's decision (runtime/node/microbatches.py).
        """
        named = {g.stage: set(g.peers) - self.gone for g in begin.groups}
        out: set[str] = set()
        for k in sorted(named):
            if k >= 1 and k - 1 in named and not named[k - 1]:
                out |= named[k]
        return out

    def iteration_loss(self, iteration: int) -> tuple[int, float]:
        """(completed microbatches, loss sum) over every data node's report of `iteration` (leader only)."""
        reports = self.done_reports.get(iteration, {})
        return sum(r.completed for r in reports.values()), sum(r.loss_sum for r in reports.values())

    def completed_in(self, iteration: int) -> dict[str, dict[int, Completion]] | None:
        """Per data node, the seqs of `iteration` whose gradients count (the BEGIN applied here), or None when
        that BEGIN names none (count every contribution held): `completed_named(begin)`."""
        begin = self.begin_msgs.get(iteration)
        return None if begin is None else completed_named(begin)

    def pending_iterations(self) -> list[int]:
        """Iterations with reports at this leader and no BEGIN yet."""
        return sorted(i for i in self.done_reports if i not in self.begun)

    # ---- everyone --------------------------------------------------------------
    def group(self, iteration: int, stage: int) -> set[str] | None:
        """The members of `stage` taking part in the aggregation of `iteration`, if BEGIN named them."""
        g = self.groups.get(iteration)
        return None if g is None else g.get(stage, set())

    def named_group(self, iteration: int, stage: int) -> tuple[str, ...] | None:
        """The members of `stage` BEGIN of `iteration` named, as the leader sent them (`group` drops those this
        node holds gone), if BEGIN named groups."""
        begin = self.begin_msgs.get(iteration)
        if begin is None or not begin.groups:
            return None
        return next((g.peers for g in begin.groups if g.stage == stage), ())

    def on_begin(self, now: float, sender: str, msg: BeginAggregation, next_stage: Iterable[str]) -> list[PhaseEffect]:
        """BEGIN AGGREGATION arrived: acknowledge it; the first copy is passed on and starts the step.

        At the acting leader (a BEGIN handed over by a data node after a leader
        change) it also goes to the front again.  A new BEGIN naming groups by a
        digest this node does not hold is asked for in full (phasegroups.py)."""
        msg = self.digests.expand(msg)
        if by_digest(msg) and msg.iteration not in self.begun and msg.iteration >= self.floor:
            self.stats.signals += 1
            return [Send(sender, PhaseAck(PhaseKind.GROUPS, msg.iteration))]
        eff = self._ack(sender, PhaseKind.BEGIN, msg.iteration)
        self.begin_from.setdefault(msg.iteration, set()).add(sender)
        if msg.iteration in self.begun or msg.iteration < self.floor:
            self.stats.duplicates += 1
            return eff + self._can_take_again(now, sender, msg.iteration)
        if self.is_data and self.leader == self.me:
            eff += self._fan_out(now, msg, exclude=(sender,))
        return eff + self._apply_begin(now, msg, next_stage)

    def _apply_begin(self, now: float, msg: BeginAggregation, next_stage: Iterable[str]) -> list[PhaseEffect]:
        """Pass BEGIN on once and start the step.

        A node that BEGIN's groups leave out of its stage (a newcomer whose
        state is not ready for this iteration) passes it on but takes no step
        and sends no CAN TAKE: nobody waits for it.  A member whose parameters
        are not those of the iteration (`applied`) does not step either."""
        it = msg.iteration
        self.begun.add(it)
        self.begin_msgs[it] = msg
        if msg.groups:  # (a peer this node already knows to be gone stays out: BEGIN may be older news)
            self.groups[it] = {g.stage: set(g.peers) - self.gone for g in msg.groups}
        eff: list[PhaseEffect] = []
        if not self.is_data and self.stage < self.last_stage:
            named_next = self.groups.get(it, {}).get(self.stage + 1, set())
            kids = self._children(it)  # (unnamed peers of the next stage, newcomers, get it from everyone)
            eff += self._pass_begin(now, it, (set(next_stage) | named_next) if kids is None
                                    else kids | (set(next_stage) - named_next))
        mine = self.group(it, self.stage)
        if mine is not None and self.me not in mine:
            eff.append(LeftOut(it))
            return eff
        if it != self.applied:
            self.stats.out_of_step += 1
            eff.append(OutOfStep(it, self.applied))
            return eff
        eff.append(StartStep(it, msg.microbatches))
        self.step_at.setdefault(it, now)
        return eff + self._watch(now)

    def resynced(self, now: float, applied: int, next_stage: Iterable[str],
                 prev_stage: Iterable[str]) -> list[PhaseEffect]:
        """The driver loaded the stage state holding `applied` steps (after `LeftOut` / `OutOfStep`, the state
        after the step its stage peers applied): the iterations below `applied` that began here count as
        stepped, and their CAN TAKE goes on."""
        self.applied = max(self.applied, applied)
        eff: list[PhaseEffect] = []
        for it in sorted(i for i in self.begun if i < self.applied and i not in self.stepped):
            self.stepped.add(it)
            self.stepped_at.setdefault(it, now)
            eff += self._maybe_can_take(now, it, next_stage, prev_stage)
        return eff + (self._watch(now) if eff else [])

    def peer_back(self, now: float, peer: str) -> list[PhaseEffect]:
        """`peer` was forgotten and is back (a restarted node keeps its peer id, a node presumed dead was alive):
        it is waited for again, and the signals it had not acknowledged when it was forgotten go to it again (of
        iterations not over here, a report only to the leader: a node presumed dead while the phase ran still
        waits for them)."""
        self.gone.discard(peer)
        self.digests.forget(peer)
        eff: list[PhaseEffect] = []
        for (kind, it), msg in sorted(self.held_back.pop(peer, {}).items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if it >= self.floor and (kind is not PhaseKind.DONE or peer == self.leader):
                eff += self._send(now, kind, it, peer, msg)
        return eff

    def forget(self, now: float, peer: str, next_stage: Iterable[str], prev_stage: Iterable[str]) -> list[PhaseEffect]:
        """`peer` crashed or left: nobody waits for it any more (section V-E with churn).

        It leaves every aggregation group and no signal is resent to it;
        iterations whose step is applied here and that waited only for it go
        on.  At the leader, the driver then calls `maybe_begin` for
        `pending_iterations()`: a dead data node's report is not waited for."""
        self.gone.add(peer)
        self.digests.forget(peer)
        self.front = tuple(p for p in self.front if p != peer)
        held = self.held_back.setdefault(peer, {})
        held.update({(k, i): msg for (k, i, to), msg in self.unacked.items() if to == peer})
        eff = self._drop_unacked(lambda k: k[2] == peer)
        if self.is_data and self.leader == self.me:  # BEGIN named it; its stage is empty now: bridge the gap
            for it in sorted(self.begun):
                begin = self.begin_msgs.get(it)
                if begin is not None and any(peer in g.peers for g in begin.groups):
                    eff += self._fan_out(now, begin, exclude=self.front)
        for it, reports in self.done_reports.items():  # a dead data node's microbatches do not count (recovery/)
            if it not in self.begun:
                reports.pop(peer, None)
        for g in self.groups.values():
            for members in g.values():
                members.discard(peer)
        for it in sorted(self.passed):  # the parents without it (phasefan.py): new children, new parents
            eff += self._pass_begin(now, it, self._children(it) or ())
        for it in sorted(self.can_take_to):
            eff += self._tell_can_take(now, it, self._parents(it) or ())
        nxt, prv = list(next_stage), list(prev_stage)
        for it in sorted(self.stepped):
            eff += self._maybe_can_take(now, it, nxt, prv)
        return eff

    def on_step_done(self, now: float, iteration: int, next_stage: Iterable[str],
                     prev_stage: Iterable[str]) -> list[PhaseEffect]:
        self.stats.steps += iteration not in self.stepped
        self.stepped.add(iteration)
        self.stepped_at.setdefault(iteration, now)
        self.applied = max(self.applied, iteration + 1)
        return self._maybe_can_take(now, iteration, next_stage, prev_stage) + self._watch(now)

    def on_can_take(
        self, now: float, sender: str, msg: CanTake, next_stage: Iterable[str], prev_stage: Iterable[str]
    ) -> list[PhaseEffect]:
        eff = self._ack(sender, PhaseKind.CAN_TAKE, msg.iteration)
        if msg.iteration < self.floor:
            self.stats.duplicates += 1
            return eff
        heard = self.can_take_from.setdefault(msg.iteration, set())
        if sender in heard:
            self.stats.duplicates += 1
            return eff
        heard.add(sender)
        return eff + self._maybe_can_take(now, msg.iteration, next_stage, prev_stage)

    def _downstream_ready(self, iteration: int, next_stage: Iterable[str]) -> bool:
        heard = self.can_take_from.get(iteration, set())
        downstream = self._downstream(iteration, next_stage)
        if self.can_take_rule is CanTakeRule.ANY:
            return not downstream or bool(heard & downstream)
        return downstream <= heard

    def _maybe_can_take(self, now: float, iteration: int, next_stage: Iterable[str],
                        prev_stage: Iterable[str]) -> list[PhaseEffect]:
        if iteration not in self.stepped:
            return []
        if self.is_data:
            # a data node's "next stage" here is stage 0: the last link of the CAN TAKE chain
            if iteration + 1 in self.opened or not self._downstream_ready(iteration, next_stage):
                return []
            self.opened.add(iteration + 1)
            self.iteration = iteration + 1
            self._prune(iteration)
            return [OpenIteration(iteration + 1)]
        if iteration in self.can_take_sent:
            return []
        if self.stage < self.last_stage and not self._downstream_ready(iteration, next_stage):
            return []
        named_prev = self.groups.get(iteration, {}).get(self.stage - 1, set())
        ups = self._parents(iteration)  # (and whoever passed it BEGIN: a parent by its own view, phasefan.py)
        self._prune(iteration)
        return self._tell_can_take(now, iteration, (set(prev_stage) | named_prev) if ups is None
                                   else ups | (self.begin_from.get(iteration, set()) & named_prev))

    def _prune(self, iteration: int) -> None:
        """Forget what iterations before `iteration - 1` needed (their signals may still be acknowledged)."""
        old = iteration - 1
        self.floor = max(self.floor, old)
        for table in (self.done_reports, self.can_take_from, self.groups, self.begin_msgs, self.reported_at,
                      self.step_at, self.stepped_at, self.expected, self.passed, self.can_take_to, self.begin_from):
            for i in [i for i in table if i < old]:
                del table[i]
        for s in (self.begun, self.stepped, self.opened):
            s.difference_update({i for i in s if i < old})
        for peer, held in list(self.held_back.items()):
            self.held_back[peer] = {k: v for k, v in held.items() if k[1] >= old}
            if not self.held_back[peer]:
                del self.held_back[peer]

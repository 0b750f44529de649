"""Microbatch lifecycle with crash handling (sections V-D and V-E of the GWTF paper).

One `RecoveryNode` per node (data node or relay).  It is pure: it is handed
`now`, the events (messages, timers, finished computations) and a seeded
`random.Random`, and returns effects: `Send`, `SetTimer`, `CancelTimer` (see
`effects.py`), `Compute` (run a stage computation, then call
`on_compute_done`) and `OpenIteration`.  The simulator (`sim/train.py`)
executes them in virtual time; the daemon runs the same machine with torch.

The invariant, and how it holds by construction
-----------------------------------------------
*The data node is the single owner of each of its microbatches' fate.*  A
ledger entry leaves INFLIGHT only at its data node, and only to COMPLETED
(the backward came back through the embedding) or DEFERRED (the data node
gave the attempt up: it is pushed again, as a new ledger entry, in the next
iteration).  Relays never decide a microbatch's fate; they execute, report
and answer.  Three rules make that safe:

1. *Attempt numbers.*  Every microbatch message carries the data node's
   attempt number (`attempt`).  A relay's record is stamped with the attempt
   that created it; a message of an older attempt than the record is stale
   and ignored, a newer `Forward` replaces the record.  The attempt changes
   only when the data node abandons one (SWARM's restart, or giving up) and
   then tells every node that reported holding it (`Release`).
2. *A watchdog per microbatch.*  While a microbatch is in flight its data node
   always has a timer armed for it (`wd`, or `pr` while it collects probe
   answers).  Every firing either sees progress, orders a repair, or, after
   `MAX_ROUNDS` rounds, gives the attempt up (DEFERRED).  So nothing is
   pending forever: no lost microbatch and no stalled iteration, whatever
   the crash schedule (tests/test_recovery.py checks it over random
   schedules with Hypothesis).
3. *Recovery decisions are made by the data node, from a snapshot.*  Every
   relay that takes a microbatch tells its data node (`MbState`, a small
   control message), so the data node knows each stage's holder.  On
   trouble it probes every holder of the path directly (`Probe`; answer
   `MbState` with what the relay holds: none | fwd | sending | sent | bwd |
   grad | done; no answer within `probe_wait_s` = dead) and decides from the
   answers, deterministically (`_decide`), which live node repairs what
   (`RepairOrder`).  No node guesses where the backward is, so no circular
   state.  Every action is idempotent (duplicates are ignored by phase), so
   a decision taken on a slightly stale snapshot is harmless.

Forward pass (both policies; V-D "as in SWARM")
-----------------------------------------------
A node that computed a stage sends `Complete` to the node it got the input
from, hands its output to a next hop and keeps it (the stash) until the
backward came back through it.  The hand-off waits for the next hop's
`Complete`: deadline `now + K * est(peer) * (1 + my hand-offs to that peer
still waiting) + MARGIN_S`, `est` an EWMA of measured hand-off -> Complete
times initialised from the driver's prior (link model, profiled compute).
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

Backward pass, GWTF (V-D)
-------------------------
The sink computes the loss and sends `Backward` to the last relay; each
relay computes its backward, adds the microbatch to its contributions, sends
`Complete` downstream and the gradient upstream, and waits for the upstream
`Complete`; missing: `BackwardStuck` to the data node (the paper's "it
notifies the data node").  The data node (on `BackwardStuck`, on its own
hop deadline, or on its watchdog) runs a *round*: probe, then `_decide`:

* g = the lowest stage whose holder has computed its backward (bwd, grad,
  done), else the sink.  Stages below g still need their stashed activation.
* A *bad* stage below g is one whose holder is dead or holds nothing.  For
  each run a..b of bad stages, the live holder of stage a-1 (the data node
  if a = 0) is ordered to send its stash (`Recover`) to a live node of stage
  a chosen by its flows; that node recomputes stage a's forward, goes on to
  stage a+1 the same way while it is bad, and at the first good stage sends
  `Resume`: that node links its upstream to the recovering node and, if it
  holds its gradient, resends it.  The order carries the holders after the
  run up to the next bad stage (`rest`), so if the node to resume at died
  meanwhile its stage is recomputed too and the chain resumes at the next
  one.  A `Resume` is a control message answered at once: its deadline is
  `probe_wait_s + margin_s`, and its answer is not a hand-off time sample.
  The backward resumes from the stored
  gradient: one stage forward recomputed per crashed stage, no pipeline
  restart.
* No bad stage: if stage g is computing, nothing to do; otherwise the
  gradient from g to g-1 got lost in a crash race: g resends it (`Resume`).
* Forward pass not at the sink yet: the highest live holder with a stash is
  ordered to resend it onward (its next hop acknowledged, then died).

Backward pass, SWARM (the paper's baseline)
--------------------------------------------
Greedy next hop (the cheapest live next-stage peer, SWARM's "closest node"),
assuming every peer has `swarm_assumed_capacity` slots (SWARM assumes equal
memory: a peer that has less answers `MbDeny` after the transfer); resend
after a forward timeout (same deadline rule).  Relays do not report backward
trouble (`BackwardStuck` is GWTF's); the data node detects a failed backward
by its own timeouts (its hop deadline, its watchdog: `K_E2E` x the measured
end-to-end time) and restarts the microbatch: a new attempt, `Release` of the
old one everywhere, the whole pipeline recomputed from the embedding.  With
`cfg.act_on_gone`, a data node told by the membership layer (`peer_gone`)
that a holder of a microbatch in its backward pass is gone acts at once
(SWARM: restart; GWTF: a round) instead of waiting for its timeouts; a
microbatch whose forward was still on its way to the sink when the report came
is acted on when its loss is computed (SWARM: restarted instead of sending the
gradient down a path that cannot carry it).

Lending (GWTF, `cfg.lend`; the simulator turns it on with the flow machines)
----------------------------------------------------------------------------
The flow machines place each data node's units first come, first served (on
the heterogeneous Table II settings a maximum flow of 4 is often split 1 / 3),
and a data node pushes its microbatches in waves on its own units, so the
iteration lasts as many waves as the smallest share needs while the other
data node's units sit idle once it is done.  With `lend`: a data node whose
microbatches of the iteration are all settled sends its `IterationDone` to
the other data nodes too; a data node that hears it for its current
iteration launches, when its own units are busy, on any stage-0 relay with
room by its own count (the other one has nothing in flight there any more);
and a relay with no free unit of a microbatch's data node uses a free unit of
another data node's flows before repairing locally (greedy), so the borrowed
microbatch follows the idle flow's path.  Earlier than that, unit by unit: a
data node with nothing left to launch in the iteration (nothing waiting or
parked) sends `Lend(iteration, hop)` to the other data nodes each time one of
its microbatches completes, naming the stage-0 relay of the unit that freed;
a receiver adds it to its own units at that relay for the iteration (so it
launches there while its count allows; a unit lent to two data nodes may
answer `MbDeny` to one of them, which then tries elsewhere or parks).  This
cut the heterogeneous Table II time per microbatch by ~10 % at 0 % churn
(5 seeds, 0.503 -> 0.454 min) and ~4 % at 10 %.  Ends with the iteration
(`_open` starts from the flows again).  Off by default; the daemon turns it
on but sends only `Lend` between data nodes (its `IterationDone` goes to the
leader's aggregation, `pipeline.Phases`).

Fastest unit first (GWTF, `cfg.fastest_unit`; on in the simulator and the daemon)
-------------------------------------------------------------------------------
The flows minimise the cost of the units, and a relay picks among its free
units the cheapest link; but the data node launches a microbatch, and what
matters to it is when the microbatch comes back.  A data node measures, per
stage-0 relay, the launch -> final time of its microbatches through it
(`rt`, an EWMA over those that needed no repair and no new attempt) and
launches each new microbatch on the free unit (own or lent) with the lowest
`rt` (a relay not measured yet counts as the data node's end-to-end
estimate; ties by link cost).  On the heterogeneous Table II setting at 0 %
churn (10 seeds x 10 iterations) it cut the time per microbatch from 0.502
to 0.485 min and was never slower on a seed; a makespan plan on top (data
nodes exchanging their units' round trips and holding back the units an
earliest-finish-time schedule leaves idle, or holding a microbatch back for
a faster unit of their own) was tried and was slower (0.51-0.52 min): round
trips differ with the data node (a far data node's trips through the same
unit are 30 % longer), and a data node waiting for its own fast unit lends
it later.

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

Bounded rounds
--------------
At most `MAX_ROUNDS` rounds (GWTF) or restarts (SWARM) per microbatch and
iteration, then the data node gives the attempt up: `Release` to every
holder, DEFERRED, pushed again next iteration.

Aggregation (V-E), with deadlines
---------------------------------
A data node sends `IterationDone` to the leader when none of its microbatches
of the iteration is pending or in flight.  The leader sends
`BeginAggregation` to the other data nodes and to every live stage-0 relay;
every relay passes it to every live relay of the next stage (it reaches
everyone alive while one relay per stage lives), drops what is left of the
iteration's microbatches and starts its step (`Compute("aggregate")`; the
driver / daemon all-reduces the gradient sums and counts over the live relays
of the stage, waiting at most a deadline for a dead one).  `CanTake` goes
back to front: the last stage after its step; another node after its step and
a `CanTake` from *a* next-stage peer ("detects that a downstream peer has also
finished", V-E: waiting for all of them would wait for the dead ones), or
after `agg_wait_s` x (stages behind it + 1) with none.  A data node opens the
next iteration the same way.  A relay still aggregating iteration t answers
`MbDeny` to a microbatch of t+1 (its parameters are not t+1's yet) and sends
`Room` once its step is applied.

Contributions lost inside a crashed relay (the rule)
----------------------------------------------------
A relay accumulates the gradient of every microbatch whose backward it
computed (`contrib[iteration]`, a set: one contribution per key and node).
If it dies before its stage's all-reduce, those contributions die with it.
Rule: the stage's update is the sum of the gradients the survivors hold
divided by the number of microbatches they hold (`Compute.count`); the
microbatch stays COMPLETED and is *not* re-queued (the other stages learnt
from it; training them again would count it twice).  The driver counts these
cases (`lost_contributions`).  A `Release` drops the released attempt's
contributions (SWARM's restarted attempts, duplicate branches), so a
microbatch contributes at most once per stage among the nodes the data node
knows of.

A data node that dies (`peer_gone`, `_data_node_gone`) takes its
microbatches with it: relays drop them and their contributions, its
IterationDone stops counting; if it led, the lowest surviving data node leads
(the outcome of `leader.py`'s election, whose timing the driver accounts
for) and the others send it their pending IterationDone.  The daemon runs the
aggregation itself (`pipeline.Phases`) and gives this machine no leader.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Mapping

from .effects import CancelTimer, Send, SetTimer
from .messages import (
    Backward, BackwardStuck, BeginAggregation, CanTake, Complete, Forward, IterationDone, Lend, MbDeny, MbState,
    Probe, Recover, Release, RepairOrder, Resume, Room,
)
from .pipeline import Ledger, MbStatus, OpenIteration, pick_next_hop

K_DEADLINE = 3.0  # hop deadline = K x expected + margin (see the module doc)
K_E2E = K_DEADLINE  # watchdog = K_E2E x expected end-to-end time + margin
MARGIN_S = 2.0
EWMA_ALPHA = 0.3
POLICIES = ("gwtf", "swarm")
MAX_ROUNDS = 6  # per microbatch and iteration: GWTF probe rounds / SWARM restarts, then defer

Key = tuple  # (data_node, seq, iteration)
SLOT_PHASES = ("fwd", "sending", "sent", "bwd")  # a relay holds activations: it uses a slot
FWD_STATES = ("fwd", "sending", "sent")
BWD_STATES = ("bwd", "grad", "done")
TIMERS = ("fw", "bk", "wd", "pr")


@dataclass(frozen=True, slots=True)
class Compute:
    """Run a computation, then call `on_compute_done(now, key, kind)`.

    kind: "forward" (a relay's stage forward; at a data node the embedding
    side), "recompute" (a relay's stage forward redone from a stored
    activation after a crash), "backward" (a relay's stage backward), "loss"
    (data node, at the sink: head + loss + their backward), "final" (data
    node: the embedding-side backward), "aggregate" (all-reduce + optimizer
    step of `key = ("agg", iteration)` over `count` held contributions).
    """

    kind: str
    key: tuple
    count: int = 0


@dataclass(frozen=True)
class RecoveryConfig:
    node_id: str
    stage: int  # -1: a data node
    last_stage: int
    capacity: int  # microbatches held at once (relays); a data node: its microbatches per iteration
    data_nodes: tuple[str, ...]
    leader: str
    next_peers: Mapping[str, float]  # link cost to each next-stage peer (last stage: the data nodes)
    prev_peers: Mapping[str, float]  # previous stage (stage 0: the data nodes; data node: the last stage)
    peer_capacity: Mapping[str, int] = field(default_factory=dict)
    prior_s: Mapping[str, float] = field(default_factory=dict)  # expected hand-off -> Complete time per peer
    default_prior_s: float = 10.0
    e2e_prior_s: float = 60.0  # data node: expected launch -> final backward time
    agg_wait_s: float = 60.0
    probe_wait_s: float = 3.0  # data node: how long probe answers are awaited (control messages: latency only)
    policy: str = "gwtf"
    swarm_assumed_capacity: int = 4  # SWARM: the memory it assumes every peer has
    act_on_gone: bool = True  # data node: `peer_gone` of a holder in the backward pass starts a round / restart
    lend: bool = False  # GWTF: a finished data node's idle units serve the others (module doc, "Lending")
    fastest_unit: bool = False  # GWTF data node: launch on the free unit that brought microbatches back first
    one_wave: bool = False  # an iteration is one wave: what finds no route is deferred (module doc, "One wave")
    k: float = K_DEADLINE
    margin_s: float = MARGIN_S
    max_rounds: int = MAX_ROUNDS


@dataclass
class Rec:
    """A relay's record of one microbatch (one attempt)."""

    key: Key
    attempt: int
    prev: str
    path: tuple[str, ...]  # the path up to me, me included
    phase: str = "fwd"  # fwd | sending | sent | bwd | grad | done
    next: str | None = None
    rest: tuple[str, ...] = ()  # recovery chain: the stages after me ("" = replace, else resume there)
    tried: set = field(default_factory=set)
    sent_at: float = 0.0
    ordered: bool = False  # executing a RepairOrder: my stash is the original forward's, keep it on failure
    parked: bool = False  # no next hop with room: output (and any repair order) kept, retried (module doc)


@dataclass
class DMb:
    """A data node's record of one of its microbatches in flight."""

    key: Key
    attempt: int = 0
    src: str = "emb"  # the embedding side: emb (computing) | sending | sent
    next: str | None = None  # the stage-0 relay my stash went to
    rest: tuple[str, ...] = ()
    tried: set = field(default_factory=set)
    sent_at: float = 0.0
    sink: str | None = None  # None (forward not back yet) | loss | grad | wait | final
    path: list = field(default_factory=list)  # stage -> holder (None: unknown)
    holders: set = field(default_factory=set)  # every node that reported taking this attempt
    launched_at: float = 0.0
    rounds: int = 0
    collecting: bool = False
    snapshot: dict = field(default_factory=dict)
    final_from: str | None = None  # the stage-0 relay the last backward came from
    parked: bool = False  # a recovery found every live stage-0 relay full: retried when a slot frees
    bwd_done: set = field(default_factory=set)  # stages whose holder reported its backward computed (MbState grad)


@dataclass
class RecoveryStats:
    reroutes: int = 0
    denies_sent: int = 0
    deferred: int = 0
    probes: int = 0  # GWTF probe rounds
    recovers: int = 0  # stage forwards recomputed from a stash (Recover sent)
    resends: int = 0  # gradients resent (Resume)
    restarts: int = 0  # SWARM: whole-pipeline restarts
    gave_up: int = 0  # attempts given up after MAX_ROUNDS (deferred)
    lent: int = 0  # data node: units lent to other data nodes (Lend)
    borrowed: int = 0  # data node: units lent to me
    presumed_dead: int = 0
    agg_deadlines: int = 0
    stale: int = 0  # messages of an older attempt, ignored


class RecoveryNode:
    def __init__(self, cfg: RecoveryConfig, rng: random.Random, *, first_seq: int = 0) -> None:
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy {cfg.policy!r}")
        self.cfg = cfg
        self.me = cfg.node_id
        self.rng = rng
        self.stage = cfg.stage
        self.is_data = cfg.stage < 0
        self.nstages = cfg.last_stage + 1
        self.swarm = cfg.policy == "swarm"
        self.next_peers: dict[str, float] = dict(cfg.next_peers)
        self.prev_peers: dict[str, float] = dict(cfg.prev_peers)
        self.peer_cap: dict[str, int] = dict(cfg.peer_capacity)
        self.est: dict[str, float] = dict(cfg.prior_s)
        self.dead: set[str] = set()
        self.gone: set[str] = set()  # peers the membership layer reported gone (`peer_gone`)
        self.full: set[str] = set()
        self.denied: set[str] = set()  # peers I sent MbDeny to: they get Room when a slot frees
        self.mbs: dict = {}  # relay: Key -> Rec; data node: Key -> DMb
        self.out: dict[str, dict[str, int]] = {}  # gwtf flows: data node -> next hop -> units
        self.contrib: dict[int, set[Key]] = {}
        self.stats = RecoveryStats()
        # phases
        self.begun: set[int] = set()
        self.stepped: set[int] = set()
        self.can_take_from: dict[int, set[str]] = {}
        self.can_take_done: set[int] = set()
        self.done_reports: dict[int, dict[str, int]] = {}
        # data node
        self.ledger = Ledger()
        self.iteration = 0
        self.next_seq = first_seq
        self.waiting: list[int] = []
        self.carry: list[int] = []  # deferred seqs for the next iteration
        self.e2e_est = cfg.e2e_prior_s
        self.reported: set[int] = set()
        self.others_done: dict[int, set[str]] = {}  # lending: iteration -> data nodes that reported it settled
        self.lent: dict[str, int] = {}  # lending: stage-0 relay -> units other data nodes lent me this iteration
        self.rt: dict[str, float] = {}  # data node: stage-0 relay -> EWMA of launch -> final time through it

    # ------------------------------------------------------------------ setup
    def set_flows(self, out: Mapping[str, Mapping[str, int]], now: float | None = None) -> list:
        """Flows (units per data node and next hop), e.g. from the flow machines.

        With `now` (new flows during training): a data node launches on units that became free."""
        self.out = {d: dict(o) for d, o in out.items()}
        eff: list = []
        if now is not None and self.is_data:
            self._launch(now, eff)
        return eff

    def on_peer_joined(self, now: float, peer: str, *, next_stage: bool, capacity: int, cost: float,
                       prior_s: float | None = None) -> list:
        """Discovery found a new peer of the next (or previous) stage: a joiner."""
        (self.next_peers if next_stage else self.prev_peers)[peer] = cost
        self.gone.discard(peer)
        self.peer_cap[peer] = capacity
        self.est[peer] = prior_s if prior_s is not None else self.cfg.default_prior_s
        eff: list = []
        if self.is_data and next_stage:
            self._launch(now, eff)
        elif next_stage:  # a route again: parked microbatches go on, peers I denied may send again
            for r in [r for r in self.mbs.values() if r.parked]:
                r.parked, r.tried = False, set()
                self._route(now, r, eff)
            self._room(eff)
        return eff

    def start(self, now: float) -> list:
        eff: list = []
        if self.is_data:
            self._open(now, 0, eff)
        return eff

    # ---------------------------------------------------------------- helpers
    def _live_next(self) -> list[str]:
        return [j for j in self.next_peers if j not in self.dead]

    def _slots_used(self) -> int:
        if self.is_data:
            return 0
        return sum(1 for r in self.mbs.values() if r.phase in SLOT_PHASES)

    def _inflight(self, j: str, d: str | None = None) -> int:
        """Microbatches whose activations I sent to j and j still holds (they occupy a unit / a slot)."""
        n = 0
        for m in self.mbs.values():
            if m.next != j or (d is not None and m.key[0] != d):
                continue
            if self.is_data or m.phase in SLOT_PHASES:
                n += 1
        return n

    def _waiting_to(self, j: str) -> int:
        if self.is_data:
            return sum(1 for m in self.mbs.values() if m.next == j and m.src == "sending")
        return sum(1 for m in self.mbs.values() if m.next == j and m.phase == "sending")

    def _deadline(self, now: float, j: str) -> float:
        e = self.est.get(j, self.cfg.default_prior_s)
        return now + self.cfg.k * e * (1 + self._waiting_to(j)) + self.cfg.margin_s

    def _measure(self, j: str, sample: float) -> None:
        _ewma(self.est, j, sample)

    def _gone_ahead(self, m: DMb, gone: set) -> bool:
        """A holder of m's path in `gone` whose stage has not reported its backward: the backward cannot pass it."""
        return any(h in gone and s not in m.bwd_done for s, h in enumerate(m.path))

    def _room_for(self, j: str) -> bool:
        cap = self.cfg.swarm_assumed_capacity if self.swarm else self.peer_cap.get(j, 1)
        return self._inflight(j) < cap

    def _greedy(self, exclude: set) -> str | None:
        c = [(self.next_peers[j], j) for j in self._live_next()
             if j not in self.full and j not in exclude and self._room_for(j)]
        return min(c)[1] if c else None

    def _choose_next(self, d: str, exclude: set, *, fresh: bool = False) -> str | None:
        """Next hop for a microbatch of data node d; `fresh`: a new launch (flows only)."""
        if not self.is_data and self.stage == self.cfg.last_stage:
            return d
        if self.swarm:
            return self._greedy(exclude)
        ok = [j for j in self._live_next() if j not in self.full and j not in exclude]
        units = self.out.get(d, {})
        if self.is_data and self.lent:  # units lent to me (Lend) for this iteration
            units = dict(units)
            for j, n in self.lent.items():
                units[j] = units.get(j, 0) + n
        inflight = {j: self._inflight(j, d) for j in units}
        costs = self.next_peers
        if self.is_data and fresh and self.cfg.fastest_unit:  # module doc, "Fastest unit first"
            costs = {j: (self.rt.get(j, self.e2e_est), self.next_peers.get(j, float("inf"))) for j in units}
        hop = pick_next_hop(units, inflight, costs, ok)
        if hop is not None:
            return hop
        if self.cfg.lend and fresh and self.others_done.get(self.iteration):
            # another data node's microbatches of this iteration are all settled: its units are idle, I am the
            # only sender left at stage 0, so a relay with room by my own count has room
            return self._greedy(exclude)
        if self.cfg.lend and not fresh:
            for d2 in sorted(d2 for d2 in self.out if d2 != d):  # another data node's idle unit, before a repair
                u2 = self.out[d2]
                hop = pick_next_hop(u2, {j: self._inflight(j, d2) for j in u2}, self.next_peers, ok)
                if hop is not None:
                    return hop
        if fresh and any(units.get(j, 0) > 0 for j in ok):
            return None  # the flows are busy: wait for a slot
        hop = self._greedy(exclude)  # local repair: a live peer with room takes a unit
        if hop is not None:
            self.out.setdefault(d, {})[hop] = self.out.setdefault(d, {}).get(hop, 0) + 1
        return hop

    def _presume_dead(self, j: str | None) -> None:
        if j is None or j in self.dead or j in self.cfg.data_nodes:
            return
        self.dead.add(j)
        self.stats.presumed_dead += 1
        if self.swarm:
            return
        for d, units in self.out.items():  # local flow repair: move the units to live peers with room
            n = units.pop(j, 0)
            for _ in range(n):
                cands = sorted((self.next_peers[p], p) for p in self._live_next()
                               if p not in self.full
                               and sum(o.get(p, 0) for o in self.out.values()) < self.peer_cap.get(p, 1))
                if not cands:
                    break
                p = cands[0][1]
                units[p] = units.get(p, 0) + 1

    def _cancel(self, key: Key, eff: list) -> None:
        for t in TIMERS:
            eff.append(CancelTimer(f"{t}:{_k(key)}"))

    def _room(self, eff: list) -> None:
        if self.denied and not self.is_data and (self.stage == self.cfg.last_stage or self._live_next()):
            free = self.cfg.capacity - self._slots_used()
            if free > 0:
                for p in sorted(self.denied):
                    eff.append(Send(p, Room(free)))
                self.denied.clear()

    def _drop(self, key: Key, eff: list) -> None:
        if self.mbs.pop(key, None) is None:
            return
        self._cancel(key, eff)
        self._room(eff)

    def _deny(self, to: str, key: Key, attempt: int, eff: list) -> None:
        self.stats.denies_sent += 1
        self.denied.add(to)
        eff.append(Send(to, MbDeny(*key, attempt)))

    def _report(self, key: Key, attempt: int, state: str, eff: list) -> None:
        eff.append(Send(key[0], MbState(*key, attempt, self.stage, state)))

    # ------------------------------------------------------------ the events
    def on_message(self, now: float, sender: str, msg) -> list:
        eff: list = []
        self.dead.discard(sender)
        self.gone.discard(sender)  # (a peer reported gone and heard from again, e.g. restarted with its id)
        t = type(msg)
        if t in (BeginAggregation, IterationDone, CanTake, Room, Lend):
            if t is Lend:
                if self.is_data and self.cfg.lend and not self.swarm and msg.iteration == self.iteration:
                    self.lent[msg.hop] = self.lent.get(msg.hop, 0) + 1
                    self.stats.borrowed += 1
                    self._launch(now, eff)
            elif t is BeginAggregation:
                self._on_begin(now, msg, eff)
            elif t is IterationDone:
                self._on_iteration_done(now, sender, msg, eff)
            elif t is CanTake:
                self.can_take_from.setdefault(msg.iteration, set()).add(sender)
                self._maybe_can_take(now, msg.iteration, eff, forced=False)
            else:
                self.full.discard(sender)
                if self.is_data:
                    self._launch(now, eff)
                else:  # a route again: retry parked repairs, and my upstream may send again (my Room)
                    for r in [r for r in self.mbs.values() if r.parked]:
                        r.parked, r.tried = False, set()
                        self._route(now, r, eff)
                    self._room(eff)
            return eff
        if t is MbDeny:
            self.full.add(sender)
        key = (msg.data_node, msg.seq, msg.iteration)
        if self.is_data:
            self._data_message(now, sender, key, msg, eff)
        else:
            self._relay_message(now, sender, key, msg, eff)
        return eff

    def on_timer(self, now: float, tkey: str) -> list:
        eff: list = []
        kind, _, rest = tkey.partition(":")
        if kind == "ct":
            it = int(rest)
            if it not in self.can_take_done:
                self.stats.agg_deadlines += 1
                self._maybe_can_take(now, it, eff, forced=True)
            return eff
        key = _unk(rest)
        m = self.mbs.get(key)
        if m is None:
            return eff
        if self.is_data:
            self._data_timer(now, kind, m, eff)
            return eff
        if kind == "fw" and m.phase == "sending":
            self.stats.reroutes += 1
            self._presume_dead(m.next)
            m.tried.add(m.next)
            self._route(now, m, eff)
        elif kind == "fw" and m.parked:
            self.full.difference_update(self.next_peers)  # no Room came: offer it to them again, once
            m.tried = {""}
            self._route(now, m, eff)
        elif kind == "bk" and m.phase == "grad" and not self.swarm:
            eff.append(Send(key[0], BackwardStuck(*key, self.stage, m.attempt)))
        return eff

    def on_compute_done(self, now: float, key: tuple, kind: str) -> list:
        eff: list = []
        if kind == "aggregate":
            it = key[1]
            self.stepped.add(it)
            self.contrib.pop(it, None)
            self._room(eff)  # peers I denied while aggregating may send again
            self._maybe_can_take(now, it, eff, forced=False)
            if it not in self.can_take_done:
                # CAN TAKE comes back to front: a stage d levels from the end waits up to d+1 deadlines
                depth = self.cfg.last_stage - self.stage + 1
                eff.append(SetTimer(f"ct:{it}", now + self.cfg.agg_wait_s * depth))
            return eff
        m = self.mbs.get(key)
        if m is None:
            return eff
        if self.is_data:
            self._data_compute_done(now, m, kind, eff)
            return eff
        if m.phase == "fwd" and kind in ("forward", "recompute"):
            eff.append(Send(m.prev, Complete(*key, m.attempt)))
            self._route(now, m, eff)
        elif m.phase == "bwd" and kind == "backward":
            self.contrib.setdefault(key[2], set()).add(key)
            eff.append(Send(m.next, Complete(*key, m.attempt)))
            eff.append(Send(m.prev, Backward(*key, None, m.attempt)))
            m.phase, m.sent_at = "grad", now
            self._report(key, m.attempt, "grad", eff)  # backward progress: the data node's act_on_gone reads it
            eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, m.prev)))
            self._room(eff)
            for r in [r for r in self.mbs.values() if r.parked]:  # my slot at my next hop freed
                r.parked, r.tried = False, set()
                self._route(now, r, eff)
        return eff

    # =========================================================== relay side
    def _relay_message(self, now: float, sender: str, key: Key, msg, eff: list) -> None:
        t = type(msg)
        a = msg.attempt
        r: Rec | None = self.mbs.get(key)
        if t is Forward or t is Recover:
            self._on_take(now, sender, key, msg, r, eff)
            return
        if t is Probe:
            self._report(key, a, "none" if r is None or r.attempt > a else r.phase, eff)
            if r is not None and r.attempt < a:
                r.attempt = a
            return
        if t is Release:
            if r is None or r.attempt <= a:
                self.contrib.get(key[2], set()).discard(key)
                self._drop(key, eff)
            return
        if r is None or a < r.attempt:
            if r is not None:
                self.stats.stale += 1
            if t is Resume:
                eff.append(Send(sender, MbDeny(*key, a)))  # I hold nothing to resume from
            elif t is RepairOrder:
                self._report(key, a, "none", eff)
            return
        r.attempt = a
        if t is Complete:
            if r.phase == "sending" and sender == r.next:
                eff.append(CancelTimer(f"fw:{_k(key)}"))
                if not (r.rest and r.rest[0] == sender):  # (the answer to a Resume is no hand-off time)
                    self._measure(sender, now - r.sent_at)
                r.phase, r.rest, r.ordered = "sent", (), False
                r.tried.clear()
            elif r.phase == "grad" and sender == r.prev:
                eff.append(CancelTimer(f"bk:{_k(key)}"))
                self._measure(sender, now - r.sent_at)
                r.phase = "done"
        elif t is MbDeny:
            # (also after its Complete: the next hop acknowledged, then found no route on and handed it back)
            if r.phase in ("sending", "sent") and sender == r.next:
                eff.append(CancelTimer(f"fw:{_k(key)}"))
                r.tried.add(sender)
                self.stats.reroutes += 1
                self._route(now, r, eff)
        elif t is Backward:
            if r.phase in ("sent", "sending"):
                eff.append(CancelTimer(f"fw:{_k(key)}"))
                r.next, r.phase, r.rest = sender, "bwd", ()
                eff.append(Compute("backward", key))
        elif t is Resume:
            # the sender recomputed the stage before me (or the data node asks me to resend): it is my upstream
            newprev = msg.path[-1] if msg.path else sender
            r.prev = newprev
            eff.append(Send(newprev, Complete(*key, a)))
            if r.phase in ("grad", "done"):
                self.stats.resends += 1
                r.phase, r.sent_at = "grad", now
                eff.append(Send(newprev, Backward(*key, None, a)))
                eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, newprev)))
        elif t is RepairOrder:
            if r.phase != "sent":
                self._report(key, a, r.phase, eff)  # (sending: my own deadline covers it)
                return
            r.ordered = True
            if self.stage < self.cfg.last_stage:
                self._presume_dead(r.next)
            tried_before = r.tried
            r.tried = {r.next} if r.next is not None and r.next not in self.cfg.data_nodes else set()
            r.tried |= {""} & tried_before  # (a parked record's one deadline retry is spent)
            r.rest = tuple(msg.rest)
            self.stats.reroutes += 1
            self._route(now, r, eff)

    def _on_take(self, now: float, sender: str, key: Key, msg, r: Rec | None, eff: list) -> None:
        a = msg.attempt
        if r is not None:
            if a < r.attempt or (a == r.attempt and type(msg) is Forward):
                # stale, or a second branch of the same attempt (an upstream presumed me dead): keep mine
                self.stats.stale += 1
                if r.phase != "fwd":
                    eff.append(Send(sender, Complete(*key, a)))
                return
            if a > r.attempt:
                self.contrib.get(key[2], set()).discard(key)  # the old attempt's gradient is not trained on
            self._drop(key, eff)  # a newer attempt, or a repair the data node ordered: it supersedes mine
        aggregating = (msg.iteration - 1) in self.begun and (msg.iteration - 1) not in self.stepped
        if msg.iteration in self.begun or aggregating or self._slots_used() >= self.cfg.capacity:
            self._deny(sender, key, a, eff)  # (aggregating: my parameters are not those of this iteration yet)
            return
        recover = type(msg) is Recover
        self.mbs[key] = Rec(key, a, sender, tuple(msg.path) + (self.me,), rest=tuple(msg.rest) if recover else ())
        self._report(key, a, "rec" if recover else "fwd", eff)
        eff.append(Compute("recompute" if recover else "forward", key))

    def _route(self, now: float, r: Rec, eff: list) -> None:
        """Hand my stashed output on: along `rest` (a recovery chain) or the flows / greedy."""
        key, a = r.key, r.attempt
        r.parked = False
        recovering = bool(r.rest)
        if recovering and r.rest[0] != "" and not r.tried:
            j = r.rest[0]
            r.next, r.phase, r.sent_at = j, "sending", now
            eff.append(Send(j, Resume(*key, r.path, r.rest[1:], None, a)))
            # a Resume is a control message answered at once (Complete): no tensor hand-off to wait for
            eff.append(SetTimer(f"fw:{_k(key)}", now + self.cfg.probe_wait_s + self.cfg.margin_s))
            return
        j = self._choose_next(key[0], r.tried)
        if recovering and r.rest[0] != "" and j is not None and r.tried:
            # the node to resume at did not answer: it is dead too, so its stage is recomputed as well
            r.rest = ("",) + r.rest[1:]
        if j is None:
            if self.stage < self.cfg.last_stage and "" not in r.tried and (
                    recovering or r.ordered or not self.cfg.one_wave):
                # every live next-stage peer is full (or none is left): keep my output (and a repair order) and
                # my slot; retried on a Room, a slot of mine freeing, a joiner of the next stage, or once on
                # this timer (then: as below)
                r.phase, r.next, r.parked = "sent", None, True
                r.tried.clear()
                if r.ordered:
                    self._report(key, a, "sent", eff)
                peers = self._live_next() or list(self.next_peers)
                wait = max((self.est.get(j, self.cfg.default_prior_s) for j in peers), default=self.cfg.default_prior_s)
                eff.append(SetTimer(f"fw:{_k(key)}", now + self.cfg.k * wait + self.cfg.margin_s))
                return
            if r.ordered:
                # I was ordered to repair and cannot: keep my stash, tell the data node (its next round decides)
                r.phase, r.rest, r.ordered = "sent", (), False
                r.tried.clear()
                self._report(key, a, "sent", eff)
                eff.append(Send(key[0], BackwardStuck(*key, self.stage, a)))
                return
            prev = r.prev
            del self.mbs[key]  # no Room for this freed slot: I have no route, not just no room
            self._cancel(key, eff)
            self._deny(prev, key, a, eff)
            return
        r.next, r.phase, r.sent_at = j, "sending", now
        if recovering:
            self.stats.recovers += 1
            eff.append(Send(j, Recover(*key, r.path, r.rest[1:], None, a)))
        else:
            eff.append(Send(j, Forward(*key, r.path, None, a)))
        eff.append(SetTimer(f"fw:{_k(key)}", self._deadline(now, j)))

    # =========================================================== data node
    def _data_message(self, now: float, sender: str, key: Key, msg, eff: list) -> None:
        t = type(msg)
        m: DMb | None = self.mbs.get(key)
        if m is None or msg.attempt != m.attempt:
            if m is not None:
                self.stats.stale += 1
            if t is Forward:
                eff.append(Send(sender, Complete(*key, msg.attempt)))
            return
        a = m.attempt
        if t is MbState:
            if msg.state in ("fwd", "rec", "sent", "sending", "bwd", "grad", "done"):
                m.holders.add(sender)
                s = msg.stage
                if 0 <= s < self.nstages and (msg.state == "rec" or m.path[s] is None):
                    m.path[s] = sender
                    m.bwd_done.discard(s)  # (a recovery recomputes the stage: its backward is to come)
                if msg.state in ("grad", "done") and 0 <= s < self.nstages and m.path[s] == sender:
                    m.bwd_done.add(s)
            if m.collecting:
                m.snapshot[sender] = msg.state
                wanted = {p for p in m.path if p is not None}
                if wanted <= set(m.snapshot):
                    eff.append(CancelTimer(f"pr:{_k(key)}"))
                    self._decide(now, m, eff)
        elif t is Complete:
            if m.src == "sending" and sender == m.next:
                eff.append(CancelTimer(f"fw:{_k(key)}"))
                self._measure(sender, now - m.sent_at)
                m.src, m.rest = "sent", ()
                m.tried.clear()
            elif m.sink == "grad" and sender == m.path[-1]:
                eff.append(CancelTimer(f"bk:{_k(key)}"))
                self._measure(sender, now - m.sent_at)
                m.sink = "wait"
        elif t is MbDeny:
            if sender == m.next and (m.src == "sending" or (m.src == "sent" and m.sink is None)):
                eff.append(CancelTimer(f"fw:{_k(key)}"))
                m.tried.add(sender)
                self.stats.reroutes += 1
                self._src_route(now, m, eff)
        elif t is Forward:  # at the sink
            eff.append(Send(sender, Complete(*key, a)))
            if m.sink is not None:
                return
            p = list(msg.path[1:])[: self.nstages]
            m.path = p + [None] * (self.nstages - len(p))
            m.holders.update(x for x in p)
            m.sink = "loss"
            eff.append(Compute("loss", key))
        elif t is Resume:  # a recovery chain replaced the last stage: resend the loss gradient to it
            newprev = msg.path[-1] if msg.path else sender
            m.path[-1] = newprev
            eff.append(Send(newprev, Complete(*key, a)))
            if m.sink in ("grad", "wait"):
                self.stats.resends += 1
                m.sink, m.sent_at = "grad", now
                eff.append(Send(newprev, Backward(*key, None, a)))
                eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, newprev)))
        elif t is Backward:
            if m.sink in ("grad", "wait"):
                eff.append(CancelTimer(f"bk:{_k(key)}"))
                m.sink, m.final_from = "final", sender
                eff.append(Compute("final", key))
        elif t is BackwardStuck:
            if not self.swarm and not m.collecting and m.sink is not None and m.sink != "final":
                self._round(now, m, eff)

    def _data_timer(self, now: float, kind: str, m: DMb, eff: list) -> None:
        if kind == "fw" and m.src == "sending":
            self.stats.reroutes += 1
            self._presume_dead(m.next)
            m.tried.add(m.next)
            self._src_route(now, m, eff)
        elif kind == "bk" and m.sink == "grad":
            self._trouble(now, m, eff)
        elif kind == "wd":
            if m.sink != "final" and not m.collecting:
                self._trouble(now, m, eff)
        elif kind == "pr" and m.collecting:
            self._decide(now, m, eff)

    def _arm_watchdog(self, now: float, m: DMb, eff: list) -> None:
        eff.append(SetTimer(f"wd:{_k(m.key)}", now + K_E2E * self.e2e_est + self.cfg.margin_s))

    def _trouble(self, now: float, m: DMb, eff: list) -> None:
        """A microbatch is not progressing: GWTF runs a probe round, SWARM restarts it."""
        if m.sink == "final" or m.src == "emb":
            self._arm_watchdog(now, m, eff)
            return
        if self.swarm:
            self._restart(now, m, eff)
        else:
            self._round(now, m, eff)

    def _round(self, now: float, m: DMb, eff: list) -> None:
        m.rounds += 1
        if m.rounds > self.cfg.max_rounds:
            self._give_up(now, m, eff)
            return
        self.stats.probes += 1
        m.collecting, m.snapshot = True, {}
        for p in sorted({p for p in m.path if p is not None}):
            eff.append(Send(p, Probe(*m.key, tuple(x or "" for x in m.path), m.attempt)))
        eff.append(CancelTimer(f"wd:{_k(m.key)}"))
        eff.append(SetTimer(f"pr:{_k(m.key)}", now + self.cfg.probe_wait_s))

    def _decide(self, now: float, m: DMb, eff: list) -> None:
        """The recovery decision, from the probe answers (see the module doc)."""
        m.collecting = False
        S = self.nstages
        st = [m.snapshot.get(p) if p is not None else None for p in m.path]
        a, key = m.attempt, m.key
        self._arm_watchdog(now, m, eff)
        if m.sink is None:  # the forward has not reached the sink
            f = max((s for s in range(S) if st[s] in FWD_STATES), default=-1)
            if f < 0:
                if m.src == "sent":
                    self._presume_dead(m.next)
                    m.tried = {m.next}
                    self._src_route(now, m, eff)
            elif st[f] == "sent":
                eff.append(Send(m.path[f], RepairOrder(*key, a, ())))
            return
        if m.sink in ("loss", "final"):
            return  # computing here
        g = min((s for s in range(S) if st[s] in BWD_STATES), default=S)
        if any(st[s] in ("fwd", "sending") for s in range(g)):
            return  # a repair is under way
        bad = [s for s in range(g) if st[s] != "sent"]
        if not bad:
            if g < S and st[g] == "bwd":
                return
            if g == S:
                if m.sink == "grad":
                    return  # my own hop deadline covers it
                target = m.path[S - 1]
                self.stats.resends += 1
                m.sink, m.sent_at = "grad", now
                eff.append(Send(target, Backward(*key, None, a)))
                eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, target)))
            else:
                newprev = m.path[g - 1] if g > 0 else self.me
                eff.append(Send(m.path[g], Resume(*key, (newprev,), (), None, a)))
            return
        runs: list[list[int]] = []
        for s in bad:
            if runs and runs[-1][-1] == s - 1:
                runs[-1].append(s)
            else:
                runs.append([s])
        for run in runs:
            lo, hi = run[0], run[-1]
            # resume at the holder after the run; if it died meanwhile, at the one after it (and so on)
            end = min([s for s in bad if s > hi] + [s for s in range(hi + 1, S) if m.path[s] is None] + [S])
            rest = ("",) * (hi - lo + 1) + tuple(m.path[hi + 1:end]) + ((self.me,) if end == S else ())
            if lo == 0:
                self._presume_dead(m.next)
                m.tried = {m.next} if m.next is not None else set()
                m.rest = rest
                self._src_route(now, m, eff)
            else:
                eff.append(Send(m.path[lo - 1], RepairOrder(*key, a, rest)))

    def _restart(self, now: float, m: DMb, eff: list) -> None:
        """SWARM: the whole pipeline again, from the embedding, as a new attempt."""
        m.rounds += 1
        if m.rounds > self.cfg.max_rounds:
            self._give_up(now, m, eff)
            return
        self.stats.restarts += 1
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*m.key, m.attempt)))
        self._cancel(m.key, eff)
        m.attempt += 1
        m.src, m.next, m.rest, m.tried, m.sink, m.parked = "emb", None, (), set(), None, False
        m.path, m.holders, m.bwd_done, m.collecting, m.snapshot = [None] * self.nstages, set(), set(), False, {}
        m.launched_at = now
        eff.append(Compute("forward", m.key))
        self._arm_watchdog(now, m, eff)

    def _give_up(self, now: float, m: DMb, eff: list) -> None:
        self.stats.gave_up += 1
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*m.key, m.attempt)))
        self._cancel(m.key, eff)
        del self.mbs[m.key]
        self._defer(m.key, eff)
        self._launch(now, eff)
        self._maybe_done(now, m.key[2], eff)

    def _src_route(self, now: float, m: DMb, eff: list) -> None:
        """Hand my embedding-side output (the stash) to a stage-0 relay: a Forward, or a Recover chain."""
        key, a = m.key, m.attempt
        m.parked = False
        j = self._choose_next(self.me, m.tried)
        if j is None:
            if m.sink is None:
                self._put_back(now, m, eff)
            elif self._live_next():  # every live stage-0 relay is full: retried when a slot frees (`_launch`)
                m.src, m.next, m.parked = "sent", None, True
            else:  # no stage-0 relay to recover through; the next round (or giving up) decides
                m.src, m.rest = "sent", ()
            return
        m.next, m.src, m.sent_at = j, "sending", now
        if m.rest:
            self.stats.recovers += 1
            eff.append(Send(j, Recover(*key, (self.me,), m.rest[1:], None, a)))
        else:
            eff.append(Send(j, Forward(*key, (self.me,), None, a)))
        eff.append(SetTimer(f"fw:{_k(key)}", self._deadline(now, j)))

    def _put_back(self, now: float, m: DMb, eff: list) -> None:
        """No first hop for a microbatch in its forward pass: wait for a slot keeping my stash, or defer it."""
        key = m.key
        for p in sorted(m.holders):
            eff.append(Send(p, Release(*key, m.attempt)))
        self._cancel(key, eff)
        if not self.cfg.one_wave and any(
                mm.key[2] == key[2] and not mm.parked for mm in self.mbs.values() if mm is not m):
            # slots will free: park with my embedding output (no recompute), retried by `_launch`;
            # a new attempt, as the released holders' records are void
            m.attempt += 1
            m.src, m.next, m.rest, m.tried, m.parked = "parked", None, (), set(), True
            m.path, m.holders, m.bwd_done, m.sink = [None] * self.nstages, set(), set(), None
            self._arm_watchdog(now, m, eff)
            return
        del self.mbs[key]
        self._defer(key, eff)
        for s in list(self.waiting):
            self.waiting.remove(s)
            self._defer((self.me, s, key[2]), eff)
        for mm in [mm for mm in self.mbs.values() if mm.key[2] == key[2] and mm.src == "parked"]:
            self._cancel(mm.key, eff)  # nothing else in flight will free a slot for them either
            del self.mbs[mm.key]
            self._defer(mm.key, eff)
        self._maybe_done(now, key[2], eff)

    def _defer(self, key: Key, eff: list) -> None:
        self.stats.deferred += 1
        self.ledger.mark(key[2], key[1], MbStatus.DEFERRED)
        self.carry.append(key[1])

    def _data_compute_done(self, now: float, m: DMb, kind: str, eff: list) -> None:
        key = m.key
        if kind == "forward" and m.src == "emb":
            j = m.next
            if j is None or j in self.dead or j in self.full:
                j = self._choose_next(self.me, set())
            if j is None:
                self._put_back(now, m, eff)
                return
            m.next, m.src, m.sent_at = j, "sending", now
            eff.append(Send(j, Forward(*key, (self.me,), None, m.attempt)))
            eff.append(SetTimer(f"fw:{_k(key)}", self._deadline(now, j)))
        elif kind == "loss" and m.sink == "loss":
            target = m.path[-1]
            m.sink, m.sent_at = "grad", now
            # a holder of the path reported gone while the forward was on its way here (`peer_gone` acts only on a
            # microbatch in its backward pass): act now, as the report would have, not on the watchdog
            gone = self.cfg.act_on_gone and self._gone_ahead(m, self.gone)
            if gone and self.swarm:
                self._trouble(now, m, eff)  # (restart: no gradient sent down a path that cannot carry it)
                return
            eff.append(Send(target, Backward(*key, None, m.attempt)))
            eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, target)))
            self._arm_watchdog(now, m, eff)
            if gone:
                self._trouble(now, m, eff)
        elif kind == "final" and m.sink == "final":
            eff.append(Send(m.final_from or m.next, Complete(*key, m.attempt)))
            hop = m.path[0] if m.path[0] is not None else m.next  # the stage-0 relay of its unit
            if m.rounds == 0:
                self.e2e_est = (1 - EWMA_ALPHA) * self.e2e_est + EWMA_ALPHA * (now - m.launched_at)
                if m.attempt == 0 and hop is not None:  # the round trip through this unit ("Fastest unit first")
                    _ewma(self.rt, hop, now - m.launched_at)
            # every holder off the final path had a duplicate branch: release it (and its contribution)
            final = set(p for p in m.path if p is not None)
            for p in sorted(m.holders - final):
                eff.append(Send(p, Release(*key, m.attempt)))
            self.ledger.mark(key[2], key[1], MbStatus.COMPLETED)
            self._cancel(key, eff)
            del self.mbs[key]
            self._lend(key[2], hop, eff)
            self._launch(now, eff)
            self._maybe_done(now, key[2], eff)

    def _open(self, now: float, it: int, eff: list) -> None:
        self.iteration = it
        self.full.clear()  # every relay dropped its stashes in the aggregation: room again
        self.lent.clear()  # lent units were lent for the iteration before
        # one wave: the deferred first, topped up with new ones to `capacity` per iteration; else all of them
        fresh = max(0, self.cfg.capacity - len(self.carry)) if self.cfg.one_wave else self.cfg.capacity
        seqs = list(self.carry) + list(range(self.next_seq, self.next_seq + fresh))
        self.next_seq += fresh
        self.carry = []
        self.ledger.add(it, seqs)
        self.waiting = list(seqs)
        eff.append(OpenIteration(it))
        self._launch(now, eff)
        self._maybe_done(now, it, eff)

    def _launch(self, now: float, eff: list) -> None:
        if not self.is_data:
            return
        it = self.iteration
        if it in self.reported:
            return
        for m in [m for m in self.mbs.values() if m.parked]:  # a slot may have freed: parked ones first
            if self.mbs.get(m.key) is m and m.parked:
                m.parked, m.tried = False, set()
                self._src_route(now, m, eff)
        while self.waiting:
            j = self._choose_next(self.me, set(), fresh=True)
            if j is None:
                break
            seq = self.waiting.pop(0)
            key = (self.me, seq, it)
            self.ledger.mark(it, seq, MbStatus.INFLIGHT)
            m = DMb(key, next=j, path=[None] * self.nstages, launched_at=now)  # the slot is reserved
            self.mbs[key] = m
            eff.append(Compute("forward", key))
            self._arm_watchdog(now, m, eff)
        if self.waiting and (self.cfg.one_wave or not any(m.key[2] == it for m in self.mbs.values())):
            # one wave: what the opening launch could not place; else: nothing in flight and no first hop to
            # take more.  Defer the rest
            for s in list(self.waiting):
                self.waiting.remove(s)
                self._defer((self.me, s, it), eff)
            self._maybe_done(now, it, eff)

    def _lend(self, it: int, hop: str | None, eff: list) -> None:
        """Lending: a unit through `hop` freed and I have nothing left to launch in this iteration: lend it."""
        if not (self.cfg.lend and not self.swarm and hop is not None and it == self.iteration):
            return
        if self.waiting or any(m.parked for m in self.mbs.values() if m.key[2] == it):
            return
        for d in self.cfg.data_nodes:
            if d != self.me and d not in self.dead:
                self.stats.lent += 1
                eff.append(Send(d, Lend(it, hop)))

    def _maybe_done(self, now: float, it: int, eff: list) -> None:
        if not self.is_data or it in self.reported or self.waiting:
            return
        if any(m.key[2] == it for m in self.mbs.values()):
            return
        c = self.ledger.counts(it)
        if c["pending"] or c["inflight"]:
            return
        self.reported.add(it)
        msg = IterationDone(it, c["completed"], 0.0)
        if self.me == self.cfg.leader:
            self._on_iteration_done(now, self.me, msg, eff)
        else:
            eff.append(Send(self.cfg.leader, msg))
        if self.cfg.lend and not self.swarm:  # lending: the other data nodes may use my idle units
            for d in self.cfg.data_nodes:
                if d != self.me and d != self.cfg.leader and d not in self.dead:
                    eff.append(Send(d, msg))

    def _on_iteration_done(self, now: float, sender: str, msg: IterationDone, eff: list) -> None:
        if self.cfg.lend and self.is_data and sender != self.me:
            if msg.iteration >= self.iteration:  # older reports no longer matter
                self.others_done = {i: v for i, v in self.others_done.items() if i >= self.iteration}
                self.others_done.setdefault(msg.iteration, set()).add(sender)
            if msg.iteration == self.iteration:
                self._launch(now, eff)  # its units are idle now: launch on them
        if self.me != self.cfg.leader:
            return
        reps = self.done_reports.setdefault(msg.iteration, {})
        reps[sender] = msg.completed
        if msg.iteration in self.begun or any(d not in reps for d in self.cfg.data_nodes):
            return
        begin = BeginAggregation(msg.iteration, sum(reps.values()))
        for d in self.cfg.data_nodes:
            if d != self.me:
                eff.append(Send(d, begin))
        self._on_begin(now, begin, eff)

    # ---- aggregation --------------------------------------------------------
    def _on_begin(self, now: float, msg: BeginAggregation, eff: list) -> None:
        it = msg.iteration
        if it in self.begun:
            return
        self.begun.add(it)
        if self.is_data or self.stage < self.cfg.last_stage:
            for j in sorted(self._live_next()):
                if j not in self.cfg.data_nodes:
                    eff.append(Send(j, msg))
        if not self.is_data:
            for key in [k for k in self.mbs if k[2] <= it]:
                self._drop(key, eff)
            self.full.clear()  # the next stage drops its stashes too
            self.denied.clear()
        eff.append(Compute("aggregate", ("agg", it), len(self.contrib.get(it, ()))))

    def _maybe_can_take(self, now: float, it: int, eff: list, *, forced: bool) -> None:
        if it not in self.stepped or it in self.can_take_done:
            return
        heard = self.can_take_from.get(it, set())
        if (self.is_data or self.stage < self.cfg.last_stage) and not heard and not forced:
            return  # V-E: my step is done and a downstream peer has finished too (any one: a dead one never will)
        self.can_take_done.add(it)
        eff.append(CancelTimer(f"ct:{it}"))
        if self.is_data:
            self._open(now, it + 1, eff)
            return
        msg = CanTake(it, self.stage)
        for p in sorted(self.prev_peers):
            if p not in self.dead:
                eff.append(Send(p, msg))

    # ---- hooks for a driver that runs the aggregation phase itself (the daemon) ----
    # The daemon keeps `pipeline.Phases` for BEGIN AGGREGATION / CAN TAKE (it carries the
    # membership groups of the joining issue) and uses this machine for the microbatches.
    # It gives the machine no leader (`cfg.leader == ""`): a data node's IterationDone then
    # goes to "" and the driver reports the iteration itself (`reported` says when).

    def open_iteration(self, now: float, it: int) -> list:
        """Data node: the previous iteration's steps are applied everywhere; push the microbatches of `it`."""
        eff: list = []
        self._open(now, it, eff)
        return eff

    def begin_aggregation(self, now: float, it: int) -> tuple[list, frozenset]:
        """Relay: BEGIN AGGREGATION of `it` arrived; drop what is left of its microbatches.

        Returns the effects and the contributions to count: the keys of `it`
        whose backward this node computed and that were not released."""
        eff: list = []
        self.begun.add(it)
        if not self.is_data:
            for key in [k for k in self.mbs if k[2] <= it]:
                self._drop(key, eff)
            self.full.clear()
            self.denied.clear()
        return eff, frozenset(self.contrib.get(it, ()))

    def aggregation_done(self, now: float, it: int) -> list:
        """The step of `it` is applied here: room again for the next iteration's microbatches."""
        eff: list = []
        self.stepped.add(it)
        self.contrib.pop(it, None)
        self._room(eff)
        return eff

    def peer_gone(self, now: float, peer: str) -> list:
        """The driver's liveness check found `peer` dead (or it left): no more work goes to it.

        The microbatches it held are found by the usual means (hop deadlines,
        BackwardStuck, the data node's watchdog and probes); with
        `cfg.act_on_gone` a data node also acts at once on those of its
        microbatches in their backward pass that `peer` held (a round / a
        SWARM restart), and on those still in their forward pass when their
        loss is computed (`_data_compute_done`)."""
        self._presume_dead(peer)
        self.dead.add(peer)
        self.gone.add(peer)
        eff: list = []
        if self.is_data:
            # a holder of a microbatch in its backward pass is gone before its stage's backward was computed
            # there: act now (GWTF: a round; SWARM: restart).  A stage the backward already passed needs nothing.
            for m in [m for m in self.mbs.values() if self.cfg.act_on_gone and peer in m.holders
                      and m.sink in ("grad", "wait") and self._gone_ahead(m, {peer})]:
                if self.mbs.get(m.key) is m and not m.collecting and peer in m.holders:
                    self._trouble(now, m, eff)
            self._launch(now, eff)
        if peer in self.cfg.data_nodes:
            self._data_node_gone(now, peer, eff)
        return eff

    def _data_node_gone(self, now: float, peer: str, eff: list) -> None:
        """A data node died: its microbatches die with it (their owner and ledger are gone).

        Rule: none of its microbatches of an iteration not yet aggregated counts
        anywhere (which of them completed died with it): relays drop them and
        their contributions, its IterationDone no longer counts.  If it was the
        leader, the lowest surviving data node leads (the outcome of the
        election of `leader.py`, whose bound the driver accounts for; a driver
        that runs the aggregation itself, with no leader here, is unaffected);
        data nodes send their pending IterationDone to it."""
        if not self.is_data:
            for key in [k for k in self.mbs if k[0] == peer]:
                self._drop(key, eff)
            for it, keys in self.contrib.items():
                if it not in self.begun:
                    self.contrib[it] = {k for k in keys if k[0] != peer}
        rest = tuple(d for d in self.cfg.data_nodes if d != peer)
        leader = self.cfg.leader
        if leader == peer:
            leader = min(rest) if rest else ""
        changed = leader != self.cfg.leader
        self.cfg = replace(self.cfg, data_nodes=rest, leader=leader)
        if not self.is_data or not leader:
            return
        for it, reps in self.done_reports.items():
            if it not in self.begun:
                reps.pop(peer, None)
        for it in sorted(self.reported - self.begun):
            c = self.ledger.counts(it)
            msg = IterationDone(it, c["completed"], 0.0)
            if leader == self.me:
                self._on_iteration_done(now, self.me, msg, eff)
            elif changed:
                eff.append(Send(leader, msg))

    def set_neighbours(self, now: float, next_peers: Mapping[str, float], prev_peers: Mapping[str, float],
                       peer_capacity: Mapping[str, int], prior_s: float) -> list:
        """The driver's current neighbours: link costs of the next and previous peers, next peers' capacities.

        A capacity of 0 or none keeps the one known; a new next peer's hop estimate starts at `prior_s`."""
        self.next_peers = dict(next_peers)
        self.prev_peers = dict(prev_peers)
        for j in self.next_peers:
            if peer_capacity.get(j):
                self.peer_cap[j] = peer_capacity[j]
            self.est.setdefault(j, prior_s)
        return []

    def peer_alive(self, now: float, peer: str) -> list:
        """The driver's liveness check still hears `peer`: if it was presumed dead on a hop deadline, it is not."""
        self.dead.discard(peer)
        return []


def _ewma(table: dict, k: str, sample: float) -> None:
    e = table.get(k)
    table[k] = sample if e is None else (1 - EWMA_ALPHA) * e + EWMA_ALPHA * sample


def _k(key: Key) -> str:
    return f"{key[0]}|{key[1]}|{key[2]}"


def _unk(s: str) -> Key:
    d, seq, it = s.rsplit("|", 2)
    return (d, int(seq), int(it))

"""Microbatch lifecycle with crash handling (sections V-D and V-E of the GWTF paper).

One `RecoveryNode` per node (data node or relay).  It is pure: it is handed
`now`, the events (messages, timers, finished computations) and a seeded
`random.Random`, and returns effects: `Send`, `SetTimer`, `CancelTimer` (see
`effects.py`), `Compute` (run a stage forward / backward / recompute / the
aggregation step, then call `on_compute_done`) and `OpenIteration`.  The
simulator (`sim/train.py`) executes them in virtual time; the daemon will run
the same machine with torch.

Microbatch, forward pass
------------------------
A microbatch key is `(data_node, seq, iteration)`.  A node that computed a
stage sends `Complete` to the peer it got the input from *after finishing the
computation* ("after completing a batch", V-D), then hands its output to the
next hop and keeps that output (the stash) until the backward pass came back
through it.  The hand-off waits for the next hop's `Complete`: the deadline is

    now + K * est(peer) * (1 + my hand-offs to that peer still waiting) + MARGIN_S

where `est(peer)` is an EWMA (weight `EWMA_ALPHA` on the newest sample) of the
measured time from hand-off to `Complete` (transfer + queue + compute),
initialised with the driver's prior (link model and profiled compute), and the
factor `(1 + waiting)` covers my own earlier hand-offs queued on the same
link.  K = 3: a measured hand-off varies by less than 2x in the Table II
setting (queueing behind at most `capacity` microbatches), so 3x separates a
slow peer from a dead one without waiting long.

No `Complete` in time: the next hop is presumed dead, its units of flow are
moved to live peers of its stage with room (local flow repair), and the
microbatch is resent from the stash to another next hop: the cheapest with a
free unit of flow of this data node, else (repair) the cheapest live peer of
the next stage with room as far as this node knows.  With no alternative the
node sends `MbDeny` upstream and drops the microbatch; the upstream node does
the same, recursively up to the data node, which tries its other first hops
and otherwise *defers* the microbatch: ledger DEFERRED in this iteration,
pushed again (a new ledger entry) in the next one.  A receiver without room
answers `MbDeny` too; peers that sent `MbDeny` are offered no new work until
they send `Room` (sent when one of their slots frees).

Microbatch, backward pass
-------------------------
At the sink the data node computes the loss and sends `Backward` to the last
relay; every node hands the gradient upstream and waits for `Complete` (sent
after the upstream node's backward computation), keeping the gradient it
sent.  A node whose upstream peer does not answer tells the data node
(`BackwardStuck`) and keeps its gradient.  The data node (also on its own
deadline, or on an end-to-end deadline as a safety net) probes the path:
`Probe` travels from node to node along the current next hops and is
acknowledged hop by hop (`ProbeAck`; a node that holds nothing of the
microbatch does not acknowledge: the chain is broken there as if it were
dead); the last live node before a missing
acknowledgement sends its stashed output (`Recover`) to a live node of the
crashed stage chosen by its flows; that node recomputes the stage forward and
sends `Resume` to the node after the gap, which answers `Complete` and
resends its stored gradient; the backward resumes from there.  Last resort:
after `MAX_PROBES` probes that did not get the microbatch moving (a repair
that went wrong under several crashes at once) the data node restarts it as
SWARM does (counted in `stats.restarts`).  If the node
after the gap is dead too, the recovering node treats it like a dead next hop
and sends `Recover` on to a live peer of that stage.  No pipeline restart.

SWARM policy (`policy="swarm"`, the paper's baseline)
----------------------------------------------------
Greedy next hop: the cheapest live next-stage peer with room as far as this
node knows (no flows); resend after a forward timeout (same deadline rule);
after any backward failure the data node releases the attempt (`Release` to
every node of the path: stashes and gradients of the attempt are dropped)
and recomputes the *whole* pipeline from its own forward.

Aggregation (V-E), with deadlines
---------------------------------
A data node sends `IterationDone` to the leader when none of its microbatches
of the iteration is pending or in flight.  The leader sends
`BeginAggregation` to the other data nodes and to every live stage-0 relay;
every relay passes it to every live relay of the next stage (so it reaches
everyone alive while one relay per stage lives), drops what is left of the
iteration's microbatches and starts its step (`Compute("aggregate")`; the
driver / daemon all-reduces the gradient sums and counts over the live relays
of the stage, waiting at most a deadline for a dead one).  `CanTake` goes
back to front: the last stage after its step; another node after its step and
a `CanTake` from every next-stage peer it believes alive, or after
`agg_wait_s` x (stages behind it + 1): the deadlines nest, back to front.  A data node opens the
next iteration the same way.

Contributions lost inside a crashed relay (the rule)
----------------------------------------------------
A relay accumulates the gradient of every microbatch whose backward it
computed (`contrib[iteration]`).  If it dies before its stage's all-reduce,
those contributions die with it.  Rule: the stage's update is the sum of the
gradients the survivors of that stage hold divided by the number of
microbatches those survivors hold (`Compute.count`, summed by the
all-reduce); the microbatch stays COMPLETED at the data node and is *not*
re-queued (the other stages did learn from it; training them on it again
would count it twice).  The driver counts these cases (`lost_contributions`).

Leader: the leader is a persistent data node here (as the two data nodes of
Table II); its own crash (election) is the business of `leader.py`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping

from .effects import CancelTimer, Send, SetTimer
from .messages import (
    Backward, BackwardStuck, BeginAggregation, CanTake, Complete, Forward, IterationDone, MbDeny, Probe,
    ProbeAck, Recover, Release, Resume, Room,
)
from .pipeline import Ledger, MbStatus, OpenIteration, pick_next_hop

K_DEADLINE = 3.0  # deadline = K x expected + margin (see the module doc)
MARGIN_S = 2.0
EWMA_ALPHA = 0.3
POLICIES = ("gwtf", "swarm")
MAX_PROBES = 3  # GWTF: after this many probes that did not get a microbatch moving, restart it (last resort)

Key = tuple  # (data_node, seq, iteration)


@dataclass(frozen=True, slots=True)
class Compute:
    """Run a computation, then call `on_compute_done(now, key, kind)`.

    kind: "forward" (a stage forward; at a data node the embedding side),
    "backward" (a stage backward; at a data node the loss + head at the sink,
    then the embedding backward), "recompute" (a stage forward redone from a
    stored activation after a crash), "aggregate" (all-reduce + optimizer step
    of `key = ("agg", iteration)` over `count` held microbatch contributions).
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
    e2e_prior_s: float = 60.0  # data node: expected loss -> last backward time
    agg_wait_s: float = 60.0
    policy: str = "gwtf"
    k: float = K_DEADLINE
    margin_s: float = MARGIN_S


@dataclass
class Mb:
    key: Key
    prev: str | None  # who gave it to me (None at the data node's source side)
    path: tuple[str, ...]  # the path up to me, me included
    phase: str = "fwd"  # fwd | sending | sent | bwd | grad_sent | (data) loss | waitbwd | final
    next: str | None = None
    rest: tuple[str, ...] = ()  # recovery: the old path after `next`
    tried: set = field(default_factory=set)
    sent_at: float = 0.0
    full_path: tuple[str, ...] = ()  # data node: the path as it reached the sink
    sink_prev: str | None = None  # data node: the last relay
    probing: bool = False
    e2e_expect: float = 0.0
    e2e_at: float | None = None
    src_wait: bool = False  # data node: waiting for the Complete of a Recover it sent
    probes: int = 0  # data node: probes sent for this microbatch


@dataclass
class RecoveryStats:
    reroutes: int = 0
    denies_sent: int = 0
    deferred: int = 0
    probes: int = 0
    recovers: int = 0
    restarts: int = 0
    presumed_dead: int = 0
    agg_deadlines: int = 0


class RecoveryNode:
    def __init__(self, cfg: RecoveryConfig, rng: random.Random, *, first_seq: int = 0) -> None:
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy {cfg.policy!r}")
        self.cfg = cfg
        self.me = cfg.node_id
        self.rng = rng
        self.stage = cfg.stage
        self.is_data = cfg.stage < 0
        self.swarm = cfg.policy == "swarm"
        self.next_peers: dict[str, float] = dict(cfg.next_peers)
        self.prev_peers: dict[str, float] = dict(cfg.prev_peers)
        self.peer_cap: dict[str, int] = dict(cfg.peer_capacity)
        self.est: dict[str, float] = dict(cfg.prior_s)
        self.dead: set[str] = set()
        self.full: set[str] = set()
        self.denied: set[str] = set()  # peers I sent MbDeny to: they get Room when a slot frees
        self.mbs: dict[Key, Mb] = {}
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

    # ------------------------------------------------------------------ setup
    def set_flows(self, out: Mapping[str, Mapping[str, int]]) -> None:
        """Initial flows (units per data node and next hop), e.g. from the flow machines."""
        self.out = {d: dict(o) for d, o in out.items()}

    def on_peer_joined(self, now: float, peer: str, *, next_stage: bool, capacity: int, cost: float,
                       prior_s: float | None = None) -> list:
        """Discovery found a new peer of the next (or previous) stage: a joiner."""
        (self.next_peers if next_stage else self.prev_peers)[peer] = cost
        self.peer_cap[peer] = capacity
        self.est[peer] = prior_s if prior_s is not None else self.cfg.default_prior_s
        eff: list = []
        if self.is_data and next_stage:
            self._launch(now, eff)
        return eff

    def start(self, now: float) -> list:
        eff: list = []
        if self.is_data:
            self._open(now, 0, eff)
        return eff

    # ---------------------------------------------------------------- helpers
    def _live_next(self) -> list[str]:
        return [j for j in self.next_peers if j not in self.dead]

    def _inflight(self, j: str, d: str | None = None) -> int:
        n = 0
        for m in self.mbs.values():
            if m.next == j and (d is None or m.key[0] == d):
                n += 1
        return n

    def _waiting_to(self, j: str) -> int:
        return sum(1 for m in self.mbs.values() if m.next == j and m.phase == "sending")

    def _deadline(self, now: float, j: str) -> float:
        e = self.est.get(j, self.cfg.default_prior_s)
        return now + self.cfg.k * e * (1 + self._waiting_to(j)) + self.cfg.margin_s

    def _measure(self, j: str, sample: float) -> None:
        e = self.est.get(j)
        self.est[j] = sample if e is None else (1 - EWMA_ALPHA) * e + EWMA_ALPHA * sample

    def _room_for(self, j: str) -> bool:
        return self._inflight(j) < self.peer_cap.get(j, 1)

    def _greedy(self, exclude: set) -> str | None:
        c = [(self.next_peers[j], j) for j in self._live_next()
             if j not in self.full and j not in exclude and self._room_for(j)]
        return min(c)[1] if c else None

    def _choose_next(self, d: str, exclude: set, *, fresh: bool = False) -> str | None:
        """Next hop for a microbatch of data node d; `fresh`: a new launch (flows only)."""
        if not self.is_data and self.stage == self.cfg.last_stage:
            return None if d in exclude else d
        if self.swarm:
            return self._greedy(exclude)
        ok = [j for j in self._live_next() if j not in self.full and j not in exclude]
        units = self.out.get(d, {})
        inflight = {j: self._inflight(j, d) for j in units}
        hop = pick_next_hop(units, inflight, self.next_peers, ok)
        if hop is not None:
            return hop
        if fresh and any(units.get(j, 0) > 0 for j in ok):
            return None  # the flows are busy: wait for a slot
        hop = self._greedy(exclude)  # local repair: a live peer with room takes a unit
        if hop is not None:
            self.out.setdefault(d, {})[hop] = self.out.setdefault(d, {}).get(hop, 0) + 1
        return hop

    def _presume_dead(self, j: str) -> None:
        if j in self.dead or j in self.cfg.data_nodes:
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

    def _heard(self, j: str) -> None:
        self.dead.discard(j)

    def _free(self, key: Key, eff: list) -> None:
        m = self.mbs.pop(key, None)
        if m is None:
            return
        for t in ("fw", "bk", "pb", "e2e", "rc"):
            eff.append(CancelTimer(f"{t}:{_k(key)}"))
        if self.denied and not self.is_data:
            free = self.cfg.capacity - len(self.mbs)
            if free > 0:
                for p in sorted(self.denied):
                    eff.append(Send(p, Room(free)))
                self.denied.clear()

    def _deny(self, to: str, key: Key, eff: list) -> None:
        self.stats.denies_sent += 1
        self.denied.add(to)
        eff.append(Send(to, MbDeny(*key)))

    # ------------------------------------------------------------ the events
    def on_message(self, now: float, sender: str, msg) -> list:
        eff: list = []
        self._heard(sender)
        t = type(msg)
        if t is Forward:
            self._on_forward(now, sender, msg, eff)
        elif t is Complete:
            self._on_complete(now, sender, (msg.data_node, msg.seq, msg.iteration), eff)
        elif t is Backward:
            self._on_backward(now, sender, (msg.data_node, msg.seq, msg.iteration), eff)
        elif t is MbDeny:
            self.full.add(sender)
            self._on_deny(now, sender, (msg.data_node, msg.seq, msg.iteration), eff)
        elif t is Room:
            self.full.discard(sender)
            if self.is_data:
                self._launch(now, eff)
        elif t is Probe:
            self._on_probe(now, sender, msg, eff)
        elif t is ProbeAck:
            eff.append(CancelTimer(f"pb:{_k((msg.data_node, msg.seq, msg.iteration))}"))
        elif t is Recover:
            self._on_recover(now, sender, msg, eff)
        elif t is Resume:
            self._on_resume(now, sender, msg, eff)
        elif t is BackwardStuck:
            self._backward_trouble(now, (msg.data_node, msg.seq, msg.iteration), eff)
        elif t is Release:
            key = (msg.data_node, msg.seq, msg.iteration)
            self.contrib.get(msg.iteration, set()).discard(key)
            self._free(key, eff)
        elif t is IterationDone:
            self._on_iteration_done(now, sender, msg, eff)
        elif t is BeginAggregation:
            self._on_begin(now, msg, eff)
        elif t is CanTake:
            self.can_take_from.setdefault(msg.iteration, set()).add(sender)
            self._maybe_can_take(now, msg.iteration, eff, forced=False)
        return eff

    def on_timer(self, now: float, key: str) -> list:
        eff: list = []
        kind, _, rest = key.partition(":")
        if kind == "ct":
            it = int(rest)
            if it not in self.can_take_done:
                self.stats.agg_deadlines += 1
                self._maybe_can_take(now, it, eff, forced=True)
            return eff
        mkey = _unk(rest)
        m = self.mbs.get(mkey)
        if m is None:
            return eff
        if kind == "fw" and m.phase == "sending":
            self.stats.reroutes += 1
            self._presume_dead(m.next)
            m.tried.add(m.next)
            self._route(now, m, eff)
        elif kind == "bk" and m.phase in ("grad_sent",):
            self._presume_dead(m.prev if not self.is_data else m.sink_prev)
            if self.is_data:
                self._backward_trouble(now, mkey, eff)
            else:
                eff.append(Send(mkey[0], BackwardStuck(*mkey, self.stage)))
        elif kind == "pb":
            self._presume_dead(m.next)
            self._recover_after(now, m, eff)
        elif kind == "rc" and self.is_data and m.src_wait:
            self._presume_dead(m.next)
            m.tried.add(m.next)
            self._data_recover(now, m, eff)
        elif kind == "e2e" and self.is_data:
            m.probing = False
            self._backward_trouble(now, mkey, eff)
        return eff

    # ---- forward ------------------------------------------------------------
    def _on_forward(self, now: float, sender: str, msg: Forward, eff: list) -> None:
        key = (msg.data_node, msg.seq, msg.iteration)
        if self.is_data:  # at the sink
            m = self.mbs.get(key)
            eff.append(Send(sender, Complete(*key)))
            if m is None or m.phase not in ("sent", "sending") or m.full_path:
                return  # a duplicate or a stale attempt
            m.full_path = tuple(msg.path)
            m.sink_prev = sender
            m.phase = "loss"
            m.probing = False
            eff.append(CancelTimer(f"e2e:{_k(key)}"))
            eff.append(CancelTimer(f"pb:{_k(key)}"))
            eff.append(Compute("backward", key))
            return
        if key in self.mbs:
            self._free(key, eff)  # a stale attempt (SWARM restart, or a duplicate): the new one wins
        if msg.iteration in self.begun or len(self.mbs) >= self.cfg.capacity:
            self._deny(sender, key, eff)
            return
        self.mbs[key] = Mb(key, sender, tuple(msg.path) + (self.me,))
        eff.append(Compute("forward", key))

    def _on_recover(self, now: float, sender: str, msg: Recover, eff: list) -> None:
        key = (msg.data_node, msg.seq, msg.iteration)
        if key in self.mbs:
            self._free(key, eff)
        if msg.iteration in self.begun or len(self.mbs) >= self.cfg.capacity:
            self._deny(sender, key, eff)
            return
        self.mbs[key] = Mb(key, sender, tuple(msg.path) + (self.me,), rest=tuple(msg.rest))
        eff.append(Compute("recompute", key))

    def on_compute_done(self, now: float, key: tuple, kind: str) -> list:
        eff: list = []
        if kind == "aggregate":
            it = key[1]
            self.stepped.add(it)
            self.contrib.pop(it, None)
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
            self._data_compute_done(now, m, eff)
            return eff
        if m.phase == "fwd":
            eff.append(Send(m.prev, Complete(*key)))
            self._route(now, m, eff)
        elif m.phase == "bwd":
            self.contrib.setdefault(key[2], set()).add(key)
            eff.append(Send(m.next, Complete(*key)))
            eff.append(Send(m.prev, Backward(*key, None)))
            m.phase = "grad_sent"
            m.sent_at = now
            eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, m.prev)))
        return eff

    def _route(self, now: float, m: Mb, eff: list) -> None:
        """Hand the stashed output on.

        * `rest` and nothing tried: I recomputed a crashed stage; `Resume` the old path at `rest[0]`.
        * `rest` and a hop tried (dead / denied): `Recover` at another live node of that stage.
        * otherwise a plain `Forward` along the flows (or SWARM's greedy hop).
        """
        key = m.key
        if m.rest and not m.tried:
            j = m.rest[0]
            m.next, m.rest = j, m.rest[1:]
            m.phase, m.sent_at = "sending", now
            eff.append(Send(j, Resume(*key, m.path, m.rest, None)))
            eff.append(SetTimer(f"fw:{_k(key)}", self._deadline(now, j)))
            return
        j = self._choose_next(key[0], m.tried)
        if j is None:
            self._give_back(now, m, eff)
            return
        m.next, m.phase, m.sent_at = j, "sending", now
        if m.rest:
            self.stats.recovers += 1
            eff.append(Send(j, Recover(*key, m.path, m.rest, None)))
        else:
            eff.append(Send(j, Forward(*key, m.path, None)))
        eff.append(SetTimer(f"fw:{_k(key)}", self._deadline(now, j)))

    def _data_recover(self, now: float, m: Mb, eff: list) -> None:
        """Data node: the stage-0 relay of a microbatch in its backward pass is dead: recover from my stash."""
        j = self._choose_next(self.me, m.tried)
        if j is None:  # no stage-0 relay left: give the microbatch up for this iteration
            for p in m.full_path[1:]:
                eff.append(Send(p, Release(*m.key)))
            self._free(m.key, eff)
            self._defer(m.key, eff)
            self._maybe_done(now, m.key[2], eff)
            return
        self.stats.recovers += 1
        m.next, m.src_wait, m.sent_at = j, True, now
        eff.append(Send(j, Recover(*m.key, (self.me,), tuple(m.full_path[2:]) + (self.me,), None)))
        eff.append(SetTimer(f"rc:{_k(m.key)}", self._deadline(now, j)))

    def _give_back(self, now: float, m: Mb, eff: list) -> None:
        """No next hop: DENY upstream (a relay) or put the microbatch back / defer it (the data node)."""
        key = m.key
        if not self.is_data:
            prev = m.prev
            del self.mbs[key]  # no Room for this freed slot: I have no route, not just no room
            for t in ("fw", "bk", "pb", "e2e", "rc"):
                eff.append(CancelTimer(f"{t}:{_k(key)}"))
            self._deny(prev, key, eff)
            return
        self._free(key, eff)
        if self.ledger.status(key[2], key[1]) is MbStatus.COMPLETED:
            return
        if any(mm.key[2] == key[2] for mm in self.mbs.values()):
            self.ledger.mark(key[2], key[1], MbStatus.PENDING)  # slots will free: wait for one
            self.waiting.insert(0, key[1])
        else:
            self._defer(key, eff)
            for s in list(self.waiting):
                self.waiting.remove(s)
                self._defer((self.me, s, key[2]), eff)
        self._maybe_done(now, key[2], eff)

    def _defer(self, key: Key, eff: list) -> None:
        self.stats.deferred += 1
        self.ledger.mark(key[2], key[1], MbStatus.DEFERRED)
        self.carry.append(key[1])

    def _on_complete(self, now: float, sender: str, key: Key, eff: list) -> None:
        m = self.mbs.get(key)
        if m is None:
            return
        if self.is_data and m.src_wait and sender == m.next:
            eff.append(CancelTimer(f"rc:{_k(key)}"))
            self._measure(sender, now - m.sent_at)
            m.src_wait = False
            m.tried.clear()
            return
        if m.phase == "sending" and sender == m.next:
            eff.append(CancelTimer(f"fw:{_k(key)}"))
            self._measure(sender, now - m.sent_at)
            m.phase = "sent"
            m.tried.clear()
        elif m.phase == "grad_sent" and sender == (m.sink_prev if self.is_data else m.prev):
            eff.append(CancelTimer(f"bk:{_k(key)}"))
            self._measure(sender, now - m.sent_at)
            if self.is_data:
                m.phase = "waitbwd"
            else:
                self._free(key, eff)

    def _on_deny(self, now: float, sender: str, key: Key, eff: list) -> None:
        m = self.mbs.get(key)
        if m is None or m.next != sender:
            return
        if self.is_data and m.src_wait:
            eff.append(CancelTimer(f"rc:{_k(key)}"))
            m.tried.add(sender)
            self._data_recover(now, m, eff)
            return
        if m.phase not in ("sending", "sent") or (self.is_data and m.full_path):
            return  # a stale deny
        eff.append(CancelTimer(f"fw:{_k(key)}"))
        m.tried.add(sender)
        self.stats.reroutes += 1
        self._route(now, m, eff)

    # ---- backward -----------------------------------------------------------
    def _on_backward(self, now: float, sender: str, key: Key, eff: list) -> None:
        m = self.mbs.get(key)
        if m is None:
            return
        ok = ("grad_sent", "waitbwd") if self.is_data else ("sent", "sending")
        if m.phase not in ok:
            return
        if m.phase == "sending":
            eff.append(CancelTimer(f"fw:{_k(key)}"))
        m.next = sender
        if self.is_data:
            for t in ("bk", "rc", "e2e", "pb"):
                eff.append(CancelTimer(f"{t}:{_k(key)}"))
            m.src_wait = False
            m.phase = "final"
        else:
            m.phase = "bwd"
        eff.append(Compute("backward", key))

    def _on_probe(self, now: float, sender: str, msg: Probe, eff: list) -> None:
        key = (msg.data_node, msg.seq, msg.iteration)
        m = self.mbs.get(key)
        if m is None and not self.is_data:
            return  # I hold nothing of it: the chain is broken here; no ack, so the prober recovers past me
        eff.append(Send(sender, ProbeAck(*key)))
        if m is None or self.is_data or m.phase != "sent" or m.next is None:
            return  # the frontier (or the sink): it is alive, the probe stops here
        m.full_path = tuple(msg.path)
        eff.append(Send(m.next, Probe(*key, msg.path)))
        eff.append(SetTimer(f"pb:{_k(key)}", self._deadline(now, m.next)))

    def _recover_after(self, now: float, m: Mb, eff: list) -> None:
        """My next hop on the path is dead: send my stashed output to a live node of its stage."""
        m.tried = {m.next}
        if self.is_data:
            if m.phase in ("grad_sent", "waitbwd"):
                self._data_recover(now, m, eff)
            elif m.phase == "sent":  # forward pass: resend to another first hop
                m.rest = ()
                self._route(now, m, eff)
            return
        if m.phase != "sent" or self.stage >= self.cfg.last_stage:
            return
        if not m.full_path:  # the forward pass had not reached the sink: a plain reroute
            m.rest = ()
            self._route(now, m, eff)
            return
        path = m.full_path
        i = self.stage + 3  # path[0] is the data node, path[s+1] the relay of stage s
        m.rest = tuple(path[i:]) + (m.key[0],)
        self._route(now, m, eff)

    def _on_resume(self, now: float, sender: str, msg: Resume, eff: list) -> None:
        key = (msg.data_node, msg.seq, msg.iteration)
        m = self.mbs.get(key)
        if m is None:
            if self.is_data:
                return
            self._on_recover(now, sender, Recover(*key, msg.path, msg.rest, msg.tensor), eff)
            return
        eff.append(Send(sender, Complete(*key)))
        if self.is_data:
            m.sink_prev = sender
            if m.phase in ("grad_sent", "waitbwd"):
                m.phase, m.sent_at = "grad_sent", now
                eff.append(Send(sender, Backward(*key, None)))
                eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, sender)))
            return
        m.prev = sender
        if m.phase == "grad_sent":
            m.sent_at = now
            eff.append(Send(sender, Backward(*key, None)))
            eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, sender)))

    def _backward_trouble(self, now: float, key: Key, eff: list) -> None:
        """Data node: a backward did not come through.  GWTF probes the path; SWARM restarts the pipeline."""
        m = self.mbs.get(key)
        if m is None or not self.is_data or m.phase not in ("grad_sent", "waitbwd", "sent"):
            return
        if self.swarm or m.probes >= MAX_PROBES:
            self.stats.restarts += 1
            for p in m.full_path[1:]:
                eff.append(Send(p, Release(*key)))
            for p in (m.next, m.sink_prev):
                if p is not None and p not in m.full_path:
                    eff.append(Send(p, Release(*key)))
            self._free(key, eff)
            nm = Mb(key, None, (self.me,))
            self.mbs[key] = nm
            eff.append(Compute("forward", key))
            return
        if m.probing:
            return
        m.probing = True
        m.probes += 1
        self.stats.probes += 1
        eff.append(Send(m.next, Probe(*key, m.full_path)))
        eff.append(SetTimer(f"pb:{_k(key)}", self._deadline(now, m.next)))
        m.e2e_expect = min(2 * m.e2e_expect, 4 * self.e2e_est)
        eff.append(SetTimer(f"e2e:{_k(key)}", now + self.cfg.k * m.e2e_expect + self.cfg.margin_s))

    # ---- data node ----------------------------------------------------------
    def _open(self, now: float, it: int, eff: list) -> None:
        self.iteration = it
        self.full.clear()  # every relay dropped its stashes in the aggregation: room again
        seqs = list(self.carry) + list(range(self.next_seq, self.next_seq + self.cfg.capacity))
        self.next_seq += self.cfg.capacity
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
        while self.waiting:
            j = self._choose_next(self.me, set(), fresh=True)
            if j is None:
                break
            seq = self.waiting.pop(0)
            key = (self.me, seq, it)
            self.ledger.mark(it, seq, MbStatus.INFLIGHT)
            self.mbs[key] = Mb(key, None, (self.me,), next=j, phase="fwd")
            self.mbs[key].next = j  # reserve the slot while the embedding computes
            eff.append(Compute("forward", key))
        if self.waiting and not any(m.key[2] == it for m in self.mbs.values()):
            # nothing in flight and no first hop to take more: defer the rest
            for s in list(self.waiting):
                self.waiting.remove(s)
                self._defer((self.me, s, it), eff)
            self._maybe_done(now, it, eff)

    def _data_compute_done(self, now: float, m: Mb, eff: list) -> None:
        key = m.key
        if m.phase == "fwd":  # the embedding side is done: hand it to the first hop
            j = m.next
            if j is None or j in self.dead or j in self.full:
                m.next = None
                j = self._choose_next(self.me, set(), fresh=False)
            if j is None:
                self._give_back(now, m, eff)
                return
            m.next, m.phase, m.sent_at = j, "sending", now
            eff.append(Send(j, Forward(*key, m.path, None)))
            eff.append(SetTimer(f"fw:{_k(key)}", self._deadline(now, j)))
            # safety net for the forward pass (a hop that acked and died before passing it on)
            m.e2e_expect = self.e2e_est
            eff.append(SetTimer(f"e2e:{_k(key)}", now + 2 * self.cfg.k * m.e2e_expect + self.cfg.margin_s))
        elif m.phase == "loss":
            m.phase, m.sent_at = "grad_sent", now
            eff.append(Send(m.sink_prev, Backward(*key, None)))
            eff.append(SetTimer(f"bk:{_k(key)}", self._deadline(now, m.sink_prev)))
            m.e2e_expect = self.e2e_est
            m.e2e_at = now
            eff.append(SetTimer(f"e2e:{_k(key)}", now + 2 * self.cfg.k * m.e2e_expect + self.cfg.margin_s))
        elif m.phase == "final":
            eff.append(Send(m.next, Complete(*key)))
            started = m.e2e_at
            if started is not None and not m.probing:
                self.e2e_est = (1 - EWMA_ALPHA) * self.e2e_est + EWMA_ALPHA * (now - started)
            self.ledger.mark(key[2], key[1], MbStatus.COMPLETED)
            self._free(key, eff)
            self._launch(now, eff)
            self._maybe_done(now, key[2], eff)

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

    def _on_iteration_done(self, now: float, sender: str, msg: IterationDone, eff: list) -> None:
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
                self._free(key, eff)
            self.full.clear()  # the next stage drops its stashes too
            self.denied.clear()
        eff.append(Compute("aggregate", ("agg", it), len(self.contrib.get(it, ()))))

    def _maybe_can_take(self, now: float, it: int, eff: list, *, forced: bool) -> None:
        if it not in self.stepped or it in self.can_take_done:
            return
        heard = self.can_take_from.get(it, set())
        if self.is_data or self.stage < self.cfg.last_stage:
            need = {j for j in self._live_next() if j not in self.cfg.data_nodes}
            missing = need - heard
            if missing and not forced:
                return  # (on the deadline the silent peers are not presumed dead: a slow chain is not a crash)
        self.can_take_done.add(it)
        eff.append(CancelTimer(f"ct:{it}"))
        if self.is_data:
            self._open(now, it + 1, eff)
            return
        msg = CanTake(it, self.stage)
        for p in sorted(self.prev_peers):
            if p not in self.dead:
                eff.append(Send(p, msg))


def _k(key: Key) -> str:
    return f"{key[0]}|{key[1]}|{key[2]}"


def _unk(s: str) -> Key:
    d, seq, it = s.rsplit("|", 2)
    return (d, int(seq), int(it))

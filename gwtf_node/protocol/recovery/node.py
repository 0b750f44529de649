"""The recovery machine: `RecoveryNode`, its entry points (events in, effects out) and what composes it.

Theory of operation.  `RecoveryNode` inherits from nothing: it composes one
object per mechanism, each the only writer of its state, and keeps the
node's own fields (`cfg`, whose data nodes change as they come and go, the
policy, the counters `stats`, changed through `RecoveryStats.bump`):
`peers: Peers` (neighbours.py, which also holds the driver's neighbour
events forwarded here), `routing: Routing` (routing.py: next hops and
deadlines; `routing_class` names its class, which a policy of its own
replaces), `relay: RelaySide` (relay.py: a relay's records and the
contributions it holds), `data: DataSide` (data.py: a data node's records,
ledger and iterations) and `rounds: Rounds` (rounds.py: a data node's
recovery rounds, whose state is each record's `RoundState`).  A mechanism's
method gets the node as its first argument: it reads the others' state
through it and asks them for a change by calling their methods, never by
writing their fields (`tests/protocol/test_state_owners.py` checks it).
`mbs` is the records of the side this node is; the properties name the
others' objects for the drivers and the tests.  Which handler takes which
event is data, one table per side beside its handlers: by message type
`relay.RELAY_ANY_ATTEMPT`, `relay.RELAY_STALE`, `relay.RELAY_HANDLERS`,
`data.DATA_HANDLERS` (`Room` and `Lend`, of no microbatch, are taken here);
by timer kind `relay.RELAY_TIMERS`, `data.DATA_TIMERS`,
`rounds.ROUND_TIMERS`.  A type or kind a table does not name is ignored.

Aggregation (V-E)
-----------------
The aggregation phase is `phases.Phases`, driven next to this machine by the
same driver (daemon or simulator).  This machine tells the driver when a data
node's iteration is settled (`IterationSettled`; `reported` holds the settled
iterations), and the driver tells it when BEGIN AGGREGATION of an iteration
arrived (`begin_aggregation`: a relay drops what is left of the iteration's
microbatches and names the contributions that count), when the step is
applied (`aggregation_done`) and when a data node opens the next iteration
(`open_iteration`).  A relay that began iteration t and has not applied its
step answers `MbDeny` to a microbatch of t+1 (its parameters are not t+1's
yet) and sends `Room` once its step is applied; so does a relay whose part
holds other steps than the microbatch's iteration (`parameters_at`: an
aggregation left it out).

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

A data node that dies (`peer_gone`, `RelaySide.data_node_gone`) takes its
microbatches with it: relays drop them, and its contributions count only if
the leader had its report, i.e. only if the BEGIN of their iteration names
them (`orphaned`: a relay may hear of the death before or after the BEGIN
that names them; either way the whole pipeline counts the same).  Its report
to a leader that has not begun is dropped by `Phases.forget`.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Collection, Mapping

from ..messages import Lend, MbDeny, Room
from . import neighbours
from .data import DATA_TIMERS, DataRecord, DataSide
from .neighbours import Peers
from .records import (
    MB_MESSAGES, POLICIES, ComputeKind, Key, MbTimer, Policy, RecoveryConfig, RecoveryEffect, RecoveryStats,
)
from .relay import RELAY_TIMERS, RelayRecord, RelaySide
from .rounds import ROUND_TIMERS, Rounds
from .routing import Routing


class RecoveryNode:
    """One node's microbatch machine (a data node or a relay), pure: `now` and events in, effects out.

    It composes the mechanisms (each the only writer of its state) and keeps the node's own fields: its
    configuration (`cfg`, whose data nodes change as they come and go), its policy and its counters."""

    routing_class: type[Routing] = Routing  # the next-hop rule (a policy of its own may replace it)

    def __init__(self, cfg: RecoveryConfig, rng: random.Random, *, first_seq: int = 0) -> None:
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy {cfg.policy!r}")
        self.cfg = cfg
        self.policy = Policy(cfg.policy)
        self.me = cfg.node_id
        self.stage = cfg.stage
        self.is_data = cfg.stage < 0
        self.nstages = cfg.last_stage + 1
        self.swarm = self.policy in (Policy.SWARM, Policy.RANDOM)  # (random: SWARM's machinery, random next hops)
        self.stats = RecoveryStats()  # (changed through its `bump`)
        # the mechanisms, one object each
        self.peers = Peers.of(cfg)  # the neighbours as this node sees them (neighbours.py)
        self.routing: Routing = self.routing_class(rng)  # next hops and deadlines (routing.py)
        self.relay = RelaySide()  # a relay's microbatches and contributions (relay.py)
        self.data = DataSide(next_seq=first_seq, e2e_est=cfg.e2e_prior_s)  # a data node's (data.py)
        self.rounds = Rounds()  # a data node's recovery rounds (rounds.py)

    # Read-only views for the drivers, the simulator and the tests (the owners' objects, not copies).
    @property
    def mbs(self) -> dict[Key, RelayRecord] | dict[Key, DataRecord]:
        """The microbatches this node holds: a relay's `RelayRecord`s, a data node's `DataRecord`s."""
        return self.data.records if self.is_data else self.relay.records

    rng = property(lambda self: self.routing.rng, doc="the node's seeded RNG (its next-hop draws)")
    next_peers = property(lambda self: self.peers.next_peers, doc="next-stage peer -> link cost")
    prev_peers = property(lambda self: self.peers.prev_peers, doc="previous-stage peer -> link cost")
    peer_cap = property(lambda self: self.peers.peer_cap, doc="next-stage peer -> capacity")
    est = property(lambda self: self.peers.est, doc="peer -> EWMA of its hand-off time")
    dead = property(lambda self: self.peers.dead, doc="peers presumed dead or gone")
    gone = property(lambda self: self.peers.gone, doc="peers the membership layer reported gone")
    full = property(lambda self: self.peers.full, doc="next peers that denied a microbatch")
    denied = property(lambda self: self.peers.denied, doc="peers this node denied")
    out = property(lambda self: self.peers.out, doc="the flows: data node -> next hop -> units")
    contrib = property(lambda self: self.relay.contrib, doc="relay: iteration -> contributions held")
    orphaned = property(lambda self: self.relay.orphaned, doc="relay: contributions of data nodes gone")
    begun = property(lambda self: self.relay.begun, doc="the iterations whose BEGIN AGGREGATION arrived")
    stepped = property(lambda self: self.relay.stepped, doc="the iterations whose step is applied here")
    last_iteration = property(lambda self: self.relay.last_iteration, doc="relay leaving: its last iteration")
    ledger = property(lambda self: self.data.ledger, doc="data node: each microbatch's status per iteration")
    reported = property(lambda self: self.data.reported, doc="data node: the iterations settled (reported)")
    waiting = property(lambda self: self.data.waiting, doc="data node: seqs of the iteration not launched yet")
    carry = property(lambda self: self.data.carry, doc="data node: seqs deferred to the next iteration")
    rt = property(lambda self: self.data.rt, doc="data node: stage-0 relay -> EWMA of its round trips")
    iteration = property(lambda self: self.data.iteration, doc="data node: the iteration open here")
    next_seq = property(lambda self: self.data.next_seq, doc="data node: the seq of its next new microbatch")
    e2e_est = property(lambda self: self.data.e2e_est, doc="data node: EWMA of its microbatches' round trips")
    lent = property(lambda self: self.data.lent, doc="data node: units lent to it this iteration, per relay")

    def peers_in_flight(self) -> set[str]:
        """The peers this node's microbatches came from or went to (a relay's records' `prev` and `next`, a data
        node's `next`): the liveness check watches them closely."""
        return {p for r in self.mbs.values() for p in (getattr(r, "prev", None), r.next) if p}

    def set_data_nodes(self, nodes: tuple[str, ...]) -> None:
        """The run's data nodes now (one gone, or back: neighbours.py)."""
        self.cfg = replace(self.cfg, data_nodes=nodes)

    def start(self, now: float) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        if self.is_data:
            self.data.open(self, now, 0, eff)
        return eff

    def on_message(self, now: float, sender: str, msg) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        self.peers.heard(sender)  # (also a peer reported gone and heard from again, e.g. restarted with its id)
        t = type(msg)
        if t not in MB_MESSAGES:
            raise TypeError(f"{t.__name__} is not a microbatch message: the driver routes it elsewhere")
        if t is Room:  # (of no microbatch)
            self._on_room(now, sender, eff)
            return eff
        if t is Lend:
            self.data.on_lend(self, now, sender, msg, eff)
            return eff
        if t is MbDeny:
            self.peers.refused(sender)
        key = Key(msg.data_node, msg.seq, msg.iteration)
        if self.is_data:
            self.data.message(self, now, sender, key, msg, eff)  # data.DATA_HANDLERS
        else:
            self.relay.message(self, now, sender, key, msg, eff)  # relay.RELAY_HANDLERS
        return eff

    def _on_room(self, now: float, sender: str, eff: list[RecoveryEffect]) -> None:
        self.peers.has_room(sender)
        if self.is_data:
            self.data.launch(self, now, eff)
        else:  # a route again: retry parked repairs, and my upstream may send again (my Room)
            self.relay.retry_parked(self, now, eff)
            self.relay.room(self, eff)

    def on_timer(self, now: float, tkey: MbTimer) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        kind, key = tkey.kind, tkey.key
        m = self.mbs.get(key)
        if m is None:
            return eff
        if not self.is_data:
            handler = RELAY_TIMERS.get(kind)
            if handler is not None:
                handler(self.relay, self, now, m, eff)
        elif kind in DATA_TIMERS:
            DATA_TIMERS[kind](self.data, self, now, m, eff)
        elif kind in ROUND_TIMERS:
            ROUND_TIMERS[kind](self.rounds, self, now, m, eff)
        return eff

    def on_compute_done(self, now: float, key: Key | tuple, kind: ComputeKind | str) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        m = self.mbs.get(key)
        if m is None:
            return eff
        if self.is_data:
            self.data.compute_done(self, now, m, ComputeKind(kind), eff)
        else:
            self.relay.compute_done(self, now, m, ComputeKind(kind), eff)
        return eff

    def on_compute_failed(self, now: float, key: Key | tuple, kind: ComputeKind | str) -> list[RecoveryEffect]:
        """The driver could not run the `Compute` (its inputs gone): a relay forgets the microbatch, which its
        data node repairs (`RelaySide.compute_failed`); a data node defers it (`DataSide.compute_failed`)."""
        eff: list[RecoveryEffect] = []
        m = self.mbs.get(key)
        if m is not None and self.is_data:
            self.data.compute_failed(self, now, m, ComputeKind(kind), eff)
        elif m is not None:
            self.relay.compute_failed(self, m, ComputeKind(kind), eff)
        return eff

    # The driver's news of the neighbours (neighbours.py).
    def set_flows(self, out: Mapping[str, Mapping[str, int]], now: float | None = None) -> list[RecoveryEffect]:
        return neighbours.set_flows(self, out, now)

    def set_neighbours(self, now: float, next_peers: Mapping[str, float], prev_peers: Mapping[str, float],
                       peer_capacity: Mapping[str, int], prior_s: float | Mapping[str, float]) -> list[RecoveryEffect]:
        return neighbours.set_neighbours(self, now, next_peers, prev_peers, peer_capacity, prior_s)

    def peer_alive(self, now: float, peer: str) -> list[RecoveryEffect]:
        return neighbours.peer_alive(self, now, peer)

    def peer_gone(self, now: float, peer: str) -> list[RecoveryEffect]:
        return neighbours.peer_gone(self, now, peer)

    def peer_back(self, now: float, peer: str, *, data_node: bool, same: bool = False) -> list[RecoveryEffect]:
        return neighbours.peer_back(self, now, peer, data_node=data_node, same=same)

    def give_up_stranded(self, now: float) -> list[RecoveryEffect]:
        """A data node with no live stage-0 relay left gives up what cannot complete (`Rounds.give_up_stranded`)."""
        return self.rounds.give_up_stranded(self, now)

    # The aggregation phase (see the module docstring).
    def leave_after(self, it: int) -> None:
        """Relay: it leaves once the aggregation of `it` is done; a microbatch of a later iteration is denied (its
        contribution would leave with it while its data node counts it completed)."""
        self.relay.leave_after(it)

    def open_iteration(self, now: float, it: int) -> list[RecoveryEffect]:
        """Data node: the previous iteration's steps are applied everywhere; push the microbatches of `it`."""
        eff: list[RecoveryEffect] = []
        self.data.open(self, now, it, eff)
        return eff

    def begin_aggregation(
            self, now: float, it: int, completed: Mapping[str, Collection[int]] | None = None,
    ) -> tuple[list[RecoveryEffect], frozenset[Key]]:
        """Relay: BEGIN AGGREGATION of `it` arrived; drop what is left of its microbatches.

        Returns the effects and the contributions to count: the keys of `it`
        whose backward this node computed, that were not released and, when
        BEGIN names each data node's completed seqs (`completed`), whose
        microbatch is among them.  A gradient held for an attempt its data
        node deferred (the Release that would have dropped it was lost, or
        its holder was unknown to the data node) never counts: the
        microbatch runs again in the next iteration and counts there.  Where
        BEGIN also names the attempt that completed each seq and its holder
        at each stage (seq -> `completions.Completion` per data node), a
        gradient of another attempt, or held by another relay than the one
        on the path whose backward came back, does not count either: the
        data node restarted, parked or repaired the microbatch through other
        holders, and the Release to this one was lost or it was presumed
        dead while alive (counted, the microbatch would count twice).

        The contributions of a data node reported gone before this BEGIN
        (`orphaned`) count only when BEGIN names their seqs: the leader
        decided BEGIN with that node's report (it died after reporting, and
        the BEGIN reached this stage's front before or after the death), so
        every stage counts them, whichever of the death and the BEGIN each
        relay heard first.  Without `completed` they never count."""
        eff: list[RecoveryEffect] = []
        counted = self.relay.begin(self, it, completed, eff)
        return eff, counted

    def parameters_at(self, applied: int) -> None:
        """A relay's part holds `applied` steps now (the driver tells it before each message): it takes a
        microbatch only of iteration `applied`.  A relay that an aggregation left out (presumed dead by the data
        node for a while, say) still holds the steps before it, and a gradient it computed for the next iteration
        would be summed nowhere (its stage's all-reduce leaves an out-of-step member's contributions out) while
        the data node counts the microbatch: DENY routes it to a relay whose parameters are the iteration's."""
        self.relay.parameters_at(applied)

    def aggregation_done(self, now: float, it: int) -> list[RecoveryEffect]:
        """The step of `it` is applied here: room again for the next iteration's microbatches."""
        eff: list[RecoveryEffect] = []
        self.relay.stepped_at(self, it, eff)
        return eff

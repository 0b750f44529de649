"""The recovery machine: `RecoveryNode`, its state and its entry points (events in, effects out).

The mechanisms live in the mixins it is made of, one file each: `routing.py`,
`relay.py`, `data.py`, `rounds.py`, `neighbours.py` (see the package docstring).
Which handler takes which event is data, one table per side, each beside its
handlers: by message type `NODE_HANDLERS` (here: the messages of no
microbatch), `relay.RELAY_ANY_ATTEMPT`, `relay.RELAY_STALE`,
`relay.RELAY_HANDLERS` and `data.DATA_HANDLERS`; by timer kind
`relay.RELAY_TIMERS` and `rounds.DATA_TIMERS`.  A type or kind a table does not
name is ignored by that side.
The aggregation phase meets the machine at the entry points here:

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
yet) and sends `Room` once its step is applied.

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
from .data import DataSide, DataState
from .neighbours import Neighbours, Peers
from .records import (
    MB_MESSAGES, POLICIES, ComputeKind, DataRecord, Key, MbTimer, Policy, RecoveryConfig, RecoveryEffect, RecoveryStats,
    RelayRecord,
)
from .relay import RELAY_TIMERS, RelaySide
from .rounds import DATA_TIMERS, Rounds
from .routing import Routing


class RecoveryNode(Routing, RelaySide, DataSide, Rounds, Neighbours):
    """One node's microbatch machine (a data node or a relay), pure: `now` and events in, effects out."""

    def __init__(self, cfg: RecoveryConfig, rng: random.Random, *, first_seq: int = 0) -> None:
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy {cfg.policy!r}")
        self.cfg = cfg
        self.policy = Policy(cfg.policy)
        self.me = cfg.node_id
        self.rng = rng
        self.stage = cfg.stage
        self.is_data = cfg.stage < 0
        self.nstages = cfg.last_stage + 1
        self.swarm = self.policy in (Policy.SWARM, Policy.RANDOM)  # (random: SWARM's machinery, random next hops)
        self.peers = Peers.of(cfg)  # the neighbours as this node sees them (neighbours.py)
        self.mbs: dict = {}  # relay: Key -> RelayRecord; data node: Key -> DataRecord
        self.contrib: dict[int, set[Key]] = {}
        self.orphaned: dict[int, set[Key]] = {}  # relay: contributions of data nodes gone before BEGIN (its rule)
        self.stats = RecoveryStats()
        # the aggregation phase, as the driver reports it (begin_aggregation, aggregation_done)
        self.begun: set[int] = set()
        self.stepped: set[int] = set()
        self.last_iteration: int | None = None  # relay leaving: the last iteration it takes microbatches of
        self.data = DataState(next_seq=first_seq, e2e_est=cfg.e2e_prior_s)  # a data node's iterations (data.py)

    # Read-only views for the drivers, the simulator and the tests (the owner's objects, not copies).
    next_peers = property(lambda self: self.peers.next_peers, doc="next-stage peer -> link cost")
    prev_peers = property(lambda self: self.peers.prev_peers, doc="previous-stage peer -> link cost")
    peer_cap = property(lambda self: self.peers.peer_cap, doc="next-stage peer -> capacity")
    est = property(lambda self: self.peers.est, doc="peer -> EWMA of its hand-off time")
    dead = property(lambda self: self.peers.dead, doc="peers presumed dead or gone")
    gone = property(lambda self: self.peers.gone, doc="peers the membership layer reported gone")
    full = property(lambda self: self.peers.full, doc="next peers that denied a microbatch")
    denied = property(lambda self: self.peers.denied, doc="peers this node denied")
    out = property(lambda self: self.peers.out, doc="the flows: data node -> next hop -> units")
    ledger = property(lambda self: self.data.ledger, doc="data node: each microbatch's status per iteration")
    reported = property(lambda self: self.data.reported, doc="data node: the iterations settled (reported)")
    waiting = property(lambda self: self.data.waiting, doc="data node: seqs of the iteration not launched yet")
    carry = property(lambda self: self.data.carry, doc="data node: seqs deferred to the next iteration")
    rt = property(lambda self: self.data.rt, doc="data node: stage-0 relay -> EWMA of its round trips")
    iteration = property(lambda self: self.data.iteration, doc="data node: the iteration open here")
    next_seq = property(lambda self: self.data.next_seq, doc="data node: the seq of its next new microbatch")
    e2e_est = property(lambda self: self.data.e2e_est, doc="data node: EWMA of its microbatches' round trips")
    lent = property(lambda self: self.data.lent, doc="data node: units lent to it this iteration, per relay")

    # The node's own tables, changed here on behalf of the mechanisms (which read them directly).
    def _keep(self, m: RelayRecord | DataRecord) -> None:
        self.mbs[m.key] = m

    def _forget(self, key: Key) -> RelayRecord | DataRecord | None:
        return self.mbs.pop(key, None)

    def _contribute(self, key: Key) -> None:
        """Relay: it computed the backward of `key`; the gradient counts in its iteration (`begin_aggregation`)."""
        self.contrib.setdefault(key.iteration, set()).add(key)

    def _uncontribute(self, key: Key) -> None:
        """Relay: the gradient of `key` it holds is void (a Release, or a new attempt)."""
        self.contrib.get(key.iteration, set()).discard(key)

    def _orphan(self, peer: str) -> None:
        """Relay: data node `peer` died; its contributions of iterations not begun here count only if BEGIN names
        them (`orphaned`, see the module doc)."""
        for it, keys in self.contrib.items():
            if it not in self.begun:
                self.orphaned.setdefault(it, set()).update(k for k in keys if k.data_node == peer)
                self.contrib[it] = {k for k in keys if k.data_node != peer}

    def _unorphan(self, peer: str) -> None:
        """`peer` is back: what its old incarnation left orphaned here is forgotten."""
        for keys in self.orphaned.values():
            keys -= {k for k in keys if k.data_node == peer}

    def _set_data_nodes(self, nodes: tuple[str, ...]) -> None:
        self.cfg = replace(self.cfg, data_nodes=nodes)

    def start(self, now: float) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        if self.is_data:
            self._open(now, 0, eff)
        return eff

    def on_message(self, now: float, sender: str, msg) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        self.peers.heard(sender)  # (also a peer reported gone and heard from again, e.g. restarted with its id)
        t = type(msg)
        if t not in MB_MESSAGES:
            raise TypeError(f"{t.__name__} is not a microbatch message: the driver routes it elsewhere")
        handler = NODE_HANDLERS.get(t)
        if handler is not None:  # (of no microbatch)
            handler(self, now, sender, msg, eff)
            return eff
        if t is MbDeny:
            self.peers.refused(sender)
        key = Key(msg.data_node, msg.seq, msg.iteration)
        if self.is_data:
            self._data_message(now, sender, key, msg, eff)  # data.DATA_HANDLERS
        else:
            self._relay_message(now, sender, key, msg, eff)  # relay.RELAY_HANDLERS
        return eff

    def _on_room(self, now: float, sender: str, msg: Room, eff: list[RecoveryEffect]) -> None:
        self.peers.has_room(sender)
        if self.is_data:
            self._launch(now, eff)
        else:  # a route again: retry parked repairs, and my upstream may send again (my Room)
            self._retry_parked(now, eff)
            self._room(eff)

    def on_timer(self, now: float, tkey: MbTimer) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        kind, key = tkey.kind, tkey.key
        m = self.mbs.get(key)
        if m is None:
            return eff
        handler = (DATA_TIMERS if self.is_data else RELAY_TIMERS).get(kind)
        if handler is not None:
            handler(self, now, m, eff)
        return eff

    def on_compute_done(self, now: float, key: Key | tuple, kind: ComputeKind | str) -> list[RecoveryEffect]:
        eff: list[RecoveryEffect] = []
        m = self.mbs.get(key)
        if m is None:
            return eff
        if self.is_data:
            self._data_compute_done(now, m, ComputeKind(kind), eff)
        else:
            self._relay_compute_done(now, m, ComputeKind(kind), eff)
        return eff

    def leave_after(self, it: int) -> None:
        """Relay: it leaves once the aggregation of `it` is done; a microbatch of a later iteration is denied (its
        contribution would leave with it while its data node counts it completed)."""
        self.last_iteration = it

    def open_iteration(self, now: float, it: int) -> list[RecoveryEffect]:
        """Data node: the previous iteration's steps are applied everywhere; push the microbatches of `it`."""
        eff: list[RecoveryEffect] = []
        self._open(now, it, eff)
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
        microbatch runs again in the next iteration and counts there.

        The contributions of a data node reported gone before this BEGIN
        (`orphaned`) count only when BEGIN names their seqs: the leader
        decided BEGIN with that node's report (it died after reporting, and
        the BEGIN reached this stage's front before or after the death), so
        every stage counts them, whichever of the death and the BEGIN each
        relay heard first.  Without `completed` they never count."""
        eff: list[RecoveryEffect] = []
        self.begun.add(it)
        if not self.is_data:
            for key in [k for k in self.mbs if k.iteration <= it]:
                self._drop(key, eff)
            self.peers.new_iteration(relay=True)
        held = self.contrib.get(it, set())
        orphans = self.orphaned.pop(it, set())
        if completed is None:
            return eff, frozenset(held)
        counted = frozenset(k for k in held | orphans if k.seq in completed.get(k.data_node, ()))
        self.stats.bump(uncounted=len(held) - len(counted))
        return eff, counted

    def aggregation_done(self, now: float, it: int) -> list[RecoveryEffect]:
        """The step of `it` is applied here: room again for the next iteration's microbatches."""
        eff: list[RecoveryEffect] = []
        self.stepped.add(it)
        self.contrib.pop(it, None)
        self.orphaned.pop(it, None)
        self._room(eff)
        return eff


# The messages of no microbatch and their handlers; a microbatch's go to its side's table (`relay.RELAY_HANDLERS`
# and the tables beside it, `data.DATA_HANDLERS`).
NODE_HANDLERS = {
    Room: RecoveryNode._on_room,
    Lend: RecoveryNode._on_lend,  # (data.py)
}

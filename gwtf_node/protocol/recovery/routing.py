"""Choosing next hops and hand-off deadlines: `Routing`, which every side of the machine asks.

`Routing` owns the node's seeded RNG (the `random` policy draws a next hop
with it) and nothing else: it reads the neighbours (`node.peers`, neighbours.py)
and the records the node holds (`node.mbs`), and changes the neighbours only
through their methods (a local flow repair, a peer presumed dead).  A policy
with another next-hop rule subclasses it and overrides `choose_next` (the
simulator's task pool, `sim/train/taskpool.py`, through
`RecoveryNode.routing_class`).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from ..pipeline import pick_next_hop
from .records import SLOT_PHASES, Policy, RelayPhase, Source

if TYPE_CHECKING:
    from .data import DataRecord
    from .node import RecoveryNode


class Routing:
    """The next-hop choice of one node (see the module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def live_next(self, node: RecoveryNode) -> list[str]:
        return node.peers.live_next()

    def slots_used(self, node: RecoveryNode) -> int:
        """A relay's microbatches in flight (`SLOT_PHASES`)."""
        return 0 if node.is_data else sum(1 for r in node.mbs.values() if r.phase in SLOT_PHASES)

    def held(self, node: RecoveryNode) -> int:
        """The microbatches whose gradients a relay holds for an iteration whose aggregation has not begun."""
        rs = node.relay
        return 0 if node.is_data else sum(len(keys) for it, keys in rs.contrib.items() if it not in rs.begun)

    def room_left(self, node: RecoveryNode) -> int:
        """The microbatches a relay can still take: `capacity` less those in flight, and with a `hold_limit`, at
        most it less those in flight and those whose gradients it holds."""
        used = self.slots_used(node)
        free = node.cfg.capacity - used
        return min(free, node.cfg.hold_limit - used - self.held(node)) if node.cfg.hold_limit else free

    def inflight(self, node: RecoveryNode, j: str, d: str | None = None) -> int:
        """Microbatches whose activations I sent to j and j still holds (they occupy a unit / a slot)."""
        n = 0
        for m in node.mbs.values():
            if m.next != j or (d is not None and m.key.data_node != d):
                continue
            if node.is_data or m.phase in SLOT_PHASES:
                n += 1
        return n

    def waiting_to(self, node: RecoveryNode, j: str) -> int:
        if node.is_data:
            return sum(1 for m in node.mbs.values() if m.next == j and m.src is Source.SENDING)
        return sum(1 for m in node.mbs.values() if m.next == j and m.phase is RelayPhase.SENDING)

    def deadline(self, node: RecoveryNode, now: float, j: str) -> float:
        e = node.peers.est.get(j, node.cfg.default_prior_s)
        return now + node.cfg.k * e * (1 + self.waiting_to(node, j)) + node.cfg.margin_s

    @staticmethod
    def gone_ahead(m: DataRecord, gone: set) -> bool:
        """A holder of m's path in `gone` whose stage has not reported its backward: the backward cannot pass it."""
        return any(h in gone and s not in m.bwd_done for s, h in enumerate(m.path))

    def room_for(self, node: RecoveryNode, j: str) -> bool:
        cap = node.cfg.swarm_assumed_capacity if node.swarm else node.peers.peer_cap.get(j, 1)
        return self.inflight(node, j) < cap

    def greedy(self, node: RecoveryNode, exclude: set) -> str | None:
        """The cheapest live next peer with room (the `random` policy: one of them at random)."""
        c = sorted((node.peers.next_peers[j], j) for j in self.live_next(node)
                   if j not in node.peers.full and j not in exclude and self.room_for(node, j))
        if not c:
            return None
        return self.rng.choice(c)[1] if node.policy is Policy.RANDOM else c[0][1]

    def choose_next(self, node: RecoveryNode, d: str, exclude: set, *, fresh: bool = False) -> str | None:
        """Next hop for a microbatch of data node d; `fresh`: a new launch (flows only)."""
        if not node.is_data and node.stage == node.cfg.last_stage:
            return d
        if node.swarm:
            return self.greedy(node, exclude)
        peers = node.peers
        ok = [j for j in self.live_next(node) if j not in peers.full and j not in exclude]
        units = peers.out.get(d, {})
        if node.is_data and node.data.lent:  # units lent to me (Lend) for this iteration
            units = dict(units)
            for j, n in node.data.lent.items():
                units[j] = units.get(j, 0) + n
        inflight = {j: self.inflight(node, j, d) for j in units}
        costs = peers.next_peers
        if node.is_data and fresh and node.cfg.fastest_unit:  # data.py, "Fastest unit first"
            rt, e2e = node.data.rt, node.data.e2e_est
            costs = {j: (rt.get(j, e2e), peers.next_peers.get(j, float("inf"))) for j in units}
        hop = pick_next_hop(units, inflight, costs, ok)
        if hop is not None:
            return hop
        if node.cfg.lend and not fresh:
            for d2 in sorted(d2 for d2 in peers.out if d2 != d):  # another data node's idle unit, before a repair
                u2 = peers.out[d2]
                hop = pick_next_hop(u2, {j: self.inflight(node, j, d2) for j in u2}, peers.next_peers, ok)
                if hop is not None:
                    return hop
        if fresh and any(units.get(j, 0) > 0 for j in ok):
            return None  # the flows are busy: wait for a slot
        hop = self.greedy(node, exclude)  # local repair: a live peer with room takes a unit
        if hop is not None:
            peers.repair_unit(d, hop)
        return hop

    def presume_dead(self, node: RecoveryNode, j: str | None) -> None:
        if j is None or j in node.peers.dead or j in node.cfg.data_nodes:
            return
        node.peers.presume_dead(j, repair=not node.swarm)
        node.stats.bump(presumed_dead=1)

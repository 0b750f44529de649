"""What the driver tells the machine about its neighbours: flows, the current next and previous peers, a peer still
heard, a peer gone.

`Peers` is this node's view of them (links, capacities, hand-off estimates,
who is dead, gone or full, whom it denied, and the flows); only this module
changes it, the other mechanisms through its methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .records import RecoveryConfig, RecoveryEffect, ewma


@dataclass
class Peers:
    """The neighbours as this machine sees them."""

    next_peers: dict[str, float]  # next-stage peer -> link cost
    prev_peers: dict[str, float]  # previous-stage peer -> link cost
    peer_cap: dict[str, int]  # next-stage peer -> capacity (units)
    est: dict[str, float]  # peer -> EWMA of its hand-off time
    dead: set[str] = field(default_factory=set)  # presumed dead (a hop deadline) or gone
    gone: set[str] = field(default_factory=set)  # peers the membership layer reported gone (`peer_gone`)
    full: set[str] = field(default_factory=set)  # next peers that denied a microbatch (MbDeny) and sent no Room
    denied: set[str] = field(default_factory=set)  # peers I sent MbDeny to: they get Room when a slot frees
    out: dict[str, dict[str, int]] = field(default_factory=dict)  # gwtf flows: data node -> next hop -> units

    @classmethod
    def of(cls, cfg: RecoveryConfig) -> Peers:
        return cls(dict(cfg.next_peers), dict(cfg.prev_peers), dict(cfg.peer_capacity), dict(cfg.prior_s))

    def live_next(self) -> list[str]:
        return [j for j in self.next_peers if j not in self.dead]

    def heard(self, peer: str) -> None:
        """A message from `peer`: it is alive (also one reported gone and back with its id)."""
        self.dead.discard(peer)
        self.gone.discard(peer)

    def refused(self, peer: str) -> None:
        self.full.add(peer)

    def has_room(self, peer: str) -> None:
        self.full.discard(peer)

    def offer_again(self) -> None:
        """No Room came: the next peers are offered work again, once."""
        self.full.difference_update(self.next_peers)

    def new_iteration(self, *, relay: bool) -> None:
        """Every relay dropped its stashes (the aggregation): room again; a relay's denials are void."""
        self.full.clear()
        if relay:
            self.denied.clear()

    def deny(self, peer: str) -> None:
        self.denied.add(peer)

    def room_told(self) -> None:
        self.denied.clear()

    def measure(self, j: str, sample: float) -> None:
        ewma(self.est, j, sample)

    def repair_unit(self, d: str, hop: str) -> None:
        """Local repair: `hop`, a live peer with room, takes a unit of data node `d`."""
        units = self.out.setdefault(d, {})
        units[hop] = units.get(hop, 0) + 1

    def presume_dead(self, j: str, *, repair: bool) -> None:
        """`j` missed a deadline: presumed dead; with `repair` its units move to live peers with room."""
        self.dead.add(j)
        if not repair:
            return
        for d, units in self.out.items():  # local flow repair: move the units to live peers with room
            n = units.pop(j, 0)
            for _ in range(n):
                cands = sorted((self.next_peers[p], p) for p in self.live_next()
                               if p not in self.full
                               and sum(o.get(p, 0) for o in self.out.values()) < self.peer_cap.get(p, 1))
                if not cands:
                    break
                p = cands[0][1]
                units[p] = units.get(p, 0) + 1



class Neighbours:
    """Part of `RecoveryNode` (node.py): one mechanism of the machine, see the module docstring."""

    def set_flows(self, out: Mapping[str, Mapping[str, int]], now: float | None = None) -> list[RecoveryEffect]:
        """Flows (units per data node and next hop), e.g. from the flow machines.

        With `now` (new flows during training): a data node launches on units that became free."""
        self.peers.out = {d: dict(o) for d, o in out.items()}
        eff: list[RecoveryEffect] = []
        if now is not None and self.is_data:
            self._launch(now, eff)
        return eff

    def set_neighbours(self, now: float, next_peers: Mapping[str, float], prev_peers: Mapping[str, float],
                       peer_capacity: Mapping[str, int], prior_s: float | Mapping[str, float]) -> list[RecoveryEffect]:
        """The driver's current neighbours: link cost to each next- and previous-stage peer.

        Replaces both maps; a next peer's capacity is taken from `peer_capacity`
        (a capacity of 0 or a missing one keeps what was known, else 1); a new
        next peer's hand-off estimate starts at `prior_s`: one value, or one per peer (priors.py), which
        also starts the estimate of a previous peer it names (its backward hand-offs); a next peer it does not
        name starts at `default_prior_s`.  A next peer that was
        not there before is a route again: a data node launches waiting
        microbatches, a relay retries its parked ones and sends `Room` to the
        peers it denied."""
        new_next = [j for j in next_peers if j not in self.peers.next_peers]
        self.peers.next_peers = dict(next_peers)
        self.peers.prev_peers = dict(prev_peers)
        per_peer = isinstance(prior_s, Mapping)
        for j in self.peers.next_peers:
            self.peers.peer_cap[j] = peer_capacity.get(j) or self.peers.peer_cap.get(j, 1)
            self.peers.est.setdefault(j, prior_s.get(j, self.cfg.default_prior_s) if per_peer else prior_s)
        if per_peer:
            for j in self.peers.prev_peers:
                if j in prior_s:
                    self.peers.est.setdefault(j, prior_s[j])
        eff: list[RecoveryEffect] = []
        if new_next:
            self.peers.gone.difference_update(new_next)
            self._route_again(now, eff)
        return eff

    def peer_alive(self, now: float, peer: str) -> list[RecoveryEffect]:
        """The driver's liveness check still hears `peer`: if this machine presumed it dead on a hop deadline
        (and the membership layer did not report it gone), it is alive; a data node launches on it again.

        Without this a data node that presumed its last stage-0 relay dead (slow while a peer left) would
        defer every microbatch from then on: it only un-presumes a peer that sends it something."""
        if peer not in self.peers.dead or peer in self.peers.gone:
            return []
        self.peers.dead.discard(peer)
        eff: list[RecoveryEffect] = []
        if self.is_data:
            self._launch(now, eff)
        return eff

    def _route_again(self, now: float, eff: list[RecoveryEffect]) -> None:
        """A next-stage peer appeared: launch (data node), or retry parked microbatches and send Room (relay)."""
        if self.is_data:
            self._launch(now, eff)
            return
        self._retry_parked(now, eff)
        self._room(eff)

    def peer_gone(self, now: float, peer: str) -> list[RecoveryEffect]:
        """The driver's liveness check found `peer` dead (or it left): no more work goes to it.

        The microbatches it held are found by the usual means (hop deadlines,
        BackwardStuck, the data node's watchdog and probes); with
        `cfg.act_on_gone` a data node also acts at once on those of its
        microbatches in their backward pass that `peer` held (a round / a
        SWARM restart), and on those still in their forward pass when their
        loss is computed (`_data_compute_done`)."""
        self._presume_dead(peer)
        self.peers.dead.add(peer)
        self.peers.gone.add(peer)
        eff: list[RecoveryEffect] = []
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

    def peer_back(self, now: float, peer: str, *, data_node: bool) -> list[RecoveryEffect]:
        """`peer`, reported gone, is back (a restarted node keeps its peer id): a new join of the same identity.

        It is neither dead nor gone here any more; a data node is one of the
        run's data nodes again.  Nothing of its old incarnation is left to
        forget: `peer_gone` dropped it (a data node's microbatches and
        contributions died with it), so the microbatches it sends from now on
        start clean, whatever their keys.  A next-stage peer back is a route
        again (as in `set_neighbours`)."""
        self._unorphan(peer)  # its old incarnation's: a new one may send the same keys elsewhere
        self.peers.heard(peer)
        if data_node and peer not in self.cfg.data_nodes:
            self._set_data_nodes(tuple(sorted(self.cfg.data_nodes + (peer,))))
        eff: list[RecoveryEffect] = []
        if peer in self.peers.next_peers:
            self._route_again(now, eff)
        return eff

    def _data_node_gone(self, now: float, peer: str, eff: list[RecoveryEffect]) -> None:
        """A data node died: its microbatches die with it (their owner and ledger are gone).

        Rule: none of its microbatches of an iteration not yet aggregated counts
        anywhere (which of them completed died with it), unless the leader
        had its report: relays drop its microbatches and set its contributions
        of iterations not begun here apart (`orphaned`), which count only if
        BEGIN names them (`begin_aggregation`: a BEGIN decided before the
        death names them, one decided after does not; its report to the leader
        is `Phases.forget`'s)."""
        if not self.is_data:
            for key in [k for k in self.mbs if k.data_node == peer]:
                self._drop(key, eff)
            self._orphan(peer)
        self._set_data_nodes(tuple(d for d in self.cfg.data_nodes if d != peer))

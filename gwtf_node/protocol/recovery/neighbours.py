"""What the driver tells the machine about its neighbours: flows, the current next and previous peers, a peer still
heard, a peer gone.

`Peers` is this node's view of them (links, capacities, hand-off estimates,
who is dead, gone or full, whom it denied, and the flows); only this module
changes it, the other mechanisms through its methods.  The driver's events
(`set_flows`, `set_neighbours`, `peer_alive`, `peer_gone`, `peer_back`) are
the functions below, which `RecoveryNode` forwards: each changes `Peers`
and asks the side this node is to act (a data node launches, a relay
retries what it parked and offers `Room`, drops a dead data node's
microbatches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from .records import RecoveryConfig, RecoveryEffect, ewma

if TYPE_CHECKING:
    from .node import RecoveryNode


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

    def set_flows(self, out: Mapping[str, Mapping[str, int]]) -> None:
        self.out = {d: dict(o) for d, o in out.items()}

    def set_links(self, next_peers: Mapping[str, float], prev_peers: Mapping[str, float],
                  peer_capacity: Mapping[str, int], prior_s: float | Mapping[str, float],
                  default_prior_s: float) -> list[str]:
        """The current neighbours (`set_neighbours`); returns the next peers that were not there before."""
        new_next = [j for j in next_peers if j not in self.next_peers]
        self.next_peers = dict(next_peers)
        self.prev_peers = dict(prev_peers)
        per_peer = isinstance(prior_s, Mapping)
        for j in self.next_peers:
            self.peer_cap[j] = peer_capacity.get(j) or self.peer_cap.get(j, 1)
            self.est.setdefault(j, prior_s.get(j, default_prior_s) if per_peer else prior_s)
        if per_peer:
            for j in self.prev_peers:
                if j in prior_s:
                    self.est.setdefault(j, prior_s[j])
        if new_next:
            self.gone.difference_update(new_next)
        return new_next

    def unpresume(self, peer: str) -> bool:
        """`peer`, presumed dead on a hop deadline and not reported gone, is alive; False if nothing changed."""
        if peer not in self.dead or peer in self.gone:
            return False
        self.dead.discard(peer)
        return True

    def reported_gone(self, peer: str) -> None:
        self.dead.add(peer)
        self.gone.add(peer)


def set_flows(node: RecoveryNode, out: Mapping[str, Mapping[str, int]],
              now: float | None = None) -> list[RecoveryEffect]:
    """Flows (units per data node and next hop), e.g. from the flow machines.

    With `now` (new flows during training): a data node launches on units that became free."""
    node.peers.set_flows(out)
    eff: list[RecoveryEffect] = []
    if now is not None and node.is_data:
        node.data.launch(node, now, eff)
    return eff


def set_neighbours(node: RecoveryNode, now: float, next_peers: Mapping[str, float], prev_peers: Mapping[str, float],
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
    new_next = node.peers.set_links(next_peers, prev_peers, peer_capacity, prior_s, node.cfg.default_prior_s)
    eff: list[RecoveryEffect] = []
    if new_next:
        route_again(node, now, eff)
    return eff


def peer_alive(node: RecoveryNode, now: float, peer: str) -> list[RecoveryEffect]:
    """The driver's liveness check still hears `peer`: if this machine presumed it dead on a hop deadline
    (and the membership layer did not report it gone), it is alive; a data node launches on it again.

    Without this a data node that presumed its last stage-0 relay dead (slow while a peer left) would
    defer every microbatch from then on: it only un-presumes a peer that sends it something."""
    if not node.peers.unpresume(peer):
        return []
    eff: list[RecoveryEffect] = []
    if node.is_data:
        node.data.launch(node, now, eff)
    return eff


def route_again(node: RecoveryNode, now: float, eff: list[RecoveryEffect]) -> None:
    """A next-stage peer appeared: launch (data node), or retry parked microbatches and send Room (relay)."""
    if node.is_data:
        node.data.launch(node, now, eff)
        return
    node.relay.retry_parked(node, now, eff)
    node.relay.room(node, eff)


def peer_gone(node: RecoveryNode, now: float, peer: str) -> list[RecoveryEffect]:
    """The driver's liveness check found `peer` dead (or it left): no more work goes to it.

    The microbatches it held are found by the usual means (hop deadlines,
    BackwardStuck, the data node's watchdog and probes); with
    `cfg.act_on_gone` a data node also acts at once on those of its
    microbatches in their backward pass that `peer` held (a round / a
    SWARM restart), and on those still in their forward pass when their
    loss is computed (`DataSide.compute_done`).  A data node gone takes its
    microbatches with it (`RelaySide.data_node_gone`, node.py's module doc)."""
    node.routing.presume_dead(node, peer)
    node.peers.reported_gone(peer)
    eff: list[RecoveryEffect] = []
    if node.is_data:
        # a holder of a microbatch in its backward pass is gone before its stage's backward was computed
        # there: act now (GWTF: a round; SWARM: restart).  A stage the backward already passed needs nothing.
        records = node.data.records
        for m in [m for m in records.values() if node.cfg.act_on_gone and peer in m.holders
                  and m.sink in ("grad", "wait") and node.routing.gone_ahead(m, {peer})]:
            if records.get(m.key) is m and not m.round.collecting and peer in m.holders:
                node.rounds.trouble(node, now, m, eff)
        node.data.launch(node, now, eff)
    if peer in node.cfg.data_nodes:
        if not node.is_data:
            node.relay.data_node_gone(node, peer, eff)
        node.set_data_nodes(tuple(d for d in node.cfg.data_nodes if d != peer))
    return eff


def peer_back(node: RecoveryNode, now: float, peer: str, *, data_node: bool, same: bool = False
              ) -> list[RecoveryEffect]:
    """`peer`, reported gone, is back (a restarted node keeps its peer id): a new join of the same identity, or
    (`same`) the same process, presumed dead while it was alive.

    It is neither dead nor gone here any more; a data node is one of the
    run's data nodes again.  Nothing of a restarted node's old incarnation
    is left: `peer_gone` dropped it (a data node's microbatches died with
    it, its contributions held here are forgotten now), so the microbatches
    it sends from now on start clean, whatever their keys.  A data node back
    as it was keeps the contributions it left orphaned here: they count if
    its report names them, as this relay's, through BEGIN (`relay.begin`;
    protocol/completions.py: one it redid elsewhere names the other holder).
    A next-stage peer back is a route again (as in `set_neighbours`)."""
    if not same:
        node.relay.unorphan(peer)  # its old incarnation's: a new one may send the same keys elsewhere
    node.peers.heard(peer)
    if data_node and peer not in node.cfg.data_nodes:
        node.set_data_nodes(tuple(sorted(node.cfg.data_nodes + (peer,))))
    eff: list[RecoveryEffect] = []
    if peer in node.peers.next_peers:
        route_again(node, now, eff)
    return eff

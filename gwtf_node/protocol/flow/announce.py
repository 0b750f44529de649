"""The announcement scheduler: which labels go out, to whom, and when.

Within a wave (one data node, launches.py) only news is announced: a label of
a new wave, a lower cost, or a new route at the same cost.  A rise is not
announced (the next wave recomputes every label; until then a Request Flow
that expects the old cost is rejected with the current label).  Announcements
are coalesced per node for `announce_coalesce_s` (latest value wins), and go
out in Dijkstra order: distances never fall from one wave to the next
(successive shortest paths), so the lowest labels of the previous wave are
floors; a label L above its floor F is announced (L - F) x `wave_order_s`
later (at most WAVE_ORDER_CAP_S), so that cheaper routes, which come the
long way round through the residual back arcs, arrive before it is sent.

Free-running labels (several data nodes) announce a changed cost at once
(rises included) and a new route at the same cost every `path_announce_s`;
with ordered launches (bids.py) every change is coalesced for
`ordered_coalesce_s`, because one commodity's rises otherwise explore path
after path.  Even so, every unit that moves in a saturated swarm (a relaunch
after a relabel was given back, a displacement) starts a cascade: labels
change a few milliseconds apart (link latencies differ from 1 to 150 ms), and
each change, announced, makes the neighbours change theirs again, over
residual paths that zigzag through full relays (Table VI at 36 nodes: 90 % of
the flow messages, ~200 label changes per relay and commodity within a few
seconds, 40 % of them below zero).  The window can back off (`backoff`, BGP's
route flap damping in small): news that comes within twice the window of the
last flush doubles it, up to `coalesce_backoff_max_s`; a quiet spell brings it
back to `ordered_coalesce_s`.  The latest value always goes out when the
window closes, so labels converge to the same values with fewer intermediate
ones; but units that move meanwhile follow staler labels, and the flows found
differ.  Off by default: at 40 ms it nearly halves the messages of Table VI at 36 and
72 nodes at the same time per microbatch, and costs 3 % on `sim flow` setting
6 (docs/bench_optimality.md).

Peers told the same labels share one CostAnnounce object, and the Sends of
one label are built without the dataclass __init__ (`send_all`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, CostAnnounce, Label, Side
from . import limits
from .state import EPS, Batch, as_sent, cost_differs, costs_differ

WAVE_ORDER_CAP_S = 0.2  # a label of a wave goes out at most this much later than at once (module doc)

if TYPE_CHECKING:
    from .node import FlowNode

_IN, _OUT = Side.IN, Side.OUT  # a module global is read faster than an enum member (hot paths)


@dataclass
class AnnounceState:
    sent: dict[tuple[str, Side], tuple[int, float, tuple[str, ...]]] = field(default_factory=dict)  # last told:
    # (wave, cost, path) per (commodity, side)
    dirty: set[tuple[str, Side]] = field(default_factory=set)  # labels to announce at the next flush
    force: dict[str, set[str]] = field(default_factory=dict)  # peer -> commodities whose OUT label it must be told
    armed: bool = False  # the "announce" timer is set
    window: float = 0.0  # ordered launches: the current coalescing window (`backoff`)
    flushed_at: float = -INF  # ... and the last flush
    recipients: dict[str, tuple] = field(default_factory=dict)  # commodity -> (config, sorted IN label recipients)
    within: Batch | None = None  # during `refresh` of several commodities: what their computations share

_new, _set_to, _set_msg = object.__new__, Send.to.__set__, Send.msg.__set__


def send_all(eff: list, peers, msg) -> None:
    """`eff += [Send(p, msg) for p in peers]`, built without the frozen dataclass's __init__ (twice as fast: a
    wave's announcements go to every previous-stage peer); the objects are the same."""
    for p in peers:
        s = _new(Send)
        _set_to(s, p)
        _set_msg(s, msg)
        eff.append(s)



def refresh(node: FlowNode, commodities, eff: list[Effect], force_to: dict[str, set[str]] | None = None,
             folds: dict[str, list[str]] | None = None, backs: set[str] | None = None,
             narrow: bool = False) -> None:
    """Recompute labels; the ones worth announcing go out at the next flush (coalesced, latest value wins).

    `narrow`: only next-stage IN labels of `commodities` changed since every
    label was last computed, so with cross displacement on (where an IN label
    depends on every commodity) the others need no recomputation (the
    bulk of the announcements at 72 nodes and more: a recomputation of 12-24
    commodities per message otherwise).

    Within an epoch only news is announced: a label of a new epoch, a lower
    cost, or a new route at the same cost.  A rise is not announced (the
    next wave recomputes every label from scratch; until then a Request
    Flow that expected the old cost is rejected with the current label).
    """
    cfg = node.cfg
    dn = cfg.node_id if cfg.is_data else None
    if node.cross:
        # IN labels depend on the other commodities' labels and RelabelCosts (relabel.cross_in): all of them,
        # unless only next-stage IN labels of `commodities` changed (`narrow`); then those, and the ones whose
        # RelabelCosts changed since their last computation (`RelabelState.stale`)
        stale = node.relabelling.take_stale()
        if not narrow:
            commodities = cfg.commodities
        elif stale:
            want = stale.union(commodities)
            commodities = [d for d in cfg.commodities if d in want]
    if len(commodities) == 1:
        for d in commodities:
            refresh_one(node, d, dn, folds, backs)
    else:
        node.announcer.within = Batch()  # what the commodities' computations share (labels.compute, relabel.cross_in)
        try:
            for d in commodities:
                refresh_one(node, d, dn, folds, backs)
        finally:
            node.announcer.within = None
    if node.limited and not cfg.is_data:
        for d in commodities:
            limits.check(node, d, eff)
    if force_to:
        for d, peers in force_to.items():
            for p in peers:
                node.announcer.force.setdefault(p, set()).add(d)
    pending_news = node.announcer.dirty or node.announcer.force
    if not node.waves and node.ordered and cfg.ordered_coalesce_s > 0 and pending_news:
        if not node.announcer.armed:  # ordered launches: cost news coalesced too (bids.py)
            node.announcer.armed = True
            eff.append(SetTimer("announce", node.now + backoff(node)))
        return
    if not node.waves and (node.announcer.dirty or node.announcer.force):
        # free-running labels (several data nodes): a changed cost goes out at once (it routes better than
        # coalescing), a new route at the same cost with the next `path_announce_s` flush
        urgent = {k for k in node.announcer.dirty if cost_news(node, *k)}
        if urgent or node.announcer.force:
            rest = node.announcer.dirty - urgent
            node.announcer.dirty = urgent
            flush(node, eff, rearm=False)
            node.announcer.dirty = rest
        if node.announcer.dirty and not node.announcer.armed:
            node.announcer.armed = True
            eff.append(SetTimer("announce", node.now + cfg.path_announce_s))
        return
    if (node.announcer.dirty or node.announcer.force) and not node.announcer.armed:
        if cfg.announce_coalesce_s <= 0:
            flush(node, eff)
        else:
            node.announcer.armed = True
            eff.append(SetTimer("announce", node.now + cfg.announce_coalesce_s + flush_delay(node)))

def refresh_one(node: FlowNode, d: str, dn: str | None, folds, backs) -> None:
    """`refresh` of one commodity: its labels, the wave's floors, and whether they are news."""
    if dn is not None:
        if d != dn:
            return
        old_out = node.labels.my_out.get(d)
    fold = folds.get(d) if folds else None
    if fold is None or not all(node.fold_in_label(d, j) for j in fold) \
            or (backs and d in backs and not node.fold_out_label(d)):
        node.compute_label(d)
    node.labels_lowered(d)
    if dn is not None:
        new_out = node.labels.my_out[d]
        if old_out is None or cost_differs(new_out, old_out):
            node.out_label_changed(new_out)
    if (dn is None or d == dn) and worth_announcing(node, d, _IN):
        node.announcer.dirty.add((d, _IN))
    if node.units.out[d] and worth_announcing(node, d, _OUT):
        node.announcer.dirty.add((d, _OUT))

def backoff(node: FlowNode) -> float:
    """Ordered launches: the wait before the next flush.  The window is `ordered_coalesce_s` after a quiet spell;
    news that comes within twice the window of the last flush doubles it, up to `coalesce_backoff_max_s`."""
    a, cfg = node.announcer, node.cfg
    base = cfg.ordered_coalesce_s
    if node.now - a.flushed_at > 2 * a.window or a.window < base:
        a.window = base
    else:
        a.window = max(base, min(2 * a.window, cfg.coalesce_backoff_max_s))
    return a.window

def flush_delay(node: FlowNode) -> float:
    """Waves: hold a label above its floor back in proportion to the gap (Dijkstra order: module doc)."""
    k = node.cfg.wave_order_s
    if k <= 0:
        return 0.0
    gap = 0.0
    for d, side in node.announcer.dirty:
        fl = node.wave.floor.get(d)
        if fl is None:
            continue
        f = fl[0] if side is _IN else fl[1]
        lab = node.labels.my_in.get(d) if side is _IN else node.labels.my_out.get(d)
        if lab is not None and lab.cost != INF and f != INF and lab.cost - f > gap:
            gap = lab.cost - f
    return min(k * gap, WAVE_ORDER_CAP_S)

def cost_news(node: FlowNode, d: str, side: Side) -> bool:
    lab = node.labels.my_in.get(d) if side == Side.IN else node.labels.my_out.get(d)
    last = node.announcer.sent.get((d, side))
    return lab is not None and (last is None or last[0] != node.labels.epoch[d]
                                or costs_differ(lab.cost, last[1]))

def worth_announcing(node: FlowNode, d: str, side: Side) -> bool:
    lab = node.labels.my_in.get(d) if side is _IN else node.labels.my_out.get(d)
    last = node.announcer.sent.get((d, side))
    if lab is not None and lab.cost == INF and node.limited and side is _IN:
        # a new wave, to the feeders; a rise, to the subscribed peers (limits.py)
        return last is None or last[0] != node.labels.epoch[d] or last[1] != INF
    if lab is None or (lab.cost == INF and (node.waves or last is None)):
        return False
    if not node.waves:  # free-running labels: every change, rises included
        return last is None or last[0] != node.labels.epoch[d] or costs_differ(lab.cost, last[1]) \
            or lab.path != last[2]
    if last is None or last[0] != node.labels.epoch[d]:
        return True
    if rose(node, d, side, lab, node.labels.epoch[d]):
        return True  # a rise, to the subscribed peers (limits.py)
    return lab.cost < last[1] - EPS or (lab.cost <= last[1] + EPS and lab.path != last[2])

def flush(node: FlowNode, eff: list[Effect], rearm: bool = True) -> None:
    if rearm:
        node.announcer.armed = False
    node.announcer.flushed_at = node.now
    if len(node.announcer.dirty) == 1 and not node.announcer.force:
        # the common case: one label, to every peer that takes it (the same as below, without the outbox)
        d, side = next(iter(node.announcer.dirty))
        node.announcer.dirty.clear()
        if worth_announcing(node, d, side):
            lab = node.labels.my_in[d] if side is _IN else node.labels.my_out[d]
            e = node.labels.epoch[d]
            rise = rose(node, d, side, lab, e)
            node.announcer.sent[(d, side)] = (e, lab.cost, lab.path)
            msg = CostAnnounce((as_sent(node, lab, d),))
            if side is not _IN:
                send_all(eff, sorted(node.units.out[d]), msg)
            elif node.limited:
                send_all(eff, limits.recipients(node, d, lab.cost, in_recipients(node, d), rise), msg)
            else:
                send_all(eff, in_recipients(node, d), msg)
        return
    outbox: dict[str, list[Label]] = {}
    sent_out: set[tuple[str, str]] = set()
    for d, side in sorted(node.announcer.dirty):
        if not worth_announcing(node, d, side):
            continue
        lab = node.labels.my_in[d] if side is _IN else node.labels.my_out[d]
        e = node.labels.epoch[d]
        rise = rose(node, d, side, lab, e)
        node.announcer.sent[(d, side)] = (e, lab.cost, lab.path)
        w = as_sent(node, lab, d)
        if side is _IN:
            for p in node.cfg.prev_costs:
                if p in node.data_prev and p != d:
                    continue  # another data node has no use for this commodity's labels
                if node.limited:
                    if not limits.allowed(node, d, p, lab.cost, rise):
                        continue
                    if lab.cost != INF:
                        limits.gave(node, d, (p,), lab.cost)
                outbox.setdefault(p, []).append(w)
        else:
            for j in node.units.out[d]:
                outbox.setdefault(j, []).append(w)
                sent_out.add((j, d))
    node.announcer.dirty.clear()
    for p in sorted(node.announcer.force):
        for d in sorted(node.announcer.force[p]):
            lab = node.labels.my_out.get(d)
            if (p, d) in sent_out or lab is None or lab.cost == INF:
                continue
            outbox.setdefault(p, []).append(as_sent(node, lab, d))
    node.announcer.force.clear()
    made: dict[tuple[int, ...], CostAnnounce] = {}  # peers told the same labels share one message object
    for peer in sorted(outbox):
        labs = outbox[peer]
        key = tuple(map(id, labs))
        msg = made.get(key)
        if msg is None:
            msg = made[key] = CostAnnounce(tuple(labs))
        eff.append(Send(peer, msg))

def rose(node: FlowNode, d: str, side: Side, lab: Label, e: int) -> bool:
    """Label limits: our IN label of `d` rose within wave `e` since it was last announced (to the subscribed
    peers only: limits.py)."""
    if not node.limited or side is not _IN:
        return False
    last = node.announcer.sent.get((d, side))
    return last is not None and last[0] == e and lab.cost > last[1] + EPS

def in_recipients(node: FlowNode, d: str) -> list[str]:
    """Who is told this node's IN label of `d`, sorted (see `flush`); cached per config."""
    cached = node.announcer.recipients.get(d)
    if cached is None or cached[0] is not node.cfg:
        dp = node.data_prev
        cached = node.announcer.recipients[d] = (node.cfg, sorted(p for p in node.cfg.prev_costs
                                                         if not (p in dp and p != d)))
    return cached[1]

def refresh_all(node: FlowNode, eff: list[Effect], force_to=None) -> None:
    refresh(node, node.cfg.commodities, eff, force_to)


def drop_peer(node: FlowNode, peer: str) -> None:
    """`peer` is no neighbour any more: nothing is to be told to it."""
    node.announcer.force.pop(peer, None)

def forget(node: FlowNode, d: str) -> None:
    """The data node of `d` restarted: what it was told of `d` is forgotten (its new waves count from 0)."""
    for key in [k for k in node.announcer.sent if k[0] == d]:
        del node.announcer.sent[key]

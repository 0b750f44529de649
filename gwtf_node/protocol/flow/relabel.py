"""Relabelling and cross displacement (several data nodes): a unit becomes another data node's.

Relabelling.  On each relay route the commodities differ only in the hops
from and back to the data node, so a unit of A can become B's when B's hops
are cheaper.  Every relay announces upstream, per pair (A, B), the cheapest
change of the hop back when one unit of A it sends on becomes B's
(`RelabelCost`, along the current flow: at the last stage d(i, B) - d(i, A),
elsewhere the minimum over the next hops carrying A; `relabel_costs`; the
pairs that changed together go in one message, `RelabelCost.more`); with
the backoff of the label announcements on (announce.py) in their window, and
only when the value then differs from the one told (`send_costs`): sent at
once beside backed-off labels, they flap between a value and INF as units
move.  A
first-stage relay, quiet, on its tick, once every bid it passed on is INF
(launching is over), relabels one unit when d(B, i) - d(A, i) plus that change
is negative (`maybe_relabel`): it tells both data nodes and the next hop
(`Relabel`), and each relay on the way relabels one unit it sends on, along
its cheapest announced change, down to the last stage, which sends the unit
back to B (`relabel_down`).  The upstream end changes the link's commodity and
the downstream end copies it; an imbalance left is repaired as any other.  At
most `relabel_limit` per relay: two relays can undo each other's relabels.

A data node sends at most its demand (its capacity: "Data nodes start with
unpaired flows matching their capacity", section V-C), and a relabel gives B
one more unit, so it is only right while B is short of its demand.  B's
other units go through other relays, so B tells: a data node at its demand
bids INF with `LaunchBid.full`, and no relay relabels into it while its last
bid says so (`full`).  Where the relay relabelled on an older bid, B decides:
B at its demand takes the unit back at once (`refuse`: a Withdraw to the
relay that relabelled; A, one short now, launches again, and the relay,
withdrawing downstream in turn, makes room for it).  The relay then does not
relabel into B again while B's bid is the one it had then (`refused`): a new
bid from B says that B's units changed.  Without the flag (B's bid is INF
both when it is full and when it has no route) each first-stage relay found
each full data node by a refused relabel, and every refusal walked a
Withdraw down the pipeline and back up as a launch, with a cascade of label
announcements at each hop: in Table VI, where the data nodes ask for more
than the swarm carries, this went on for the whole run (docs/bench_optimality.md).

Cross displacement.  A relay's IN label of commodity A may also take the slot
of a unit of another commodity B that it receives from upstream p: p routes
that unit again (B's OUT label at p, as in a displacement), and A's unit takes
the B unit's route from here on, relabelled (RelabelCost of (B, A)): cost
OUT_B(p) - d(p, i) + R(B -> A), a multi-commodity augmenting path
(`cross_in`, `Via.CROSS`).  Carried out with the messages of relabelling (Deny
DISPLACED to p, Relabel down the route).  At most `cross_limit` per relay:
more let stale labels chase units around; none at a relay that holds the
units pooled formation homed (`adopted`).

A relay of a one-stage run, linked to both sides of each data node, does
neither (`one_stage`): a data node would count its Relabels on the wrong side
of the link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, Deny, DenyReason, Label, Relabel, RelabelCost, RelabelPair, Withdraw
from . import announce, cycles
from .state import EPS, PendingKind

if TYPE_CHECKING:
    from .node import FlowNode


@dataclass
class RelabelState:
    heard: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (A, B) -> next peer -> RelabelCost
    best: dict[tuple[str, str], tuple[float, str | None]] = field(default_factory=dict)  # (A, B) -> (cost, via whom)
    told: dict[tuple[str, str], float] = field(default_factory=dict)  # (A, B) -> what previous-stage relays were told
    crossed: int = 0  # cross displacements done here
    started: int = 0  # relabels started here
    refused: dict[str, int] = field(default_factory=dict)  # data node -> the seq of its bid when it gave a unit
    # relabelled to it back (it is at its demand): no relabel into it while its bid is that one
    armed: bool = False  # the "relabelcost" timer is set: `best` goes out to previous-stage relays then
    sends: dict[str, tuple[str, ...]] = field(default_factory=dict)  # A -> where units of A went at the last
    # `relabel_costs` (its pairs (A, *) are recomputed when that changes)
    heard_new: set[tuple[str, str]] = field(default_factory=set)  # pairs heard of since the last `relabel_costs`
    cfg: object = None  # the config `best` was computed with (a new one: every pair again)
    into: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # `crossings` cached per commodity
    # (dropped when a pair into it changes; the commodities are fixed for a machine's life)
    one_stage: tuple | None = None  # (config, `one_stage`) cached
    stale: set[str] = field(default_factory=set)  # commodities B whose `best` of some (A, B) changed since B's
    # labels were last computed (announce.refresh: cross_in reads them)

    def take_stale(self) -> set[str]:
        """`stale`, handed to the refresh that recomputes those labels, and empty again."""
        stale, self.stale = self.stale, set()
        return stale


def full(node: FlowNode, b: str) -> bool:
    """First-stage relay: data node `b` is at its demand: its last bid says so (`LaunchBid.full`), or it gave
    back a unit relabelled to it and has not bid since."""
    if node.bid.seen_full.get(b, False):
        return True
    seq = node.relabelling.refused.get(b)
    return seq is not None and seq == node.bid.seen_seq.get(b, 0)


def refused(node: FlowNode, b: str) -> None:
    """Relay: data node `b` takes back a unit it sends us (a Withdraw): it is over its demand (`refuse`)."""
    if b in node.cfg.commodities and b in node.cfg.prev_costs:
        node.relabelling.refused[b] = node.bid.seen_seq.get(b, 0)


def refuse(node: FlowNode, sender: str, eff: list[Effect]) -> None:
    """Data node: a relabel by first-stage relay `sender` put it over its demand; take that unit back."""
    me = node.cfg.node_id
    if node.outflow_committed(me) <= node.launch.demand or node.units.out[me].get(sender, 0) <= 0:
        return
    rid = node.units.request(PendingKind.WITHDRAW, sender, me)
    eff.append(Send(sender, Withdraw(rid, me)))


def one_stage(node: FlowNode) -> bool:
    """A relay with data nodes on both sides (a run of one stage): a data node could not tell a Relabel of the
    unit it sends this relay from one of the unit this relay sends it, so such a relay neither relabels nor
    displaces across data nodes."""
    cached = node.relabelling.one_stage  # data_prev is derived from the config: replaced with it
    if cached is None or cached[0] is not node.cfg:
        cached = node.relabelling.one_stage = (node.cfg, bool(node.data_prev) and any(
            j in node.cfg.commodities for j in node.cfg.next_costs))
    return cached[1]


def cross_in(node: FlowNode, d: str) -> tuple | None:
    """Cross displacement: take a unit of `d`, displace a unit of another data node B from upstream p (p routes
    it again: B's OUT label at p) and hand ours B's route from here on, relabelled to `d` (RelabelCost).  The
    crossing (cost, p, B, p's OUT label of B) when it is cheaper than the IN label of `d`, else None."""
    best = None
    spent = node.relabelling.crossed >= node.cfg.cross_limit
    if (spent and node.cfg.cycles is None) or one_stage(node):
        return None
    batch = node.announcer.within
    for b, r in crossings(node, d):
        units = batch.units.get(b) if batch is not None else None
        if units is None:
            units = displaceable(node, b)
            if batch is not None:
                batch.keep_units(b, units)
        for x, p, lab in units:
            if spent and not cycles.retiring(lab):
                continue
            c = x + r
            if best is None or c < best[0] - EPS:
                best = (c, p, b, lab)
    if best is not None and best[0] < node.labels.my_in[d].cost - EPS:
        return best
    return None

def adopted(node: FlowNode) -> None:
    """Relay: it holds units another formation placed (`FlowNode.adopt`): it crosses no more, as if `cross_limit`
    were spent.  Those units are a maximum flow already (the pool's), so a crossing adds none; and they are no
    successive-shortest-path result of any one commodity, so crossing labels can go round a negative cycle, which
    the path check cuts at a different place each time: last-stage relays announced two routes of one cost in
    turn, 8,000 announcements a second for as long as the run went (Table VI x8 seed 3,
    docs/bench_optimality.md)."""
    node.relabelling.crossed = max(node.relabelling.crossed, node.cfg.cross_limit)

def crossings(node: FlowNode, d: str) -> list[tuple[str, float]]:
    """The data nodes B whose units, sent on from here, could become `d`'s, with that RelabelCost, in commodity
    order (part of `cross_in`; kept until a RelabelCost of (B, d) changes in `relabel_costs`)."""
    rs = node.relabelling
    got = rs.into.get(d)
    if got is None:
        got = rs.into[d] = []
        for b in node.cfg.commodities:
            if b == d:
                continue
            r, via = rs.best.get((b, d), (INF, None))
            if via is not None and r != INF:
                got.append((b, r))
    return got

def displaceable(node: FlowNode, b: str) -> list[tuple[float, str, Label]]:
    """The units of `b` received from upstream peers that could be displaced, as (OUT_b(p) - d(p, i), p, OUT
    label), by peer id (part of `cross_in`; the same for every commodity crossing into them)."""
    tin, lout, inn, prev = node.labels.tag_in, node.labels.lout[b], node.units.inn[b], node.cfg.prev_costs
    units = []
    for p in sorted(inn):
        lab = lout.get(p)
        if inn[p] <= 0 or lab is None or lab.cost == INF or tin in lab.path:
            continue
        units.append((lab.cost - prev[p], p, lab))
    return units

def relabel_costs(node: FlowNode, eff: list[Effect]) -> None:
    """Relay: recompute, per pair (A, B), the cheapest change of the hop back to a data node when one unit of A
    sent from here on becomes B's, along the current flow; tell prev relays what changed (RelabelCost): at once,
    or, with the announcements' backoff on, at the next `send_costs` (module doc).  Only the pairs whose inputs
    changed are recomputed (where A's units go, a RelabelCost heard, the config), and only the commodities B
    whose pairs moved have their labels recomputed (`stale`, announce.refresh): 24 data nodes make 552 pairs."""
    cfg = node.cfg
    cms = cfg.commodities
    nxt = cfg.next_costs
    rs = node.relabelling
    later = coalesced(node)
    moved = False
    changed: list[tuple[str, str, float]] = []  # (A, B, cost) told now
    # only the pairs whose inputs changed: (A, *) when A's units go elsewhere, a pair heard of, all on a new config
    every = rs.cfg is not cfg
    rs.cfg = cfg
    redo: set[str] = set()
    for a in cms:
        outs = node.units.out[a]
        sent = tuple(j for j in sorted(outs) if outs[j] > 0)  # where units of `a` go from here
        if every or rs.sends.get(a) != sent:
            rs.sends[a] = sent
            redo.add(a)
    heard = rs.heard_new
    if not redo and not heard:
        return
    rs.heard_new = set()
    for a in cms:
        sent = rs.sends[a]
        whole = a in redo
        if not whole and not heard:
            continue
        for b in cms:
            if b == a:
                continue
            key = (a, b)
            if not whole and key not in heard:
                continue
            best, arg = INF, None
            rl = rs.heard.get(key, {})
            for j in sent:
                if j in cms:  # last stage: the unit would go back to b instead of j (= a)
                    v = nxt[b] - nxt[j] if b in nxt and j in nxt else INF
                else:
                    v = rl.get(j, INF)
                if v < best - EPS:
                    best, arg = v, j
            old = rs.best.get(key)
            if old is None or old[1] != arg or old[0] != best:
                rs.stale.add(b)
                rs.into.pop(b, None)
                if later:
                    moved = moved or old is None or old[1] != arg or differs(best, old[0])
            rs.best[key] = (best, arg)
            if not later and differs(best, rs.told.get(key)):
                rs.told[key] = best
                changed.append((a, b, best))
    if later:
        if not moved:
            return
        if not node.relabelling.armed and any(differs(c, node.relabelling.told.get(k))
                                              for k, (c, _) in node.relabelling.best.items()):
            node.relabelling.armed = True
            eff.append(SetTimer("relabelcost", node.now + max(node.cfg.ordered_coalesce_s, node.announcer.window)))
    elif changed:
        tell(node, changed, eff)
    else:
        return
    if node.cross:
        announce.refresh(node, (), eff, narrow=True)  # the commodities whose RelabelCosts changed (`stale`)

def coalesced(node: FlowNode) -> bool:
    """RelabelCosts go out with the label announcements' window: only with the backoff on (announce.backoff)."""
    return node.ordered and node.cfg.coalesce_backoff_max_s > node.cfg.ordered_coalesce_s

def tell(node: FlowNode, pairs: list[tuple[str, str, float]], eff: list[Effect]) -> None:
    """The (A, B, cost) pairs that changed, in one RelabelCost to each previous-stage relay (`more`)."""
    if not pairs:
        return
    msg = RelabelCost(*pairs[0], tuple(RelabelPair(*p) for p in pairs[1:]))
    cms = node.cfg.commodities
    for p in sorted(node.cfg.prev_costs):
        if p not in cms:
            eff.append(Send(p, msg))

def differs(cost: float, told: float | None) -> bool:
    """A RelabelCost worth telling: the first finite one, or one that moved (to or from INF included)."""
    if told is None:
        return cost != INF
    return (cost == INF) != (told == INF) or (cost != INF and abs(cost - told) > EPS)

def send_costs(node: FlowNode, eff: list[Effect]) -> None:
    """The "relabelcost" timer: tell previous-stage relays the RelabelCosts that differ from what they were told."""
    node.relabelling.armed = False
    changed: list[tuple[str, str, float]] = []
    for key in sorted(node.relabelling.best):
        best = node.relabelling.best[key][0]
        if differs(best, node.relabelling.told.get(key)):
            node.relabelling.told[key] = best
            changed.append((key[0], key[1], best))
    tell(node, changed, eff)

def maybe_relabel(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """First-stage relay, quiet, on its tick: turn one unit of data node A that it receives into data node B's
    when B's hop to here plus the change of the hop back (RelabelCost) is cheaper than A's."""
    cfg = node.cfg
    if node.relabelling.started >= cfg.relabel_limit or one_stage(node):
        return
    if node.ordered and any(c != INF for c in node.bid.seen_cost.values()):
        return  # a data node will still launch: relabelling now would change the routes it is shown
    best, pick = -EPS, None
    for a in node.data_prev:
        if node.units.inn[a].get(a, 0) <= 0:
            continue
        for b in node.data_prev:
            if b == a or full(node, b):
                continue
            r, via = node.relabelling.best.get((a, b), (INF, None))
            if via is None or r == INF:
                continue
            gain = cfg.prev_costs[b] - cfg.prev_costs[a] + r
            if gain < best - EPS:
                best, pick = gain, (a, b)
    if pick is None:
        return
    a, b = pick
    node.relabelling.started += 1
    node.units.take_in(a, a)
    node.units.add_in(b, b)
    eff.append(Send(a, Relabel(a, b)))
    eff.append(Send(b, Relabel(a, b)))
    relabel_down(node, now, a, b, eff)

def relabel_down(node: FlowNode, now: float, a: str, b: str, eff: list[Effect]) -> None:
    """One unit of `a` received here is now `b`'s: relabel one we send on, along the cheapest RelabelCost (a unit
    for the last stage goes back to `b` instead).  Without an `a` unit to relabel, the imbalance this leaves is
    repaired like any other (Request Flow / Withdraw)."""
    cms = node.cfg.commodities
    _, j = node.relabelling.best.get((a, b), (INF, None))
    if j is None or node.units.out[a].get(j, 0) <= 0:
        j = next((k for k in sorted(node.units.out[a]) if node.units.out[a][k] > 0), None)
    if j is not None:
        node.units.take_out(a, j)
        if j in cms:  # last stage: back to b instead of a
            if b in node.cfg.next_costs:
                node.units.add_out(b, b)
                eff.append(Send(b, Relabel(a, b)))
            eff.append(Send(j, Relabel(a, b)))
        else:
            node.units.add_out(b, j)
            eff.append(Send(j, Relabel(a, b)))
    node.changed(now)
    announce.refresh_all(node, eff)

def on_relabel(node: FlowNode, now: float, sender: str, msg: Relabel, eff: list[Effect]) -> bool:
    """A Relabel: the unit on the link to `sender` changes commodity (True: none to change here)."""
    a, b = msg.from_commodity, msg.to_commodity
    if a not in node.units.inn or b not in node.units.inn:
        return True
    if node.cfg.is_data:
        me = node.cfg.node_id
        if sender in node.cfg.next_costs:  # a first-stage relay: a unit we send it
            if a == me:
                node.units.take_out(a, sender)
            if b == me:
                node.units.add_out(b, sender)
                refuse(node, sender, eff)
        elif sender in node.cfg.prev_costs:  # a last-stage relay: a unit it sends us
            if a == me:
                node.units.take_in(a, sender)
            if b == me:
                node.units.add_in(b, sender)
        node.changed(now)
        announce.refresh_all(node, eff)
        return False
    if not node.units.take_in(a, sender):
        # The unit is not here any more: we handed it back (Deny) or it was relabelled meanwhile, and the
        # sender, crossing that, already counts it as `b`'s on this link.  Hand the `b` unit back so that both
        # ends agree (ignoring the Relabel would leave the two ends of the link counting differently).
        node.stats.ignore()
        eff.append(Send(sender, Deny(b, DenyReason.NO_ROUTE)))
        return False
    node.units.add_in(b, sender)
    relabel_down(node, now, a, b, eff)
    return False

def on_relabel_cost(node: FlowNode, now: float, sender: str, msg: RelabelCost, eff: list[Effect]) -> bool:
    """True: only a first-stage relay's tick acts on these; others pass them on in `relabel_costs`."""
    if sender not in node.cfg.next_costs:
        return True
    cms = node.cfg.commodities
    for pair in msg.pairs():
        key = (pair.from_commodity, pair.to_commodity)
        if key[0] in cms and key[1] in cms:
            node.relabelling.heard.setdefault(key, {})[sender] = pair.cost
            node.relabelling.heard_new.add(key)
    relabel_costs(node, eff)
    return True


def crossed(node: FlowNode) -> None:
    """A cross displacement was carried out here (units.on_request_flow)."""
    node.relabelling.crossed += 1


def forget(node: FlowNode, b: str) -> None:
    """Data node `b` left or restarted: its refusal no longer holds relabelling back."""
    node.relabelling.refused.pop(b, None)

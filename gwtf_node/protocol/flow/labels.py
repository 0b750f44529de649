"""Labels: a node's cost-to-sink per commodity, computed from its neighbours' labels (section V-C).

Cost-to-sink (the paper's announcement travelling back to front) is a pair of
labels per commodity, computed by each node over the *residual* network, as in
successive-shortest-path min-cost flow:

* IN  = cost of handing this node one more unit.  Either it has room and
  forwards the unit (`Via.FORWARD`: d(i, j) + IN_j, the cheapest next hop), or
  it is full and *displaces* one unit it receives from an upstream peer p,
  which p then routes elsewhere (`Via.BACK`: -d(p, i) + OUT_p).
* OUT = cost for this node to get rid of a unit it holds: forward it, or hand
  one back upstream (the paper's DENY).

A hand-back costs -d(p, i) on formation waves (waves.py): flows formed by
successive shortest paths hold no negative cycle, so the labels are the exact
distances and the flows the cheapest.  A removal or a cost change can leave
flows that do hold one, and on the waves after it (unmarked) a hand-back costs
0 (`FlowConfig.reform_free_back`, waves.py `free_back`): every arc then costs
at least 0, so no label falls below 0 around such a cycle (where the loop check
alone let the labels of a wave fall for minutes, path after path, and the
waves replay a launch that fails at the same hop: docs/bench_flow.md, "Flaps").
Successive shortest paths over those costs still reach the maximum flow; the
cost is what the improvement moves after a change (moves.py) work on.

Labels carry the residual path behind them (side-tagged node tags `tag+` /
`tag-`, `node_tag`: an id of up to 16 characters itself, a longer one, such as
a 52-character libp2p peer id, an 11-character digest of it, so that a path of
16 stages costs a few hundred bytes on the wire, not two kilobytes); a node
ignores a neighbour's label whose path already contains it, so the
distance-vector announcements cannot loop or count to infinity.  Ties keep the
current choice (`pick`), so equal-cost routes cannot flap and the route a unit
follows is the one announced.

Almost every message of a label wave is one next-stage IN label.  The four
best candidates (forward / back, for OUT / IN) are cached with the state they
were computed on (`LabelState.cache`, `signature`), and such a label is folded in
in O(1) (`fold_in`, and the fast path of `FlowNode.on_message`); `compute`
scans every neighbour, and only the cheapest forward candidates' paths
(`cheapest`).  An upstream OUT label recomputes only the back candidates
(`fold_out`, waves only).

A label of a newer wave (`Label.epoch`, see launches.py) clears the older
labels of its commodity (`ingest`); a label from a sender that is not a
neighbour yet is stashed and used when it is added (FlowNode.add_neighbour).
`LabelState` holds all of them; only this module changes it (a new wave, a
peer gone: `new_wave`, `drop_peer`, ...).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect
from ..messages import INF, CostAnnounce, Label, Side
from . import announce, cycles, limits, relabel, waves
from .config import FlowConfig
from .state import EPS, MAX_STASHED_SENDERS, Via, cheapest, choose, cost_of, label, pick

if TYPE_CHECKING:
    from .node import FlowNode

_IN, _OUT = Side.IN, Side.OUT  # a module global is read faster than an enum member (hot paths)
SHORT_ID = 16  # ids up to this long are their own tag (module doc)


def node_tag(node_id: str) -> str:
    """The tag of `node_id` in a residual path: itself when short, else 11 characters of its blake2b digest
    (64 bits: a collision between two nodes of one swarm is out of reach)."""
    if len(node_id) <= SHORT_ID:
        return node_id
    digest = hashlib.blake2b(node_id.encode(), digest_size=8).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass
class LabelState:
    """The neighbours' labels and this node's own, per commodity, and the wave they belong to."""

    tag_in: str  # this node's sides in a label's residual path
    tag_out: str
    lin: dict[str, dict[str, Label]]  # next-stage IN labels
    lout: dict[str, dict[str, Label]]  # previous-stage OUT labels
    epoch: dict[str, int]  # the current label wave (launches.py)
    my_in: dict[str, Label] = field(default_factory=dict)
    my_out: dict[str, Label] = field(default_factory=dict)
    dec_in: dict[str, tuple | None] = field(default_factory=dict)  # (Via, peer[, commodity]) behind my_in
    dec_out: dict[str, tuple | None] = field(default_factory=dict)  # (Via, peer) behind my_out
    cache: dict[str, tuple] = field(default_factory=dict)  # (signature, f_out, b_out, f_in, b_in, room): compute
    stash: dict[str, dict[tuple[str, Side], Label]] = field(default_factory=dict)  # labels from not-yet neighbours

    @classmethod
    def of(cls, cfg: FlowConfig) -> LabelState:
        cms = cfg.commodities
        tag = node_tag(cfg.node_id)
        return cls(tag + "+", tag + "-", {d: {} for d in cms}, {d: {} for d in cms},
                   {d: 0 for d in cms})


def new_wave(node: FlowNode, d: str, epoch: int) -> None:
    """Wave `epoch` of `d` begins here: the older labels of `d` are dropped."""
    L = node.labels
    L.epoch[d] = epoch
    L.lin[d].clear()
    L.lout[d].clear()
    L.cache.pop(d, None)

def data_node_back(node: FlowNode, d: str) -> None:
    """The data node of `d` restarted: its waves count from the start again."""
    new_wave(node, d, 0)

def unstash(node: FlowNode, peer: str) -> None:
    node.labels.stash.pop(peer, None)

def take_stashed(node: FlowNode, peer: str, side: Side, only_newer: bool = False) -> None:
    """Take in the `side` labels `peer` sent before it was added (the stash; `ingest`); with `only_newer`, only those
    of a newer wave than the label of `peer` held now."""
    for (d, s_), wire in sorted(node.labels.stash.get(peer, {}).items()):
        held = node.labels.lin[d].get(peer) if only_newer and d in node.labels.lin else None
        if s_ == side and (held is None or held.epoch < wire.epoch):
            ingest(node, peer, wire)

def drop_peer(node: FlowNode, peer: str) -> None:
    """`peer` is no neighbour any more: its labels go."""
    L = node.labels
    for d in node.cfg.commodities:
        L.lin[d].pop(peer, None)
        L.lout[d].pop(peer, None)

def unusable(node: FlowNode, d: str, j: str) -> None:
    """`j` rejected a unit of `d` without telling its label: no route through it until it announces one."""
    node.labels.lin[d][j] = Label(d, Side.IN, INF, ())

def wave_label(node: FlowNode, sender: str, lab: Label) -> int | None:
    """The bulk of a wave (`FlowNode.on_message`): one next-stage IN label of the current wave, most of which
    change nothing here (what `on_announce` does, without its generality).  None when `lab` is not such a
    label, else what `fold_in` returns (1: nothing changed)."""
    L = node.labels
    d = lab.commodity
    lin = L.lin.get(d)
    cfg = node.cfg
    if lab.side is not _IN or lin is None or lab.epoch != L.epoch[d] or sender not in cfg.next_costs \
            or sender in node.removed:
        return None
    if not lab.formation and node.wave.formation:  # (empty unless a formation wave is on here)
        waves.heard_unmarked(node, d, lab)
    lin[sender] = lab
    # `fold_in`'s first test, inline: no news when `sender` is not the current choice and its candidate is no
    # cheaper than the cached best forward ones (cache still valid)
    cache = L.cache.get(d)
    if cache is not None:
        sig, f_out, _, f_in, _, room = cache
        inn = node.units.inn
        if len(inn) == 1 and sig[1] is cfg and sig[0] == L.epoch[d] and sig[2] == inn[d] \
                and f_out is not None and f_out[1] != sender and (f_in is None or f_in[1] != sender):
            if lab.cost == INF:
                return 1
            c = cfg.next_costs[sender] + lab.cost
            if c >= f_out[0] - EPS and (not room or (f_in is not None and c >= f_in[0] - EPS)):
                return 1
    return fold_in(node, d, sender)

def compute(node: FlowNode, d: str) -> None:
    """Recompute this node's IN and OUT labels of commodity `d` from its neighbours' labels.

    Ties keep the current choice (sticky): a route changes only when a
    strictly cheaper one appears or the current one goes away, so that
    equal-cost alternatives cannot flap and the route behind a label is the
    one last announced.

    The four best candidates (forward / back, for OUT / IN) are cached with
    the state they were computed on (`LabelState.cache`), so that a next-stage
    neighbour's IN label, by far the most frequent news, is folded in in
    O(1) by `fold_in` instead of a scan over every neighbour.
    """
    cfg = node.cfg
    tin, tout = node.labels.tag_in, node.labels.tag_out
    prev_out, prev_in = node.labels.dec_out.get(d), node.labels.dec_in.get(d)
    lin = node.labels.lin[d]
    if cfg.is_data:
        if d != cfg.node_id:
            return
        cands = [(c + lab.cost, j, lab) for j, c in cfg.next_costs.items()
                 if (lab := lin.get(j)) is not None and lab.cost != INF and tout not in lab.path
                 and cycles.usable(node, lab)]
        arg = pick(cands, prev_out[1] if prev_out else None)
        node.labels.cache[d] = (cache_signature(node, d), arg, None, None, None, False)
        decide_data(node, d, arg)
        return
    # The residual path behind a label must not revisit the side it starts from:
    # F for OUT starts at i-, F for IN at i+ then i-; B for IN at i+, B for OUT at i- then i+.
    batch = node.announcer.within
    if batch is None:
        room = node.used() < cfg.capacity
    else:  # inside `announce.refresh`: the inflows do not change between its commodities
        room = batch.room
        if room is None:
            room = batch.keep_room(node.used() < cfg.capacity)
    # forward candidates by cost, so that only the cheapest are scanned for our tags (cheapest)
    fwd = sorted([(c + lab.cost, j, lab) for j, c in cfg.next_costs.items()
                  if (lab := lin.get(j)) is not None and lab.cost != INF], key=cost_of)
    fo = cheapest(fwd, (tout,))
    fi = cheapest(fwd, (tout, tin)) if room else []
    so = prev_out[1] if prev_out else None
    si = prev_in[1] if prev_in else None
    f_out = pick(fo, so if prev_out and prev_out[0] == Via.FORWARD else None)
    f_in = pick(fi, si if prev_in and prev_in[0] == Via.FORWARD else None)
    b_out, b_in = back_candidates(node, d)
    node.labels.cache[d] = (cache_signature(node, d), f_out, b_out, f_in, b_in, room)
    decide(node, d, f_out, b_out, f_in, b_in)

def back_candidates(node: FlowNode, d: str) -> tuple:
    """The best back candidates of `d` (hand a unit back upstream / displace one): from the upstream peers'
    OUT labels, for OUT and for IN (part of `compute`)."""
    cfg = node.cfg
    tin, tout = node.labels.tag_in, node.labels.tag_out
    lout = node.labels.lout[d]
    prev_out, prev_in = node.labels.dec_out.get(d), node.labels.dec_in.get(d)
    bo: list = []
    bi: list = []
    free = waves.free_back(node, d)
    for p, n in node.units.inn[d].items():
        lab = lout.get(p)
        if n <= 0 or lab is None or lab.cost == INF or tin in lab.path:
            continue
        cand = (lab.cost if free else lab.cost - cfg.prev_costs[p], p, lab)
        if cfg.displace:
            bi.append(cand)
        if tout not in lab.path:
            bo.append(cand)
    so = prev_out[1] if prev_out else None
    si = prev_in[1] if prev_in else None
    return (pick(bo, so if prev_out and prev_out[0] == Via.BACK else None),
            pick(bi, si if prev_in and prev_in[0] == Via.BACK else None))

def fold_out(node: FlowNode, d: str) -> bool:
    """Upstream OUT labels of `d` changed: recompute the back candidates only, the forward ones stay cached
    (they do not depend on them; ties as in `fold_in`).  False (the caller runs `compute`) when the cache
    does not apply, and with free-running labels: there the tie-breaking of a full recomputation routes
    better in the worst case (several data nodes); with waves both decide the same."""
    cache = node.labels.cache.get(d)
    if node.cfg.is_data or not node.waves or cache is None or not signature_holds(node, d, cache[0]):
        return False
    sig, f_out, _, f_in, _, room = cache
    b_out, b_in = back_candidates(node, d)
    node.labels.cache[d] = (sig, f_out, b_out, f_in, b_in, room)
    decide(node, d, f_out, b_out, f_in, b_in)
    return True

def signature(node: FlowNode, d: str) -> tuple:
    """The state the cached candidates of `d` depend on, besides the next-stage IN labels (the inflows of
    every commodity: they decide whether there is room)."""
    inn = node.units.inn
    if len(inn) == 1:
        return (node.labels.epoch[d], node.cfg, dict(inn[d]))
    return (node.labels.epoch[d], node.cfg, tuple(dict(v) for v in inn.values()))

def cache_signature(node: FlowNode, d: str) -> tuple | None:
    """`signature`, or None where the cache is never read: with cross displacement `fold_in` does not apply (an
    IN label depends on every commodity) and without waves neither does `fold_out`."""
    if node.cross and not node.waves:
        return None
    return signature(node, d)

def signature_holds(node: FlowNode, d: str, sig: tuple) -> bool:
    """`sig` (from `signature`) still describes the state: compared in place, without building a new one."""
    cfg = sig[1]
    if sig[0] != node.labels.epoch[d] or (cfg is not node.cfg and cfg != node.cfg):
        return False
    inn = node.units.inn
    return sig[2] == (inn[d] if len(inn) == 1 else tuple(inn.values()))

def decide_data(node: FlowNode, d: str, arg) -> None:
    if arg is None:
        node.labels.my_out[d], node.labels.dec_out[d] = label(d, _OUT, INF, ()), None
    else:
        node.labels.my_out[d] = label(d, Side.OUT, arg[0], (node.labels.tag_out,) + arg[2].path)
        node.labels.dec_out[d] = (Via.FORWARD, arg[1])
    if node.cfg.cycles is not None and (lab := cycles.announced(node, d, INF if arg is None else arg[0])) is not None:
        node.labels.my_out[d] = lab  # its flows stand: the retire label (cycles.py)
    if node.launch.retire:
        node.labels.my_out[d] = cycles.retire_label(node, d)  # a recall wave (launches.py)
    node.labels.my_in[d] = label(d, Side.IN, 0.0, (node.labels.tag_in,))

def decide(node: FlowNode, d: str, f_out, b_out, f_in, b_in) -> None:
    prev_out, prev_in = node.labels.dec_out.get(d), node.labels.dec_in.get(d)
    tin, tout = node.labels.tag_in, node.labels.tag_out
    # OUT: forward the unit, or hand one back upstream (DENY)
    kind = choose(f_out, b_out, prev_out[0] if prev_out else None)
    if kind == Via.FORWARD:
        node.labels.my_out[d] = label(d, _OUT, f_out[0], (tout,) + f_out[2].path)
        node.labels.dec_out[d] = (Via.FORWARD, f_out[1])
    elif kind == Via.BACK:
        node.labels.my_out[d] = label(d, _OUT, b_out[0], (tout, tin) + b_out[2].path)
        node.labels.dec_out[d] = (Via.BACK, b_out[1])
    else:
        node.labels.my_out[d], node.labels.dec_out[d] = label(d, _OUT, INF, ()), None
    # IN: take the unit and forward it, or displace an upstream unit
    kind = choose(f_in, b_in, prev_in[0] if prev_in else None)
    if kind == Via.FORWARD:
        node.labels.my_in[d] = label(d, _IN, f_in[0], (tin, tout) + f_in[2].path)
        node.labels.dec_in[d] = (Via.FORWARD, f_in[1])
    elif kind == Via.BACK:
        node.labels.my_in[d] = label(d, _IN, b_in[0], (tin,) + b_in[2].path)
        node.labels.dec_in[d] = (Via.BACK, b_in[1])
    else:
        node.labels.my_in[d], node.labels.dec_in[d] = label(d, _IN, INF, ()), None
    if node.cross:  # several data nodes: the IN label may take another data node's slot instead
        best = relabel.cross_in(node, d)
        if best is not None:
            node.labels.my_in[d] = label(d, _IN, best[0], (tin,) + best[3].path)
            node.labels.dec_in[d] = (Via.CROSS, best[1], best[2])

def fold_in(node: FlowNode, d: str, j: str) -> int:
    """Fold next-stage neighbour `j`'s new IN label into the cached candidates of `d` (O(1)).

    Exactly what `compute` would decide, except on a tie between `j` and
    another peer that is not the current choice (`pick` would take the
    smaller id; here the current choice stays, which ties allow).  Returns
    0 (the caller runs `compute`) when the cache does not apply: the
    state changed since, or `j` was the best and got dearer or unusable;
    1 when nothing changes; 2 when the labels were recomputed from the cache.
    """
    cache = node.labels.cache.get(d)
    if cache is None or node.cross or not signature_holds(node, d, cache[0]):
        return 0
    _, f_out, b_out, f_in, b_in, room = cache
    lab = node.labels.lin[d][j]
    cfg = node.cfg
    if (f_out is None or f_out[1] != j) and (f_in is None or f_in[1] != j):
        # the common case, decided on the cost alone (before the path scans): `j` is not the current
        # choice and its candidate is no cheaper than the best forward ones
        if lab.cost == INF:
            return 1
        c = cfg.next_costs[j] + lab.cost
        if f_out is not None and c >= f_out[0] - EPS and (not room or (f_in is not None
                                                                     and c >= f_in[0] - EPS)):
            return 1
    if lab.cost == INF:
        ok_o = ok_i = False
        cand = None
    else:
        ok_o = node.labels.tag_out not in lab.path and (not cfg.is_data or cycles.usable(node, lab))
        ok_i = ok_o and cache[5] and node.labels.tag_in not in lab.path
        cand = (cfg.next_costs[j] + lab.cost, j, lab)
    if cfg.is_data:
        if f_out is not None and f_out[1] == j:
            if not ok_o or cand[0] > f_out[0] + EPS:
                return 0
            f_out = cand
        elif ok_o and (f_out is None or cand[0] < f_out[0] - EPS):
            f_out = cand
        else:
            return 1  # nothing changes
        node.labels.cache[d] = (cache[0], f_out, None, None, None, False)
        decide_data(node, d, f_out)
        return 2
    changed = False
    if f_out is not None and f_out[1] == j:
        if not ok_o or cand[0] > f_out[0] + EPS:
            return 0
        f_out, changed = cand, True
    elif ok_o and (f_out is None or cand[0] < f_out[0] - EPS):
        f_out, changed = cand, True
    if f_in is not None and f_in[1] == j:
        if not ok_i or cand[0] > f_in[0] + EPS:
            return 0
        f_in, changed = cand, True
    elif ok_i and (f_in is None or cand[0] < f_in[0] - EPS):
        f_in, changed = cand, True
    if changed:
        node.labels.cache[d] = (cache[0], f_out, b_out, f_in, b_in, room)
        decide(node, d, f_out, b_out, f_in, b_in)
        return 2
    return 1

def ingest(node: FlowNode, sender: str, wire: Label) -> bool:
    """Store a neighbour's label; a label of a newer wave clears that commodity's older ones."""
    d = wire.commodity
    if d not in node.labels.lin:
        return False
    if sender not in (node.cfg.next_costs if wire.side == Side.IN else node.cfg.prev_costs) \
            or (node.wave.deferred and waves.deferred(node, sender, wire)):  # (a newcomer: waves.defer)
        if sender not in node.removed and sender != node.cfg.node_id:
            if sender not in node.labels.stash and len(node.labels.stash) >= MAX_STASHED_SENDERS:
                node.labels.stash.pop(next(iter(node.labels.stash)))
            node.labels.stash.setdefault(sender, {})[(d, wire.side)] = wire
        return False
    e, lab = wire.epoch, wire  # stored as received: the epoch field is only read here and re-stamped on send
    cur = node.labels.epoch[d]
    if e < cur:
        node.stats.ignore()
        return False
    if e > cur:
        if node.cfg.is_data and d == node.cfg.node_id:
            return False  # only the data node starts waves of its commodity
        new_wave(node, d, e)
        waves.heard_new_wave(node, d, wire)
    elif not wire.formation and node.wave.formation:
        waves.heard_unmarked(node, d, wire)
    if wire.side == Side.IN:
        node.labels.lin[d][sender] = lab
    else:
        node.labels.lout[d][sender] = lab  # the cached back candidates are stale: the caller refreshes (_fold_out)
    return True

def on_announce(node: FlowNode, now: float, sender: str, msg: CostAnnounce, eff: list[Effect]) -> None:
    labels = msg.labels
    if len(labels) == 1 and labels[0].side == Side.IN and not node.cfg.is_data:
        # the common case (a wave): one next-stage IN label, folded in O(1); most change nothing here
        lab = labels[0]
        d = lab.commodity
        e = node.labels.epoch.get(d)
        if not ingest(node, sender, lab):
            return
        r = fold_in(node, d, sender)
        if r == 1:
            if node.limited:
                limits.useless(node, d, sender, lab, eff)
            return True  # no label moved: nothing for units.act to do
        announce.refresh(node, (d,), eff, folds={d: []} if r == 2 else None, narrow=node.labels.epoch[d] == e)
        return
    touched: dict[str, None] = {}
    folds: dict[str, list[str]] = {}
    backs: set[str] = set()
    new_wave = False
    limited = node.limited and not node.cfg.is_data and sender in node.cfg.next_costs
    for lab in msg.labels:
        d = lab.commodity
        e = node.labels.epoch.get(d)
        if limited and lab.side is _IN and d in node.labels.epoch:
            limits.note(node, d, sender, lab.cost)  # (single labels: FlowNode.on_message)
        if ingest(node, sender, lab):
            new_wave = new_wave or node.labels.epoch[d] != e
            touched[d] = None
            if lab.side == Side.IN:
                f = folds.setdefault(d, [])
                if f is not None:
                    f.append(sender)
            else:
                folds.setdefault(d, [])
                backs.add(d)  # an OUT label (upstream): the back candidates again (_fold_out)
    if touched:
        announce.refresh(node, touched, eff, folds=folds, backs=backs, narrow=not backs and not new_wave)

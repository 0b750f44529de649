#!/usr/bin/env python3
"""Flow-routing scale benchmark: one data node, N relays over S stages (Table V setting-1 costs and capacities).

For each size, GWTF runs until it converges (or `--rounds` rounds, or
`--wall-limit` seconds of wall time) and is compared with the optimum
(networkx min-cost max-flow).  Prints flows reached, cost ratio, converged
round, messages (total, per node, CostAnnounce), wall time and CPU time (the
process's own: what the wall time is on an idle machine; the wall limit counts
wall time).

    nice -n 10 python scripts/bench_flow_scale.py                       # 160, 320, 1000 relays x 16 stages
    nice -n 10 python scripts/bench_flow_scale.py --relays 1000 --wall-limit 600
    python scripts/bench_flow_scale.py --relays 160 320 --json                  # one JSON object per size
    python scripts/bench_flow_scale.py --relays 160 320 --json --receipts       # + what each label changed, why it went out
    python scripts/bench_flow_scale.py --relays 160 320 --json --label-limits   # with label limits (flow/limits.py)
    python scripts/bench_flow_scale.py --relays 1000 --seed 2 --no-formation-waits  # units move on unsettled labels
    python scripts/bench_flow_scale.py --relays 320 500 --wave-order-s 0.02 --launch-quiet-factor 2  # other knobs
    python scripts/bench_flow_scale.py --formation waves --neighbours 0 --json  # label waves over every link
    python scripts/bench_flow_scale.py --relays 160 --scale-loss 0.01 --json   # formation loses 1 % of its messages

By default each size runs as the daemon would form it (protocol/neighbourhood.py `auto_choice`): with at least 10
relays a stage, scaled formation over K = 10 links (`--formation scaling --neighbours 10`).  `--formation waves`
forms the flows by label waves alone and `--neighbours K` bounds the links to K (0: every link).  Scaled formation
(protocol/flow/scaling.py) forms the flows by cost scaling and hands them to the flow
machines, which then run `--rounds` more rounds; the JSON adds `formed_s` (the virtual time the last node got its
flows) and `scaling_phases`, and `converged_round` counts from the start, formation included.  `--scale-loss P`
loses that fraction of formation's messages (seeded), which it sends again (flow/resend.py); the JSON adds
how formation ended (`scaled_over`) and the messages `lost`, `resent` and taken twice (`duplicates`).

`--bound` adds what successive shortest paths need, computed centrally
(`ssp_waves`): the augmentations (`ssp_units`), the distinct shortest-path
costs among them (`pd_waves`: the label waves of a primal-dual scheme, which
augments every path of the same cost on one wave: a floor for any scheme that
recomputes the labels once per augmentation cost), `links_per_node` (one
announcement of every IN label to every previous-stage peer: what one wave
costs per node at the least), and `changed_in_per_node`: per node, the
announcements of the IN labels whose distance to the sink changed from one
augmentation to the next, each to every previous-stage peer (what a scheme
that re-announces only changed labels would send at the least), and
`changed_in_per_node_pd` the same from one primal-dual wave to the next;
`tight_in_per_node_pd` counts those only to the peers that choose the label
(their OUT label is the link cost plus it): what they would send if each
changed label reached only the peers it routes.  `skewed_links_per_node_pd` counts, per node, the links (p, r)
whose reduced cost rose from one primal-dual wave to the next (p's OUT label rose more than r's IN label; `_slack`:
by more than the label limits' slack 2): a limit told against both ends' floors of the previous wave (reduced
costs) would need telling again only there, if each end knew how far the other's floor rose.
`pruned_in_per_node_pd` counts, per primal-dual wave, the announcements (to every previous-stage peer) of the IN
labels that rose by at most the data node's label: what a wave that stops once it reaches the data node (a
Dijkstra from the sink over the costs reduced by the previous wave's labels) announces at the least; and
`stage_rise_share_pd` is the share of the labels (finite in both waves) that rose by the rise most common in
their stage: what a wave that tells each stage's usual rise once, and only the other labels, would leave;
`stage_shift_per_node_pd` what such a scheme sends at the least, per node: every label once to every peer, then
per primal-dual wave one message per relay (the stages' usual rises) and every label that rose otherwise (or
became reachable or unreachable) to every previous-stage peer; `truncated_per_node_pd` (and its IN and OUT parts)
for a wave that stops strictly below the data node's rise, silent where a label rose by exactly that (`_truncated`).
`choosers_per_node` counts, per node, what labels without waves need at the least when a rise goes only to the
peers that choose the label (`Choosers`): every label once to every peer, then per augmentation every fall to
every peer, every rise to its choosers, a message to a new choice (and to the old one), and two (a request and
its answer) for every candidate whose last known label made it look cheapest when it no longer was;
`choosers_per_node_bcast4` the same when a label also goes to every peer once it rose by 4 since it last did.

`--receipts` classifies every label a node receives in a CostAnnounce by what
it changed there (the node's IN and OUT labels and the choices behind them
compared before and after the message): `nothing`, `in_only` (the IN label or
its choice, not the OUT label) or `out` (the OUT label or its choice); and
counts the IN labels received per (sender, wave): how many previous-stage
peers x announcements one label of one wave costs.  Its `sent_per_node` splits
the labels told by why they went out (once per recipient, per node): `in_wave` /
`out_wave` the first IN / OUT label of a wave, `*_fall` a fall within the wave,
`*_route` a new route at the same cost (announce.py); an IN label counts every
previous-stage peer, so with `--label-limits` (which hold some back) the split
is an upper bound.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import heapq
import json
import sys
import time

from gwtf_node.protocol.flow import FlowConfig, FlowNode, announce
from gwtf_node.protocol.flow.scaling import EAGER_PHASES
from gwtf_node.protocol.messages import CostAnnounce, Side
from gwtf_node.protocol.neighbourhood import auto_choice, bound_links
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import add_flow_choice, run_gwtf
from gwtf_node.sim.scenarios import FlowSetting, generate_layered


class Receipts:
    """What the labels of each CostAnnounce changed at their receiver, and why each went out (`--receipts`):
    wraps `FlowNode.on_message` and `announce.flush` in this process while it is in force (a context manager)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.per_label: collections.Counter = collections.Counter()  # (sender, commodity, wave) -> IN labels
        self.sent: collections.Counter = collections.Counter()  # "in_wave" ... -> labels told, once per recipient
        self._orig = self._orig_flush = None

    def __enter__(self) -> "Receipts":
        self._orig = orig = FlowNode.on_message
        self._orig_flush = orig_flush = announce.flush
        counts, per_label, sent = self.counts, self.per_label, self.sent

        def flush(node, eff, rearm=True):
            # a label told is one whose last-told entry changed: the first of its wave, a fall within the wave,
            # or a new route at the same cost (announce.worth_announcing), to every recipient of its side
            before = {k: node.announcer.sent.get(k) for k in node.announcer.dirty}
            orig_flush(node, eff, rearm)
            for (d, side), last in before.items():
                now = node.announcer.sent.get((d, side))
                if now is None or now == last:
                    continue
                why = "wave" if last is None or last[0] != now[0] else "fall" if now[1] < last[1] - 1e-9 else "route"
                told = len(announce.in_recipients(node, d)) if side is Side.IN else len(node.units.out[d])
                sent[f"{'in' if side is Side.IN else 'out'}_{why}"] += told

        announce.flush = flush

        def on_message(node, now, sender, msg):
            if type(msg) is not CostAnnounce:
                return orig(node, now, sender, msg)
            ds = {lab.commodity for lab in msg.labels}
            before = {d: (node.my_in.get(d), node.dec_in.get(d), node.my_out.get(d), node.dec_out.get(d)) for d in ds}
            eff = orig(node, now, sender, msg)
            for lab in msg.labels:
                d = lab.commodity
                b = before[d]
                a = (node.my_in.get(d), node.dec_in.get(d), node.my_out.get(d), node.dec_out.get(d))
                side = "in_label" if lab.side is Side.IN else "out_label"
                what = "nothing" if a == b else ("in_only" if a[2:] == b[2:] else "out")
                counts[f"{side}_{what}"] += 1
                if lab.side is Side.IN:
                    per_label[(sender, d, lab.epoch)] += 1
            return eff

        FlowNode.on_message = on_message
        return self

    def __exit__(self, *exc) -> None:
        FlowNode.on_message = self._orig
        announce.flush = self._orig_flush

    def report(self, nodes: int) -> dict:
        n = len(self.per_label)
        return {**dict(sorted(self.counts.items())), "in_labels_per_label_wave":
                round(sum(self.per_label.values()) / n, 1) if n else 0.0,
                "sent_per_node": {k: round(v / nodes, 1) for k, v in sorted(self.sent.items())}}


def _residual(sc):
    """The layered scenario `sc` (one data node) as a residual network: node sides ("i"/"o", relay), the data
    node's source side ("s", "src") and sink side ("s", "snk"); arc -> [capacity, cost]."""
    (d,) = [n.id for n in sc.data_nodes]
    last = sc.stages - 1
    g: dict = collections.defaultdict(dict)

    def arc(u, v, cap, cost):
        g[u][v] = [cap, cost]
        g[v].setdefault(u, [0, -cost])

    for n in sc.nodes:
        if not n.is_data:
            arc(("i", n.id), ("o", n.id), n.capacity, 0.0)
    for link in sc.links:
        a, b = sorted((link.a, link.b), key=lambda x: -1 if x == d else sc.node(x).stage)
        if a == d:
            if sc.node(b).stage == 0:
                arc(("s", "src"), ("i", b), 10 ** 9, link.cost)
            if sc.node(b).stage == last:
                arc(("o", b), ("s", "snk"), 10 ** 9, link.cost)
        elif sc.node(b).stage == sc.node(a).stage + 1:
            arc(("o", a), ("i", b), 10 ** 9, link.cost)
    return g


def _dijkstra(g, pot, start, backward=False):
    """Reduced distances from `start` over the residual arcs (against them with `backward`)."""
    dist, heap = {start: 0.0}, [(0.0, start)]
    rev = None
    if backward:
        rev = collections.defaultdict(list)
        for u, nbrs in g.items():
            for v, (cap, cost) in nbrs.items():
                if cap > 0:
                    rev[v].append((u, cost))
    while heap:
        du, u = heapq.heappop(heap)
        if du > dist[u]:
            continue
        steps = ((v, c) for v, (cap, c) in g[u].items() if cap > 0) if rev is None else rev[u]
        for v, c in steps:
            nd = du + (c + pot[u] - pot[v] if rev is None else c + pot[v] - pot[u])
            if nd < dist.get(v, float("inf")) - 1e-9:
                dist[v] = nd
                heapq.heappush(heap, (nd, v))
    return dist


def ssp_waves(sc) -> dict:
    """Successive shortest paths on `sc` (one data node), centrally: see the module doc (`--bound`)."""
    g = _residual(sc)
    src, snk = ("s", "src"), ("s", "snk")
    pot: dict = collections.defaultdict(float)
    costs, changed, useful, before = [], [0, 0], 0, [None, None]  # per augmentation, per primal-dual wave
    skew = [0, 0]  # links whose reduced cost rose from one primal-dual wave to the next (by > 0, by > SLACK)
    trunc = [0, 0]  # what a wave that stops below the data node's rise announces: IN labels, OUT labels
    rises = [0, 0, 0, 0]  # IN labels across primal-dual waves: finite both times, rose by their stage's usual rise;
    # announcements of those that rose by at most the data node's rise, of those that rose otherwise (`_rises`)
    stage_of = {n.id: n.stage for n in sc.nodes if not n.is_data}
    outs: dict = {}
    d = sc.data_nodes[0].id
    prevs = {n.id: [(src if m == d else ("o", m), link.cost) for m, link in sc.neighbours(n.id).items()
                    if (m == d and n.stage == 0) or (m != d and sc.node(m).stage == n.stage - 1)]
             for n in sc.nodes if not n.is_data}
    choosers = (Choosers(prevs, float("inf")), Choosers(prevs, 4.0))
    while True:
        dist = _dijkstra(g, pot, src)
        if snk not in dist:
            break
        top = dist[snk]
        for u in list(g):
            pot[u] += min(dist.get(u, top), top)
        to_sink = _dijkstra(g, pot, snk, backward=True)

        def real(u):
            return to_sink[u] + pot[snk] - pot[u] if u in to_sink else float("inf")

        labels = {r: real(("i", r)) for r in prevs}
        for ch in choosers:
            ch.step(labels)
        cost = pot[snk] - pot[src]
        for k in (0, 1) if not costs or abs(cost - costs[-1]) > 1e-9 else (0,):
            old = before[k] or {}
            moved = [r for r, c in labels.items() if c != float("inf") and abs(c - old.get(r, float("inf"))) > 1e-9]
            changed[k] += sum(len(prevs[r]) for r in moved)
            if k == 1:  # told only to the peers that now choose it (a tight arc: cost + label = their OUT label)
                useful += sum(1 for r in moved for p, c in prevs[r] if abs(c + labels[r] - real(p)) <= 1e-9)
                if costs:
                    _rises(rises, prevs, stage_of, old, labels, cost - costs[-1])
                now_out = {p: real(p) for ps in prevs.values() for p, _ in ps if p != src}
                _skew(skew, prevs, old, labels, outs, now_out)
                if costs:
                    _truncated(trunc, g, prevs, (old, labels), (outs, now_out), cost - costs[-1])
                outs = now_out
            before[k] = labels
        costs.append(cost)
        v, prev = snk, _tree(g, pot, src, snk)
        while v != src:
            u = prev[v]
            g[u][v][0] -= 1
            g[v][u][0] += 1
            v = u
    n = len(sc.nodes)
    links = sum(len(p) for p in prevs.values())
    pd = len({round(c, 6) for c in costs})
    return {"ssp_units": len(costs), "ssp_total_cost": round(sum(costs), 6),
            "pd_waves": pd, "links_per_node": round(links / n, 1),
            "changed_in_per_node": round(changed[0] / n, 1), "changed_in_per_node_pd": round(changed[1] / n, 1),
            "tight_in_per_node_pd": round(useful / n, 1), "skewed_links_per_node_pd": round(skew[0] / n, 1),
            "skewed_links_per_node_pd_slack": round(skew[1] / n, 1),
            "pruned_in_per_node_pd": round(rises[2] / n, 1),
            "stage_rise_share_pd": round(rises[1] / rises[0], 3) if rises[0] else None,
            "stage_shift_per_node_pd": round((links + rises[3] + (pd - 1) * len(prevs)) / n, 1),
            "truncated_in_per_node_pd": round(trunc[0] / n, 1), "truncated_out_per_node_pd": round(trunc[1] / n, 1),
            "truncated_per_node_pd": round((links + trunc[0] + trunc[1] + (pd - 1) * (n - 1)) / n, 1),
            "choosers_per_node": round(choosers[0].sent / n, 1),
            "choosers_per_node_bcast4": round(choosers[1].sent / n, 1)}


class Choosers:
    """Labels without waves, a rise told only to the peers that choose the label (`--bound`, module doc).

    Every peer's last known label of a next-stage relay is at most its label (a fall goes to every peer, a rise
    to its choosers): a lower bound.  A peer whose cheapest candidate on those bounds is not known exactly asks
    it (a request and the answer) until its cheapest is; it then tells a new choice (and the old one), which
    sends it every later rise.  With `bcast` finite a label also goes to every peer once it rose by `bcast`
    since it last did.  Counts the messages (`sent`) over the labels of each augmentation (`step`)."""

    def __init__(self, prevs: dict, bcast: float) -> None:
        self.prevs, self.bcast, self.sent = prevs, bcast, 0
        self.nexts: dict = collections.defaultdict(list)  # previous-stage side -> [(relay, link cost)]
        for r, ps in prevs.items():
            for p, c in ps:
                self.nexts[p].append((r, c))
        self.known: dict = {}  # (peer, relay) -> the label the peer last heard
        self.choice: dict = {}  # peer -> the relay it chooses
        self.told: dict = {}  # relay -> its label when it last went to every peer

    def step(self, labels: dict) -> None:
        inf, known, choice = float("inf"), self.known, self.choice
        for r, ps in self.prevs.items():
            lab = labels[r]
            wide = r not in self.told or (lab != inf and lab >= self.told[r] + self.bcast - 1e-9)
            if wide:
                self.told[r] = lab
            for p, _ in ps:
                k = known.get((p, r))
                if k is None or lab < k - 1e-9 or (lab > k + 1e-9 and (wide or choice.get(p) == r)):
                    self.sent += lab != inf
                    known[(p, r)] = lab
        for p, cands in self.nexts.items():
            while True:
                r, _ = min(cands, key=lambda rc: (rc[1] + known[(p, rc[0])], rc[0] != choice.get(p), rc[0]))
                if known[(p, r)] == inf:
                    choice.pop(p, None)
                    break
                if abs(known[(p, r)] - labels[r]) > 1e-9:
                    self.sent += 2
                    known[(p, r)] = labels[r]
                    continue
                if choice.get(p) != r:
                    self.sent += 1 + (p in choice)
                    choice[p] = r
                break


def _rises(rises: list, prevs: dict, stage_of: dict, old_in: dict, new_in: dict, top: float) -> None:
    """From one primal-dual wave to the next (the data node's label rose by `top`): count the IN labels finite both
    times (`rises[0]`) and those that rose by the rise most common in their stage (`rises[1]`), and add the
    announcements of the labels that rose by at most `top`, each to every previous-stage peer (`rises[2]`): a
    Dijkstra from the sink over costs reduced by the previous wave's labels settles exactly those before it
    reaches the data node, so a wave that stops there announces no fewer (`--bound`, module doc); and the
    announcements, to every previous-stage peer, of the labels that did not rise by their stage's most common
    rise, a label that became reachable or unreachable included (`rises[3]`: what a wave that tells each stage's
    usual rise once leaves to tell)."""
    by_stage: dict = collections.defaultdict(list)
    inf = float("inf")
    for r, b in new_in.items():
        a = old_in.get(r, inf)
        rise = round(b - a, 6) if inf not in (a, b) else None  # None: not finite both times
        by_stage[stage_of[r]].append((rise, a != b, len(prevs[r])))
        if b != inf and b - a <= top + 1e-9:
            rises[2] += len(prevs[r])
    for got in by_stage.values():
        finite = [x for x, _, _ in got if x is not None]
        usual, n_usual = collections.Counter(finite).most_common(1)[0] if finite else (None, 0)
        rises[0] += len(finite)
        rises[1] += n_usual
        rises[3] += sum(peers for x, moved, peers in got if (moved if x is None else x != usual))


def _truncated(trunc: list, g: dict, prevs: dict, ins: tuple, outs: tuple, top: float) -> None:
    """What a primal-dual wave that stops strictly below the data node's rise `top` announces (`--bound`).

    The wave is a Dijkstra from the sink over the costs reduced by the previous wave's labels, spread in order
    of the reduced distance (a label goes out once the wave's clock has passed its rise).  Once it reaches the
    data node (whose label rose by `top`) the data node tells every node `top` along a tree (one message per
    node), and every label not announced by then rises by `top`: the potential update of successive shortest
    paths, pi' = pi + min(d, top), keeps every reduced cost at 0 or more, so the labels that rose by `top`
    exactly (a tie with the data node) need no message.  Counts, from one wave to the next, the announcements
    of the IN labels that rose by less than `top` (an unchanged one included) or became reachable or
    unreachable, each to every previous-stage peer (`trunc[0]`), and of the OUT labels that did, each to the
    next-stage relays the node sends units to, the only ones that route over its OUT label (`trunc[1]`).  A floor,
    not a scheme: a node that stays silent because it rose by exactly `top` cannot be told from one left without
    a route, which also rises by `top` (docs/bench_flow.md, "Bounded neighbourhoods")."""
    inf = float("inf")
    (old_in, new_in), (old_out, new_out) = ins, outs

    def told(a: float, b: float) -> bool:
        return (a == inf) != (b == inf) or (a != inf and b - a < top - 1e-9)

    for r, ps in prevs.items():
        trunc[0] += len(ps) * told(old_in.get(r, inf), new_in.get(r, inf))
    for p, b in new_out.items():
        if told(old_out.get(p, inf), b):
            trunc[1] += sum(1 for v in g[p] if v[0] == "i" and v[1] != p[1] and g[v][p][0] > 0)


SLACK = 2.0  # FlowConfig.label_limit_slack


def _skew(skew: list, prevs: dict, old_in: dict, new_in: dict, old_out: dict, new_out: dict) -> None:
    """Count the links (p, r) whose reduced cost rose between two primal-dual waves: p's OUT label (its
    threshold) rose more than r's IN label (by > 0, by > SLACK).  A limit told against the floors of the previous
    wave (a reduced cost) holds on the other links; on these, the peer must hear of it (`--bound`, module doc)."""
    inf = float("inf")
    for r, ps in prevs.items():
        a, b = old_in.get(r, inf), new_in.get(r, inf)
        if inf in (a, b):
            continue
        for p, _ in ps:
            x, y = old_out.get(p, inf), new_out.get(p, inf)
            if inf in (x, y):
                continue
            rise = (y - x) - (b - a)
            skew[0] += rise > 1e-9
            skew[1] += rise > SLACK + 1e-9


def _tree(g, pot, src, snk) -> dict:
    """A shortest path src -> snk over the tight residual arcs (reduced cost 0 after the potential update)."""
    prev, stack, seen = {}, [src], {src}
    while stack:
        u = stack.pop()
        if u == snk:
            return prev
        for v, (cap, c) in g[u].items():
            if cap > 0 and v not in seen and abs(c + pot[u] - pot[v]) <= 1e-9:
                seen.add(v)
                prev[v] = u
                stack.append(v)
    raise AssertionError("no tight path after a shortest-path computation")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, nargs="+", default=[160, 320, 1000])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--wall-limit", type=float, default=300.0, help="stop a run after this many seconds of wall time")
    ap.add_argument("--label-limits", action="store_true", help="FlowConfig.label_limits on (flow/limits.py)")
    ap.add_argument("--no-formation-waits", action="store_true",
                    help="FlowConfig.formation_waits off (units move on labels of a wave still spreading: waves.py)")
    ap.add_argument("--wave-order-s", type=float, default=None, metavar="S",
                    help="FlowConfig.wave_order_s (a label above its floor F goes out (L - F) x S later)")
    ap.add_argument("--launch-quiet-factor", type=float, default=None, metavar="F",
                    help="FlowConfig.launch_quiet_factor (the data node's wait before a launch, x the wave's time)")
    ap.add_argument("--announce-coalesce-s", type=float, default=None, metavar="S",
                    help="FlowConfig.announce_coalesce_s (labels changed within this window go out together)")
    add_flow_choice(ap)
    ap.add_argument("--scale-loss", type=float, default=0.0, metavar="P",
                    help="with --formation scaling: lose this fraction of formation's messages (seeded)")
    ap.add_argument("--eager-phases", type=int, default=EAGER_PHASES, metavar="N",
                    help="with --formation scaling: the first N phases tell their relabels (ScalePrice; default "
                         f"{EAGER_PHASES}, the daemon's; 0: none)")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    ap.add_argument("--receipts", action="store_true", help="with --json: what each received label changed (doc)")
    ap.add_argument("--bound", action="store_true", help="with --json: what successive shortest paths need (doc)")
    args = ap.parse_args(argv)
    if not 0 <= args.scale_loss < 1 or (args.scale_loss and args.formation == "waves"):
        ap.error(f"--scale-loss takes a fraction in [0, 1) with scaled formation, not {args.scale_loss}")
    if (args.receipts or args.bound) and not args.json:
        ap.error("--receipts and --bound need --json (they are fields of the JSON object)")
    if not args.json:
        print("| relays x stages | flows / max flow | GWTF / optimum | optimum / optimum over every link "
              "| converged round | rounds run | waves | messages | per node | CostAnnounce | wall s | CPU s "
              "| stopped by wall limit |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.relays:
        full = parse_scenario(generate_layered(f"scale-{n}x{args.stages}",
                                               FlowSetting(1, n, args.stages, (1, 3), (1, 20)), args.seed))
        formation, k = auto_choice(full, args.formation, args.neighbours)
        if args.scale_loss and formation != "scaling":
            ap.error(f"--scale-loss needs scaled formation: {n} relays x {args.stages} stages form by label waves")
        sc = bound_links(full, k)
        t, c = time.perf_counter(), time.process_time()
        rec = Receipts() if args.receipts else None
        knobs = {k: getattr(args, k) for k in ("wave_order_s", "launch_quiet_factor", "announce_coalesce_s")
                 if getattr(args, k) is not None}
        if args.label_limits:
            knobs["label_limits"] = True
        if args.no_formation_waits:
            knobs["formation_waits"] = False
        base = FlowConfig("-", False, 0, (), {}, {}, **knobs) if knobs else None
        with rec if rec is not None else contextlib.nullcontext():
            g = run_gwtf(sc, seed=args.seed, rounds=args.rounds, wall_limit_s=args.wall_limit, base=base,
                         neighbours=k, formation=formation, scale_loss=args.scale_loss,
                         eager_phases=args.eager_phases)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        o = optimal_routing(sc)
        ratio = g.mean_cost / o.mean_cost if o.mean_cost else 1.0
        of = o if sc is full else optimal_routing(full)
        price = o.mean_cost / of.mean_cost if of.mean_cost else 1.0
        if args.json:
            scaled = {k: g.extra[k] for k in ("formed_s", "scaling_phases", "scaled_over", "lost", "resent",
                                              "duplicates") if k in g.extra}
            print(json.dumps({"relays": n, "stages": args.stages, "neighbours": k,
                              "formation": formation, **scaled,
                              **({"eager_phases": args.eager_phases} if formation == "scaling" else {}),
                              "flows": g.num_flows, "max_flow": o.num_flows, "cost_ratio": round(ratio, 6),
                              "max_flow_every_link": of.num_flows, "optimum_over_every_link": round(price, 6),
                              "links": len(sc.links), "converged_round": g.converged_round,
                              "rounds": g.rounds, "waves": g.extra["waves"], "recalls": g.extra.get("recalls", 0),
                              "messages": g.messages,
                              "per_node": round(g.messages / len(sc.nodes), 1),
                              "messages_by_type": g.extra["messages_by_type"],
                              "inconsistent_links": g.extra["inconsistent_links"],
                              "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                              "wall_limited": g.extra["wall_limited"],
                              **({"receipts": rec.report(len(sc.nodes))} if rec is not None else {}),
                              **(ssp_waves(sc) if args.bound else {})}), flush=True)
            continue
        print(f"| {n} x {args.stages} | {g.num_flows} / {o.num_flows} | {ratio:.4f} | {price:.4f} | {g.converged_round} "
              f"| {g.rounds} | {g.extra['waves']} | {g.messages} | {g.messages / len(sc.nodes):.0f} "
              f"| {g.extra['messages_by_type'].get('CostAnnounce', 0)} | {wall:.1f} | {cpu:.1f} "
              f"| {'yes' if g.extra['wall_limited'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

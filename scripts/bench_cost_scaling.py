#!/usr/bin/env python3
"""Cost scaling against label waves: the messages per node of a min-cost flow without waves, one data node.

The flow machines' label waves recompute every label once per augmentation cost, so a node's messages grow with
the units of the swarm (docs/bench_flow.md, "How few messages label waves can reach").  This benchmark runs the
other classic exact algorithm, Goldberg-Tarjan cost scaling (`refine` with FIFO push/relabel on the min-cost
circulation), centrally on the instances of `bench_flow_scale.py` and counts what a distributed version would
send at the least, next to what the flow machines send on the same instance (`--machines`):

* the network: a relay is an IN side and an OUT side joined by an arc of its capacity; a link (previous-stage
  OUT -> next-stage IN, the data node's source -> first stage, last stage -> its sink) carries at most the
  smaller capacity of its relays; an arc sink -> source of cost -M (M above any path's cost) makes the
  min-cost circulation the min-cost maximum flow.  Link costs must be integers (setting 1's are 1-20); they are
  scaled by the number of sides + 1, so the last phase (epsilon 1) leaves the flows exactly optimal;
* a push across machines is one message and carries the sender's price.  With lazy prices (the default) a
  relabel tells nobody: a machine pushes on the prices it last heard, and a push that the receiver finds not
  admissible (its true reduced cost is not negative) is refused with the receiver's price, a second message.
  With `--eager` every relabel tells the new price to every neighbouring machine, and no push is refused;
* each phase costs 2 messages a machine (its start and its end along a tree).  A termination detection that
  acknowledges every message (Dijkstra-Scholten) would add one a push; the counts leave it out.

The IN and OUT sides of a relay, and the data node's source and sink, are one machine: nothing between them is
counted.  The order is the sequential FIFO order, so the counts are a floor for the distributed version, as the
`--bound` columns of `bench_flow_scale.py` are for label waves.

    python scripts/bench_cost_scaling.py                                  # 160, 320, 1000 relays, K = 10
    python scripts/bench_cost_scaling.py --relays 160 1000 --machines     # with the flow machines side by side
    python scripts/bench_cost_scaling.py --relays 160 1000 --neighbours 0 --eager --json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from gwtf_node.protocol.neighbourhood import bound_links
from gwtf_node.protocol.scenario import Scenario, parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import FlowSetting, generate_layered

SOURCE, SINK = ("d", "source"), ("d", "sink")


def circulation(sc: Scenario) -> tuple[dict, tuple]:
    """`sc` (one data node) as a circulation network: arc -> [capacity, integer cost], every arc with its
    reverse (capacity 0); and the arc sink -> source whose flow is the units placed."""
    (data,) = [n.id for n in sc.data_nodes]
    cap = {n.id: n.capacity for n in sc.relays}
    stage = {n.id: n.stage for n in sc.relays}
    arcs: dict = {}

    def arc(u, v, c, cost):
        if cost != int(cost):
            raise SystemExit(f"cost scaling needs integer link costs: {cost} on {u} -> {v}")
        arcs[(u, v)] = [c, int(cost)]
        arcs.setdefault((v, u), [0, -int(cost)])

    for r, c in cap.items():
        arc(("in", r), ("out", r), c, 0)
    top = 0
    for link in sc.links:
        ends = sorted((link.a, link.b), key=lambda x: stage.get(x, -1))
        if ends[0] == data:
            r = ends[1]
            if stage[r] == 0:
                arc(SOURCE, ("in", r), cap[r], link.cost)
            if stage[r] == sc.stages - 1:
                arc(("out", r), SINK, cap[r], link.cost)
        elif stage[ends[1]] == stage[ends[0]] + 1:
            arc(("out", ends[0]), ("in", ends[1]), min(cap[ends[0]], cap[ends[1]]), link.cost)
        else:
            continue
        top = max(top, int(link.cost))
    back = (SINK, SOURCE)
    arc(SINK, SOURCE, sum(c for (u, _), (c, _) in arcs.items() if u == SOURCE), -(1 + (sc.stages + 1) * top))
    return arcs, back


def machine(side: tuple) -> object:
    return side[1] if side[0] in ("in", "out") else "data node"


def cost_scaling(sc: Scenario, factor: int = 2, eager: bool = False) -> dict:
    """Min-cost maximum flow of `sc` by cost scaling (module doc); what it placed, its cost, and the messages."""
    arcs, back = circulation(sc)
    adj = collections.defaultdict(list)
    for u, v in arcs:
        adj[u].append(v)
    alpha = len(adj) + 1
    cost = {a: c * alpha for a, (_, c) in arcs.items()}
    cap = {a: c for a, (c, _) in arcs.items()}
    price = dict.fromkeys(adj, 0)
    heard: dict = {}  # (side, neighbour side) -> the neighbour's price as the side's machine last heard it
    told = {u: {machine(v) for v in adj[u]} - {machine(u)} for u in adj}
    excess: dict = collections.defaultdict(int)
    count = collections.Counter()

    def known(u, v):
        return price[v] if eager or machine(u) == machine(v) else heard.get((u, v), 0)

    def push(u, v, amount) -> bool:
        if machine(u) != machine(v):
            count["pushes"] += 1
            heard[(v, u)] = price[u]
            if cost[(u, v)] + price[u] - price[v] >= 0:  # stale price: refused, with the receiver's price
                count["refused"] += 1
                heard[(u, v)] = price[v]
                return False
        cap[(u, v)] -= amount
        cap[(v, u)] += amount
        excess[u] -= amount
        excess[v] += amount
        return True

    def admissible(u):
        return [v for v in adj[u] if cap[(u, v)] > 0 and cost[(u, v)] + price[u] - known(u, v) < 0]

    eps, phases = max(abs(c) for c in cost.values()), 0
    while eps > 1:
        eps, phases = max(1, eps // factor), phases + 1
        for (u, v) in list(cost):
            if cap[(u, v)] > 0 and cost[(u, v)] + price[u] - known(u, v) < 0:
                push(u, v, cap[(u, v)])
        queue = collections.deque(u for u in adj if excess[u] > 0)
        waiting = set(queue)
        while queue:
            u = queue.popleft()
            waiting.discard(u)
            while excess[u] > 0:
                for v in admissible(u):
                    if push(u, v, min(excess[u], cap[(u, v)])) and excess[v] > 0 and v not in waiting:
                        queue.append(v)
                        waiting.add(v)
                    if excess[u] == 0:
                        break
                if excess[u] > 0 and not admissible(u):  # none left on the prices it knows: relabel
                    price[u] = max(known(u, v) - cost[(u, v)] for v in adj[u] if cap[(u, v)] > 0) - eps
                    count["relabels"] += 1
                    if eager:
                        count["price_tells"] += len(told[u])
    machines = len({machine(u) for u in adj})
    # the certificate: every residual arc's reduced cost at least -1 (epsilon 1 on costs scaled by alpha)
    certified = all(cost[a] + price[a[0]] - price[a[1]] >= -1 for a in cost if cap[a] > 0)
    sent = count["pushes"] + count["refused"] + count["price_tells"] + 2 * machines * phases
    units = arcs[back][0] - cap[back]
    total = sum((arcs[a][0] - cap[a]) * c for a, (k, c) in arcs.items() if k > 0 and a != back)
    return {"units": units, "total_cost": total, "certified": certified, "phases": phases, "messages": sent,
            "per_node": round(sent / machines, 1), "refused_per_node": round(count["refused"] / machines, 1),
            "pushes_per_node": round(count["pushes"] / machines, 1),
            "relabels_per_node": round(count["relabels"] / machines, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, nargs="+", default=[160, 320, 1000])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--neighbours", type=int, default=10, metavar="K",
                    help="bound each relay's flow links to K (protocol/neighbourhood.py; 0: every link)")
    ap.add_argument("--factor", type=int, default=2, help="epsilon is divided by this each phase")
    ap.add_argument("--eager", action="store_true", help="every relabel tells every neighbouring machine")
    ap.add_argument("--machines", action="store_true", help="also run the flow machines (label waves) side by side")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = ap.parse_args(argv)
    if args.factor < 2:
        ap.error("--factor must be at least 2")
    if not args.json:
        print("| relays x stages | units / max flow | cost / optimum | phases | per node | refused per node "
              "| flow machines per node | cost scaling / flow machines |")
        print("|---|---|---|---|---|---|---|---|")
    first = None
    for n in args.relays:
        sc = bound_links(parse_scenario(generate_layered(
            f"scale-{n}x{args.stages}", FlowSetting(1, n, args.stages, (1, 3), (1, 20)), args.seed)), args.neighbours)
        opt = optimal_routing(sc)
        t = time.process_time()
        got = cost_scaling(sc, args.factor, args.eager)
        got["cpu_s"] = round(time.process_time() - t, 1)
        got["cost_ratio"] = round(got["total_cost"] / (opt.mean_cost * opt.num_flows), 6) if opt.num_flows else 1.0
        waves = None
        if args.machines:
            g = run_gwtf(sc, seed=args.seed, neighbours=args.neighbours)
            waves = round(g.messages / len(sc.nodes), 1)
        first = first or (got["per_node"], waves)
        row = {"relays": n, "stages": args.stages, "neighbours": args.neighbours, "factor": args.factor,
               "eager": args.eager, "max_flow": opt.num_flows, **got, "machines_per_node": waves,
               "growth": round(got["per_node"] / first[0], 2),
               "machines_growth": round(waves / first[1], 2) if waves else None}
        if args.json:
            print(json.dumps(row), flush=True)
            continue
        vs = f"{got['per_node'] / waves:.2f}" if waves else "-"
        machines = f"{waves} ({row['machines_growth']:.2f} x)" if waves else "-"
        print(f"| {n} x {args.stages} | {got['units']} / {opt.num_flows} | {got['cost_ratio']:.4f} | {got['phases']} "
              f"| {got['per_node']:.1f} ({row['growth']:.2f} x) | {got['refused_per_node']:.1f} | {machines} "
              f"| {vs} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

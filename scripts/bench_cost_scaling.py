#!/usr/bin/env python3
"""Cost scaling against label waves: the messages per node of a min-cost flow without waves, one data node.

The flow machines' label waves recompute every label once per augmentation cost, so a node's messages grow with
the units of the swarm (docs/bench_flow.md, "How few messages label waves can reach").  This benchmark runs the
other classic exact algorithm, Goldberg-Tarjan cost scaling (`refine` with FIFO push/relabel on the min-cost
circulation), centrally on the instances of `bench_flow_scale.py` and counts what a distributed version would
send at the least, next to what the flow machines send on the same instance (`--machines`):

* the network: a relay is an IN side and an OUT side joined by an arc of its capacity; a link (previous-stage
  OUT -> next-stage IN, the data node's source -> first stage, last stage -> its sink) carries at most the
  smaller capacity of its relays; an arc sink -> source of cost -M makes the min-cost circulation the min-cost
  maximum flow as long as no augmenting path costs M or more.  M is 1 + (stages + 1) x the largest link cost,
  above any path's own cost; a rerouting chain could cost more, so the units are always checked against the
  maximum flow (`max_flow`, networkx; equal on every instance measured).  Link costs must be integers (setting 1's are 1-20); they are
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

`--distributed` runs the distributed version instead: one `ScalingMachine` a node in the simulator
(sim/engine.py, message delays the links'), asynchronous, with lazy prices as above (`--eager`, or
`--eager-phases N` for the first N phases: a relabel's price also goes to the neighbouring machines that can push
to the side in a `Price`, which sets no work going and so carries no credit).  The data node runs the
phases: it tells every node each phase's epsilon (`Phase`), a node that hears of a phase first from a push
starts it then, and a phase ends when all of its credit is back at the data node (Huang's weight throwing: a
node's credit rides on the pushes and refusals it sends, and a node that sends nothing hands it back in a
`Credit`); `Done` tells every node that the flows are final.  Every message is counted, and `formed_s` is the
virtual time of the last phase's end, next to the flow machines' converged time (`--machines`); the JSON's
`per_phase` gives each phase's epsilon in link-cost units, its virtual seconds, and the messages received while
the receiver was in it.

    python scripts/bench_cost_scaling.py                                  # 160, 320, 1000 relays, K = 10
    python scripts/bench_cost_scaling.py --relays 160 1000 --machines     # with the flow machines side by side
    python scripts/bench_cost_scaling.py --relays 160 1000 --neighbours 0 --eager --json
    python scripts/bench_cost_scaling.py --distributed --machines         # the machines in the simulator
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from gwtf_node.protocol.flow.scaling import ScalingMachine, node_of
from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.protocol.neighbourhood import bound_links
from gwtf_node.protocol.scenario import Scenario, parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.engine import Simulator
from gwtf_node.sim.flowsim import link_delays, run_gwtf
from gwtf_node.sim.scenarios import FlowSetting, generate_layered


def circulation(sc: Scenario) -> tuple[dict, tuple]:
    """`sc` (one data node) as a circulation network: arc -> [capacity, integer cost], every arc with its
    reverse (capacity 0); and the arc sink -> source whose flow is the units placed."""
    (data,) = [n.id for n in sc.data_nodes]
    source, sink = ("source", data), ("sink", data)
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
                arc(source, ("in", r), cap[r], link.cost)
            if stage[r] == sc.stages - 1:
                arc(("out", r), sink, cap[r], link.cost)
        elif stage[ends[1]] == stage[ends[0]] + 1:
            arc(("out", ends[0]), ("in", ends[1]), min(cap[ends[0]], cap[ends[1]]), link.cost)
        else:
            continue
        top = max(top, int(link.cost))
    back = (sink, source)
    arc(sink, source, sum(c for (u, _), (c, _) in arcs.items() if u == source), -(1 + (sc.stages + 1) * top))
    return arcs, back


def opening(arcs: dict, alpha: int, first_eps: int | None, factor: int) -> int:
    """The epsilon before the first phase (which divides it by `factor`): `first_eps` link-cost units, by default
    the largest link cost, on the scaled costs.  Refine starts by saturating every arc of negative reduced cost,
    so it needs no epsilon-optimal start, and the circulation arc's -M is left out."""
    top = first_eps or max((k for c, k in arcs.values() if c > 0 and k > 0), default=1)
    return top * alpha * factor


def cost_scaling(sc: Scenario, factor: int = 2, eager: bool = False, first_eps: int | None = None) -> dict:
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
    told = {u: {node_of(v) for v in adj[u]} - {node_of(u)} for u in adj}
    excess: dict = collections.defaultdict(int)
    count = collections.Counter()

    def known(u, v):
        return price[v] if eager or node_of(u) == node_of(v) else heard.get((u, v), 0)

    def push(u, v, amount) -> bool:
        if node_of(u) != node_of(v):
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

    eps, phases = opening(arcs, alpha, first_eps, factor), 0
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
    machines = len({node_of(u) for u in adj})
    # the certificate: every residual arc's reduced cost at least -1 (epsilon 1 on costs scaled by alpha)
    certified = all(cost[a] + price[a[0]] - price[a[1]] >= -1 for a in cost if cap[a] > 0)
    sent = count["pushes"] + count["refused"] + count["price_tells"] + 2 * machines * phases
    units = arcs[back][0] - cap[back]
    total = sum((full - cap[a]) * c for a, (full, c) in arcs.items() if full > 0 and a != back)
    return {"units": units, "total_cost": total, "certified": certified, "phases": phases, "messages": sent,
            "per_node": round(sent / machines, 1), "refused_per_node": round(count["refused"] / machines, 1),
            "pushes_per_node": round(count["pushes"] / machines, 1),
            "relabels_per_node": round(count["relabels"] / machines, 1)}


# --- distributed: one machine a node in the simulator (`--distributed`) ------------------------------------------


def distributed(sc: Scenario, factor: int = 2, first_eps: int | None = None, eager_phases: int = 0) -> dict:
    """Cost scaling by one `ScalingMachine` a node in the simulator (message delays: the links'); what it placed,
    its cost, the messages by type and the virtual time the flows were final."""
    arcs, back = circulation(sc)
    (data,) = [n.id for n in sc.data_nodes]
    sim = Simulator(link_delays(sc))
    alpha = len({u for u, _ in arcs}) + 1
    own: dict = collections.defaultdict(dict)  # each node's arcs, by the machine of their tail
    for a, arc in arcs.items():
        own[node_of(a[0])][a] = arc
    nodes = {n.id: ScalingMachine(n.id, own[n.id], data, factor, eager_phases, alpha) for n in sc.nodes}
    nodes[data] = ScalingMachine(data, own[data], data, factor, eager_phases, alpha,
                                 opening(arcs, alpha, first_eps, factor), tuple(sorted(set(nodes) - {data})))
    for nid in sorted(nodes):
        sim.add(nid, nodes[nid])
    sim.start_all()
    sim.run_until(float("inf"))
    flow = {}
    for m in nodes.values():
        flow.update(m.flows())
    units = flow[back]
    total = sum(f * arcs[a][1] for a, f in flow.items() if a != back)
    price = {u: p for m in nodes.values() for u, p in m.price.items()}
    certified = all(m.cost[a] + price[a[0]] - price[a[1]] >= -1 for m in nodes.values() for a, c in m.cap.items() if c)
    n = len(nodes)
    by_type = {k.removeprefix("Scale"): v for k, v in sim.stats.messages_by_type.items()}
    received: collections.Counter = collections.Counter()
    for m in nodes.values():
        for (p, k), v in m.received.items():
            received[(p, k.removeprefix("Scale"))] += v
    ends = [t for t, _ in nodes[data].started[1:]] + [nodes[data].done]
    per_phase = [{"eps": round(e / alpha, 3), "s": round(end - t, 1),
                  "received": {k: v for (p, k), v in sorted(received.items()) if p == i}}
                 for i, ((t, e), end) in enumerate(zip(nodes[data].started, ends), 1) if end is not None]
    return {"units": units, "total_cost": total, "certified": certified, "phases": nodes[data].phase,
            "messages": sim.stats.messages, "per_node": round(sim.stats.messages / n, 1),
            "refused_per_node": round(by_type.get("Refuse", 0) / n, 1), "formed_s": None if nodes[data].done is None else round(nodes[data].done, 1),
            "by_type": dict(sorted(by_type.items())), "per_phase": per_phase,
            "by_type_per_node": {k: round(v / n, 1) for k, v in sorted(by_type.items())}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, nargs="+", default=[160, 320, 1000])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--neighbours", type=int, default=10, metavar="K",
                    help="bound each relay's flow links to K (protocol/neighbourhood.py; 0: every link)")
    ap.add_argument("--factor", type=int, default=2, help="epsilon is divided by this each phase")
    ap.add_argument("--first-eps", type=int, default=None, metavar="E",
                    help="the first phase's epsilon, in link-cost units (default: the largest link cost)")
    ap.add_argument("--eager", action="store_true",
                    help="every relabel tells its price (the central count: to every neighbouring machine; "
                         "--distributed: to those that can push to the side)")
    ap.add_argument("--eager-phases", type=int, default=0, metavar="N",
                    help="--distributed: a relabel in phases 1-N tells the neighbouring machines that can "
                         "push to the side (`Price`)")
    ap.add_argument("--distributed", action="store_true",
                    help="run one machine a node in the simulator (`ScalingMachine`) instead of the central count")
    ap.add_argument("--machines", action="store_true", help="also run the flow machines (label waves) side by side")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = ap.parse_args(argv)
    if args.factor < 2:
        ap.error("--factor must be at least 2")
    if args.first_eps is not None and args.first_eps < 1:
        ap.error("--first-eps must be at least 1")
    if args.eager_phases and not args.distributed:
        ap.error("--eager-phases is for --distributed (the central count's --eager tells every relabel)")
    if not args.json:
        print("| relays x stages | units / max flow | cost / optimum | phases | per node | refused per node "
              "| flow machines per node | cost scaling / flow machines | formed s (flow machines) |")
        print("|---|---|---|---|---|---|---|---|---|")
    first = None
    for n in args.relays:
        sc = bound_links(parse_scenario(generate_layered(
            f"scale-{n}x{args.stages}", FlowSetting(1, n, args.stages, (1, 3), (1, 20)), args.seed)), args.neighbours)
        opt = optimal_routing(sc)
        t = time.process_time()
        if args.distributed:
            got = distributed(sc, args.factor, args.first_eps, 10 ** 6 if args.eager else args.eager_phases)
        else:
            got = cost_scaling(sc, args.factor, args.eager, args.first_eps)
        got["cpu_s"] = round(time.process_time() - t, 1)
        got["cost_ratio"] = round(got["total_cost"] / (opt.mean_cost * opt.num_flows), 6) if opt.num_flows else 1.0
        waves = None
        if args.machines:
            g = run_gwtf(sc, seed=args.seed, neighbours=args.neighbours, formation="waves")  # (the flow machines' waves)
            waves = round(g.messages / len(sc.nodes), 1)
            got["machines_converged_s"] = g.converged_round * FlowConfig.round_s
        first = first or (got["per_node"], waves)
        row = {"relays": n, "stages": args.stages, "neighbours": args.neighbours, "factor": args.factor,
               "first_eps": args.first_eps, "eager_phases": args.eager_phases,
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
              f"| {vs} | {got.get('formed_s') or '-'} ({got.get('machines_converged_s') or '-'}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

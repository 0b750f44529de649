#!/usr/bin/env python3
"""Why GWTF's flows with several data nodes cost more than the LP bound: which local moves would lower them.

For each flow-test instance (settings 5-6 of Table V), runs the flow machines
(`run_gwtf`, the default `FlowConfig`) and, on the routing they end with,
measures the gain of three kinds of local improvement, computed centrally
(networkx), against the gap to the multi-commodity LP bound:

* one commodity re-routed: the data node's units routed again at minimum
  cost (the same number of units) with every other data node's units fixed,
  in the capacity they leave (what a single-commodity negative cycle, Request
  Change / Redirect or relabelling within one commodity can reach);
* relabelling: each unit given to the data node whose first and last hops
  are cheapest on its route (Relabel, flow/relabel.py);
* pairwise exchange: two units swap their routes after some stage, each
  then taken by its cheapest data node (Request Change across commodities);
* two commodities re-routed together: the exact integral optimum
  (`optimal_routing`, the MILP) of two data nodes' units, as many as now, in
  the capacity the other data nodes' units leave (the best pair), and every
  pair so in turn, each keeping the gains before it, until a sweep gains nothing.

A gain of 0 for the first three while the gap is positive says that the routing is a
local optimum of those moves: what remains needs several units of several data
nodes moved at once, which the last column measures.

    python scripts/diag_flow_multi.py --settings 5 6 --seeds 10
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
from collections import Counter

import networkx as nx

from gwtf_node.protocol.scenario import Scenario, parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.result import Flow, path_cost
from gwtf_node.sim.scenarios import flow_setting_scenario


def reroute_gain(sc: Scenario, flows: list[Flow], k: str) -> float:
    """Cost of data node k's units now minus their min-cost routing with the other data nodes' units fixed."""
    n = sum(f.data_node == k for f in flows)
    if n == 0:
        return 0.0
    used = Counter(r for f in flows if f.data_node != k for r in f.path)
    g = nx.DiGraph()
    last = sc.stages - 1
    for r in sc.relays:
        if r.capacity - used[r.id] > 0:
            g.add_edge(("in", r.id), ("out", r.id), capacity=r.capacity - used[r.id], weight=0)
        for p, link in sc.neighbours(r.id).items():
            o = sc.node(p)
            w = int(round(link.cost * 1000))
            if o.is_data and p == k and r.stage == 0:
                g.add_edge("src", ("in", r.id), weight=w, capacity=n)
            elif o.is_data and p == k and r.stage == last:
                g.add_edge(("out", r.id), "snk", weight=w, capacity=n)
            elif not o.is_data and o.stage == r.stage + 1:
                g.add_edge(("out", r.id), ("in", p), weight=w, capacity=n)
    g.add_node("src", demand=-n)
    g.add_node("snk", demand=n)
    now = sum(f.cost for f in flows if f.data_node == k)
    return now - nx.min_cost_flow_cost(g) / 1000


def cheapest(sc: Scenario, path: tuple[str, ...], data: list[str]) -> float:
    costs = [path_cost(sc, d, path) for d in data]
    return min(c for c in costs if c is not None)


def exchange_gain(sc: Scenario, flows: list[Flow], data: list[str]) -> float:
    """The best gain of two units swapping their routes after one stage (each then its cheapest data node's)."""
    best = 0.0
    for f1, f2 in itertools.combinations(flows, 2):
        for s in range(sc.stages - 1):
            q1, q2 = f1.path[:s + 1] + f2.path[s + 1:], f2.path[:s + 1] + f1.path[s + 1:]
            if q1 == f1.path or sc.cost(q1[s], q1[s + 1]) is None or sc.cost(q2[s], q2[s + 1]) is None:
                continue
            best = max(best, f1.cost + f2.cost - cheapest(sc, q1, data) - cheapest(sc, q2, data))
    return best


def pair_gain(raw: dict, flows: list[Flow], pair: tuple[str, str], seed: int) -> tuple[float, list[Flow]]:
    """Cost of the two data nodes' units now minus their joint optimum with the other units fixed, and the
    routing with that optimum in place of their units."""
    used = Counter(r for f in flows if f.data_node not in pair for r in f.path)
    n = sum(f.data_node in pair for f in flows)
    if n == 0:
        return 0.0, flows
    sub = copy.deepcopy(raw)
    data = {x["id"] for x in sub["nodes"] if x["role"] == "data"}
    sub["nodes"] = [dict(x, capacity=x["capacity"] - used[x["id"]]) if x["role"] == "relay" else x
                    for x in sub["nodes"] if x["role"] == "relay" or x["id"] in pair]
    sub["links"] = [ln for ln in sub["links"] if not ({ln["a"], ln["b"]} & (data - set(pair)))]
    best = optimal_routing(parse_scenario(sub), seed=seed, flow_value=n)
    if best.num_flows < n:
        return 0.0, flows
    return (sum(f.cost for f in flows if f.data_node in pair) - best.total_cost,
            [f for f in flows if f.data_node not in pair] + list(best.flows))


def pairs_in_turn(raw: dict, flows: list[Flow], data: list[str], seed: int, sweeps: int = 6) -> float:
    """Total cost after re-routing every pair of data nodes together in turn (keeping each gain) until a
    sweep over the pairs gains nothing."""
    for _ in range(sweeps):
        gained = False
        for pair in itertools.combinations(data, 2):
            gain, new = pair_gain(raw, flows, pair, seed)
            if gain > 1e-9:
                flows, gained = new, True
        if not gained:
            break
    return sum(f.cost for f in flows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=[5, 6])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args(argv)
    if any(s not in (5, 6) for s in args.settings):
        print("diag_flow_multi.py: --settings takes 5 and/or 6 (the settings with several data nodes)",
              file=sys.stderr)
        return 2
    print("| setting | seed | GWTF total | LP bound total | gap | one commodity re-routed (best) "
          "| relabelling | pairwise exchange | two commodities re-routed together (best pair) "
          "| all pairs in turn, until none gains: total / LP bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setting in args.settings:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            raw = flow_setting_scenario(setting, seed)
            sc = parse_scenario(raw)
            data = sorted(n.id for n in sc.data_nodes)
            g = run_gwtf(sc, seed=seed)
            lp = optimal_routing(sc, seed=seed).extra["lp_bound_total_cost"]
            total = sum(f.cost for f in g.flows)
            reroute = max(reroute_gain(sc, g.flows, k) for k in data)
            relabel = sum(f.cost - cheapest(sc, f.path, data) for f in g.flows)
            pairs = max(pair_gain(raw, g.flows, p, seed)[0] for p in itertools.combinations(data, 2))
            in_turn = pairs_in_turn(raw, g.flows, data, seed)
            print(f"| {setting} | {seed} | {total:.0f} | {lp:.1f} | {total - lp:.1f} | {reroute:.0f} "
                  f"| {relabel:.0f} | {exchange_gain(sc, g.flows, data):.0f} | {pairs:.0f} "
                  f"| {in_turn:.0f} / {in_turn / lp:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Several data nodes formed as one commodity, centrally: a balanced circulation, suffix swaps, exchanges.

What a formation that first routes the units as one commodity would reach on
settings 5-6 of Table V, computed centrally (networkx), against the
multi-commodity LP bound.  Three steps, each reported:

1. *Balanced circulation* (`circulation`): a min-cost flow in which a unit
   leaves some data node and comes back to any data node (the relays' paths
   know no commodity), every data node taking back as many units as it sent
   (an arc from each data node's sink side to its source side, cost -10^9, so
   the circulation carries the maximum flow at the least cost).  A relaxation:
   a unit may end at another data node than the one it left.
2. *Suffix swaps* (`swap_suffixes`): while a unit A ends at another data node
   than it left, take a unit B that leaves the data node A ends at and ends
   elsewhere, and swap their paths, each with its last hop, after the stage
   where that costs least (the pair that costs least first): B then ends where
   it left, and A where B ended.  The balance makes such a B exist; every relay
   keeps its units, so capacities hold.
3. *Exchanges* (`exchange`): two units swap their paths after some stage, each
   then taken by the data node cheapest for its first and last hops (the
   diag_flow_multi.py move), while one gains, until none does.

`--start handoff` makes step 1 a sequence of shortest paths instead (`handoff`): what a formation that adds
one unit at a time, and hands a unit that came home to the wrong data node on, would start from.

With `--gwtf` it also runs the flow machines (`run_gwtf`, the default
`FlowConfig`) and applies step 3 to their flows: whether the start or the
exchanges make the difference.

    python scripts/diag_flow_circulation.py --settings 5 6 --seeds 20 --first-seed 200
    python scripts/diag_flow_circulation.py --settings 6 --seeds 10 --gwtf
    python scripts/diag_flow_circulation.py --settings 5 6 --seeds 20 --first-seed 100 --start handoff
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import sys

import networkx as nx

from gwtf_node.protocol.scenario import Scenario, parse_scenario
from gwtf_node.sim.baselines import SUPER, flow_network, max_flow_value, optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.result import path_cost
from gwtf_node.sim.scenarios import flow_setting_scenario

INF = float("inf")
CLOSE = -10 ** 9  # a unit back at a data node (costs are x COST_SCALE): the circulation carries all it can first
UNBOUNDED = 10 ** 6  # a link's capacity (flow_network gives it none)

Unit = list  # [data node it leaves, [relay per stage], data node it ends at]


def unit_cost(sc: Scenario, unit: Unit) -> float:
    hops = (unit[0], *unit[1], unit[2])
    return sum(sc.cost(a, b) for a, b in zip(hops, hops[1:]))


def home(sc: Scenario, path: list[str], data: list[str]) -> Unit:
    """`path` as a unit of the data node cheapest for its first and last hops (relabelling)."""
    return min(([d, path, d] for d in data), key=lambda u: path_cost(sc, u[0], u[1]))


def _network(sc: Scenario) -> nx.DiGraph:
    """`flow_network` without its super-source and super-sink: the arcs one commodity runs on."""
    g = flow_network(sc)
    g.remove_nodes_from(SUPER)
    return g


def circulation(sc: Scenario) -> list[Unit]:
    """Step 1: the units of a min-cost balanced circulation through the data nodes (module doc)."""
    flows, data, g = max_flow_value(sc), sorted(n.id for n in sc.data_nodes), _network(sc)
    for d in data:
        g.add_edge(("snk", d), ("src", d), capacity=flows, weight=CLOSE)
    flow = collections.Counter({(u, v): f for u, vs in nx.min_cost_flow(g).items() for v, f in vs.items()
                                if u[0] != "snk"})
    return _decompose(flow, data)


def _bellman_ford(res: dict, sources: list) -> tuple[dict | None, dict | None]:
    """Distances from `sources` over the residual arcs that have capacity (some cost less than 0), and the
    predecessor of each node reached (None, None where a cycle of negative cost is in reach); a path passes
    through no data node other than where it starts and ends."""
    dist, pred = {u: INF for u in res}, {}
    for u in sources:
        dist[u] = 0.0
    for _ in range(len(res)):
        changed = False
        for u, arcs in res.items():
            if dist[u] < INF and u[0] != "snk" and (u[0] != "src" or u in sources):  # data nodes end a path
                for v, (cap, c) in arcs.items():
                    if cap > 0 and v[0] != "src" and dist[u] + c < dist[v] - 1e-9:
                        dist[v], pred[v], changed = dist[u] + c, u, True
        if not changed:
            return dist, pred
    return None, None  # still falling after as many rounds as nodes: a cycle of negative cost


def _push(res: dict, flow: collections.Counter, u, v) -> None:
    """One unit over the residual arc u > v: along a link, or back over a unit's step (undone)."""
    res[u][v][0] -= 1
    res[v][u][0] += 1
    if flow[(v, u)] > 0:
        flow[(v, u)] -= 1
    else:
        flow[(u, v)] += 1


def _cancel_cycles(res: dict, flow: collections.Counter) -> None:
    """Push a unit round every cycle of negative cost until none is left (what Request Change and Redirect do
    in the flow machines); no data node sends or takes back a unit more or less."""
    while True:
        g = nx.DiGraph()
        for u, arcs in res.items():
            for v, (cap, c) in arcs.items():
                if cap > 0:
                    g.add_edge(u, v, weight=c)
        g.add_edges_from(("root", u, {"weight": 0}) for u in list(g))  # every cycle reachable
        try:
            cycle = nx.find_negative_cycle(g, "root")
        except nx.NetworkXError:
            return
        for u, v in zip(cycle, cycle[1:]):
            _push(res, flow, u, v)


def handoff(sc: Scenario) -> list[Unit]:
    """Step 1 as a sequence of shortest paths (`--start handoff`): while no data node holds a unit it did not
    send, the cheapest path from any data node to any data node carries a new unit; a data node that holds one
    sends a unit on along its cheapest path to a data node that sent more than it took back.  Ends when no
    path is left, not always balanced (a unit still away from home is then given to its cheapest data node)."""
    data, res = sorted(n.id for n in sc.data_nodes), collections.defaultdict(dict)
    for u, v, arc in _network(sc).edges(data=True):
        res[u][v] = [arc.get("capacity", UNBOUNDED), arc["weight"]]
        res[v].setdefault(u, [0, -arc["weight"]])
    held, flow = dict.fromkeys(data, 0), collections.Counter()
    while True:
        holder = next((d for d in data if held[d] > 0), None)
        dist, pred = _bellman_ford(res, [("src", holder)] if holder else [("src", d) for d in data])
        if dist is None:
            _cancel_cycles(res, flow)
            continue
        end = min((("snk", d) for d in data if holder is None or held[d] < 0), key=lambda t: dist[t])
        if dist[end] == INF:
            break
        v, path = end, [end]
        while v[0] != "src":
            v = pred[v]
            path.append(v)
        for u, w in zip(path[::-1], path[-2::-1]):
            _push(res, flow, u, w)
        held[v[1]] -= 1
        held[end[1]] += 1
    return _decompose(flow, data)


def _decompose(flow: collections.Counter, data: list[str]) -> list[Unit]:
    out = collections.defaultdict(collections.Counter)
    for (u, v), f in flow.items():
        if f > 0:
            out[u][v] += f
    units = []
    for d in data:
        while any(v[0] == "in" and f > 0 for v, f in out[("src", d)].items()):
            u, path = ("src", d), []
            while u[0] != "snk":
                v = next(v for v, f in out[u].items() if f > 0)
                out[u][v] -= 1
                if v[0] == "in":
                    path.append(v[1])
                u = v
            units.append([d, path, u[1]])
    return units


def swap_suffixes(sc: Scenario, units: list[Unit]) -> None:
    """Step 2, in place: until every unit ends where it left (module doc)."""
    while True:
        best = None
        for a in (u for u in units if u[0] != u[2]):
            for b in (u for u in units if u is not a and u[0] == a[2] and u[2] != u[0]):
                now = unit_cost(sc, a) + unit_cost(sc, b)
                for j in range(1, sc.stages):
                    a2, b2 = [a[0], a[1][:j] + b[1][j:], b[2]], [b[0], b[1][:j] + a[1][j:], a[2]]
                    gain = now - unit_cost(sc, a2) - unit_cost(sc, b2)
                    if best is None or gain > best[0]:
                        best = (gain, a, b, a2, b2)
        if best is None:
            return
        _, a, b, a2, b2 = best
        a[:], b[:] = a2, b2


def exchange(sc: Scenario, units: list[Unit], data: list[str]) -> int:
    """Step 3, in place: every unit to its cheapest data node, then pairwise exchanges while one gains; returns
    how many were made."""
    units[:] = [home(sc, u[1], data) for u in units]
    made, gained = 0, True
    while gained:
        gained = False
        for a, b in itertools.combinations(units, 2):
            now = unit_cost(sc, a) + unit_cost(sc, b)
            for j in range(1, sc.stages):
                a2, b2 = home(sc, a[1][:j] + b[1][j:], data), home(sc, b[1][:j] + a[1][j:], data)
                if unit_cost(sc, a2) + unit_cost(sc, b2) < now - 1e-9:
                    a[:], b[:] = a2, b2
                    made, gained = made + 1, True
                    break
    return made


def one(setting: int, seed: int, gwtf: bool, start: str = "circulation") -> dict:
    sc = parse_scenario(flow_setting_scenario(setting, seed))
    data = sorted(n.id for n in sc.data_nodes)
    lp = optimal_routing(sc, seed=seed).extra["lp_bound_total_cost"]

    def ratio(units: list[Unit]) -> float:
        return sum(unit_cost(sc, u) for u in units) / lp

    units = circulation(sc) if start == "circulation" else handoff(sc)
    row = {"setting": setting, "seed": seed, "units": len(units), "crossed": sum(u[0] != u[2] for u in units),
           "circulation": ratio(units)}
    swap_suffixes(sc, units)
    row["away"] = sum(u[0] != u[2] for u in units)  # unbalanced (`handoff`): each to its cheapest data node
    units[:] = [u if u[0] == u[2] else home(sc, u[1], data) for u in units]
    row["swapped"] = ratio(units)
    row["exchanges"] = exchange(sc, units, data)
    row["exchanged"] = ratio(units)
    if gwtf:
        mine = [[f.data_node, list(f.path), f.data_node] for f in run_gwtf(sc, seed=seed).flows]
        row["gwtf_units"], row["gwtf"] = len(mine), ratio(mine)
        exchange(sc, mine, data)
        row["gwtf_exchanged"] = ratio(mine)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=[5, 6])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--gwtf", action="store_true", help="also the flow machines' flows, and them after exchanges")
    ap.add_argument("--start", choices=["circulation", "handoff"], default="circulation",
                    help="step 1: the min-cost balanced circulation, or shortest paths with a hand-off (module doc)")
    args = ap.parse_args(argv)
    if any(s not in (5, 6) for s in args.settings):
        print("diag_flow_circulation.py: --settings takes 5 and/or 6 (the settings with several data nodes)",
              file=sys.stderr)
        return 2
    cols = ["circulation", "swapped", "exchanged"] + (["gwtf", "gwtf_exchanged"] if args.gwtf else [])
    print("| setting | seed | units | units that end elsewhere | " + " | ".join(c + " / LP" for c in cols)
          + " | units still away after the swaps | exchanges |")
    print("|---" * (len(cols) + 6) + "|")
    for setting in args.settings:
        rows = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = one(setting, seed, args.gwtf, args.start)
            rows.append(r)
            print(f"| {setting} | {seed} | {r['units']} | {r['crossed']} | "
                  + " | ".join(f"{r[c]:.4f}" for c in cols) + f" | {r['away']} | {r['exchanges']} |", flush=True)
        print(f"| {setting} | mean (worst) | | | "
              + " | ".join(f"{statistics.mean(r[c] for r in rows):.4f} ({max(r[c] for r in rows):.4f})"
                           for c in cols) + " | | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Flow formation while relays join: one data node, N relays over S stages (setting 1's capacities and link
costs), J of them held back and joining one every E seconds from E on (`gwtf_node/sim/flowchurn.py`
`run_trickle`): a swarm whose volunteers come in one by one while the flows form.

Per seed, side by side on the same instance and joins: the flow machines as they are (a newcomer keeps the
formation waves going: flow/waves.py, "Formation waves") and without formation waves (`formation_waits` off: units
move on labels still spreading, as formation goes on once a join ends the formation waves); the flows reached
against the maximum flow, the mean cost against the optimum (networkx min-cost max-flow, everyone present), the
round of the last flow change, and messages per node over the whole run.

    python scripts/bench_flow_trickle.py                                   # 320 x 8, 10 join, seeds 0-3
    python scripts/bench_flow_trickle.py --relays 1000 --stages 16 --joins 30 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.protocol.neighbourhood import FLOW_NEIGHBOURS
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowchurn import trickle
from gwtf_node.sim.scenarios import FlowSetting, generate_layered
from gwtf_node.sim.validate import check_routing

VARIANTS = {"gwtf": {}, "no formation waves": {"formation_waits": False}}
SCALED = "scaled formation"  # `--scaled`: the flows formed by cost scaling first (protocol/flow/scaling.py)


def bench_one(relays: int, stages: int, seed: int, joins: int, every: float, rounds: int,
              neighbours: int = FLOW_NEIGHBOURS, scaled: bool = False) -> dict:
    sc = parse_scenario(generate_layered(f"trickle-{relays}x{stages}-s{seed}",
                                         FlowSetting(1, relays, stages, (1, 3), (1, 20)), seed))
    late = random.Random(20_000 + seed).sample(sorted(r.id for r in sc.relays), joins)
    opt = optimal_routing(sc)
    out = {"relays": relays, "stages": stages, "seed": seed, "joins": joins, "max_flow": opt.num_flows}
    for name, knobs in (VARIANTS | ({SCALED: {}} if scaled else {})).items():
        t = time.perf_counter()
        base = FlowConfig("-", False, 0, (), {}, {}, **knobs) if knobs else None
        run = trickle(sc, late, every, every, seed=seed, rounds=rounds, base=base, neighbours=neighbours,
                      formation="scaling" if name == SCALED else "waves")
        g = run.routing()
        check_routing(run.scenario, g)
        o = opt if len(run.scenario.links) == len(sc.links) else optimal_routing(run.scenario)
        out.setdefault("max_flow_links", {})[name] = o.num_flows
        out[name] = {"flows": g.num_flows, "vs_opt": round(g.mean_cost / o.mean_cost, 4) if g.num_flows else 0.0,
                     "optimum_over_every_link": round(o.mean_cost / opt.mean_cost, 4),
                     "converged_round": g.converged_round, "per_node": round(g.messages / len(sc.nodes), 1),
                     "wall_s": round(time.perf_counter() - t, 1)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, default=320)
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--joins", type=int, default=10, help="relays held back, joining one by one")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between joins (the first at this time)")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=120, help="at most this many rounds after the last join")
    ap.add_argument("--neighbours", type=int, default=FLOW_NEIGHBOURS, metavar="K",
                    help="bound each relay's flow links to K (the daemon's --flow-neighbours K: "
                         f"protocol/neighbourhood.py; default {FLOW_NEIGHBOURS}: every link, what the variants "
                         "compare; the daemon's auto bounds a swarm this wide to 10)")
    ap.add_argument("--scaled", action="store_true",
                    help=f"also `{SCALED}`: the flows formed by cost scaling first, the joiners added after it")
    ap.add_argument("--json", action="store_true", help="one JSON object per seed instead of the table")
    args = ap.parse_args(argv)
    if args.relays < args.stages or args.stages < 1 or not 0 <= args.joins <= args.relays - args.stages \
            or args.every <= 0:
        print("need RELAYS >= STAGES >= 1, 0 <= JOINS <= RELAYS - STAGES and --every > 0", file=sys.stderr)
        return 2
    rows = []
    variants = list(VARIANTS) + ([SCALED] if args.scaled else [])
    if not args.json:
        print(f"`python scripts/bench_flow_trickle.py --relays {args.relays} --stages {args.stages} --joins "
              f"{args.joins} --every {args.every:g} --seeds {args.seeds} --first-seed {args.first_seed}"
              f"{f' --neighbours {args.neighbours}' if args.neighbours != FLOW_NEIGHBOURS else ''}"
              f"{' --scaled' if args.scaled else ''}`\n")
        print("| seed | max flow | " + " | ".join(f"{v}: flows, GWTF / optimum, converged round, per node"
                                                   for v in variants) + " |")
        print("|---|---|" + "---|" * len(variants))
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        r = bench_one(args.relays, args.stages, seed, args.joins, args.every, args.rounds, args.neighbours, args.scaled)
        rows.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
            continue
        print(f"| {seed} | {r['max_flow']} | " + " | ".join(
            f"{r[v]['flows']}, {r[v]['vs_opt']:.4f}, {r[v]['converged_round']}, {r[v]['per_node']:.0f}"
            for v in variants) + " |", flush=True)
    if not args.json:
        for v in variants:
            print(f"\n{v}: max flow reached {sum(r[v]['flows'] >= r['max_flow_links'][v] for r in rows)}/{len(rows)} "
                  f"(over every link {sum(r[v]['flows'] >= r['max_flow'] for r in rows)}/{len(rows)}), "
                  f"messages per node (mean) {statistics.mean(r[v]['per_node'] for r in rows):.0f}", end="")
        a, b = list(VARIANTS)
        ratio = statistics.mean(r[a]["per_node"] for r in rows) / statistics.mean(r[b]["per_node"] for r in rows)
        print(f"\nmessages per node, {a} / {b}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

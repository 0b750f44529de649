#!/usr/bin/env python3
"""Label waves over slow links: the flow machines with message delays unrelated to the links' costs.

One data node and S stages of k relays of capacity 1 (the shape of a daemon swarm with one data node and k
microbatches an iteration: `bench_swarm_size.py --data-nodes 1`), setting 1's link costs (1-20); each link's
one-way delays drawn uniformly from each `--delays LO-HI` range (milliseconds; `none`: equal to the link's cost
in milliseconds, as in every generated scenario), the way a loaded host's event loops delay the daemon's
messages whatever the links cost (`sim/scenarios.py` `delayed_layered`).  Per range and seed: the flows placed
against the maximum flow, their cost against the optimum (networkx min-cost max-flow), the round of the last
flow change and the messages per node, over `--rounds` rounds with no early stop (a wave over slow links can
be quiet for many rounds and still place units).  Label waves over every link, what it measures: at 11 relays
a stage the daemon forms by cost scaling over K = 10 links (protocol/neighbourhood.py, auto).

    python scripts/bench_flow_delays.py                      # 9 x 11, seeds 0-2, none 50-200 100-1000 200-3000
    python scripts/bench_flow_delays.py --stages 5 --per-stage 11 --delays 50-200 --seeds 5 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import delayed_layered, parse_delay_range



def bench_one(stages: int, per_stage: int, delay_ms, seed: int, rounds: int) -> dict:
    sc = delayed_layered(stages, per_stage, delay_ms, seed)
    res = run_gwtf(sc, seed=seed, rounds=rounds, quiet_rounds=rounds, formation="waves", neighbours=0)
    opt = optimal_routing(sc, seed)
    return {"stages": stages, "per_stage": per_stage, "seed": seed,
            "delay_ms": "none" if delay_ms is None else f"{delay_ms[0]:g}-{delay_ms[1]:g}",
            "max_flow": opt.num_flows, "flows": res.num_flows,
            "vs_opt": round(res.total_cost / opt.total_cost, 4) if res.num_flows == opt.num_flows else None,
            "converged_round": res.converged_round, "per_node": round(res.messages / len(sc.nodes), 1),
            "inconsistent_links": res.extra["inconsistent_links"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=9)
    ap.add_argument("--per-stage", type=int, default=11, help="relays a stage (k), and the data node's demand")
    ap.add_argument("--delays", type=parse_delay_range, nargs="+",
                    default=[None, (50.0, 200.0), (100.0, 1000.0), (200.0, 3000.0)], metavar="LO-HI")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    a = ap.parse_args(argv)
    if a.stages < 1 or a.per_stage < 1 or a.seeds < 1 or a.rounds < 1:
        print("bench_flow_delays: --stages, --per-stage, --seeds and --rounds must be positive", file=sys.stderr)
        return 2
    if not a.json:
        print(f"`python scripts/bench_flow_delays.py --stages {a.stages} --per-stage {a.per_stage} --seeds {a.seeds} "
              f"--first-seed {a.first_seed} --rounds {a.rounds}`\n")
        print("| one-way delays (ms) | seed | flows / max flow | GWTF / optimum | converged round | messages per node |")
        print("|---|---|---|---|---|---|")
    for delay in a.delays:
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            r = bench_one(a.stages, a.per_stage, delay, seed, a.rounds)
            if a.json:
                print(json.dumps(r), flush=True)
            else:
                ratio = "-" if r["vs_opt"] is None else f"{r['vs_opt']:.4f}"
                print(f"| {r['delay_ms']} | {seed} | {r['flows']} / {r['max_flow']} | {ratio} | "
                      f"{r['converged_round']} | {r['per_node']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Flow re-formation after false deaths: relays presumed dead and taken back, one after the other.

A daemon swarm on a loaded host presumes live relays dead (their Pongs late) and takes them back a few seconds
later: every such *flap* removes the relay from its neighbours' flow machines, with the units through it, and adds
it again (`FlowRun.partition`, then `heal`: the daemon's partition, tests/lab/test_partition_lab.py).  The flows
re-form after each.  This benchmark builds the shape of a daemon swarm with one data node (`sim/scenarios.py`
`delayed_layered`: 1 + S x k relays of capacity 1, setting 1's link costs, each link's one-way delays drawn from
`--delays LO-HI` ms, as a loaded host's event loops delay the messages), lets the flows form, flaps `--flaps`
random relays `--gap` seconds apart (each detected after `--detect` s, as the liveness deadline does), runs
`--rounds` rounds more, and reports, side by side for `FlowConfig.reform_free_back` on (the default) and off:

* flows: units placed at the end against the maximum flow (every relay is back, so the maximum flow is k);
* cost: the flows' cost against the optimum (networkx min-cost max-flow), where they reach the maximum flow;
* msgs/node: messages from the first flap to the end, per node;
* settled: rounds from the last heal to the last flow change;
* negative: relays whose OUT label is below 0 at the end (the flows hold a negative cycle: with link costs > 0 a
  distance to the sink below 0 exists only through one).

The flows are formed by label waves over every link, as they are measured here (at 11 relays a stage the daemon
forms them by cost scaling over K = 10 links: protocol/neighbourhood.py, auto).

    python scripts/bench_flow_flaps.py                         # 9 x 11, 50-200 ms, 6 flaps 3 s apart, seeds 0-4
    python scripts/bench_flow_flaps.py --delays 100-1000 --flaps 10 --seeds 3 --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowchurn import FlowRun
from gwtf_node.sim.flowsim import extract_flows
from gwtf_node.sim.scenarios import delayed_layered, parse_delay_range



def flap_run(stages: int, per_stage: int, delay_ms, seed: int, flaps: int, gap_s: float, detect_s: float,
             rounds: int, free_back: bool) -> dict:
    """One run: form, flap, run on; the figures of the module doc."""
    sc = delayed_layered(stages, per_stage, delay_ms, seed)
    base = None if free_back else FlowConfig("-", False, 0, (), {}, {}, reform_free_back=False)
    t = time.perf_counter()
    run = FlowRun(sc, seed, base=base, formation="waves", neighbours=0)
    run.run_quiet(600)
    d = sc.data_nodes[0].id
    formed = len(extract_flows(run.scenario, run.nodes)[0])
    relays = sorted(n for n in run.nodes if n != d)
    rng = random.Random(10_000 + seed)
    msgs0, t_heal = run.sim.stats.messages, run.sim.now
    for _ in range(flaps):
        v = rng.choice(relays)
        run.partition(v, detect_s=detect_s)
        run.heal(v)
        t_heal = run.sim.now
        run.sim.run_until(run.sim.now + gap_s)
    run.sim.run_until(run.sim.now + rounds * run.round_s)
    flows, _ = extract_flows(run.scenario, run.nodes)
    opt = optimal_routing(sc, seed)
    cost = sum(f.cost for f in flows)
    labels = [m.labels.my_out.get(d) for nid, m in run.nodes.items() if nid != d]
    return {"seed": seed, "free_back": free_back, "formed": formed, "flows": len(flows), "max_flow": opt.num_flows,
            "vs_opt": round(cost / opt.total_cost, 4) if len(flows) == opt.num_flows else None,
            "msgs_per_node": round((run.sim.stats.messages - msgs0) / len(sc.nodes), 1),
            "settled_rounds": round(max(0.0, run.last_change() - t_heal) / run.round_s, 1),
            "negative": sum(1 for lab in labels if lab is not None and lab.cost < 0),
            "wall_s": round(time.perf_counter() - t, 1)}


def summary(rs: list[dict]) -> str:
    whole = [r for r in rs if r["flows"] == r["max_flow"]]
    costs = [r["vs_opt"] for r in whole]
    return (f"{len(whole)}/{len(rs)} | " + (f"{statistics.mean(costs):.4f}, {max(costs):.4f}" if costs else "-")
            + f" | {statistics.mean(r['msgs_per_node'] for r in rs):.0f} | "
            f"{statistics.mean(r['settled_rounds'] for r in rs):.1f} | {sum(r['negative'] > 0 for r in rs)}/{len(rs)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=9)
    ap.add_argument("--per-stage", type=int, default=11)
    ap.add_argument("--delays", type=parse_delay_range, default=(50.0, 200.0), metavar="LO-HI",
                    help="one-way delays in ms (none: equal to the link's cost)")
    ap.add_argument("--flaps", type=int, default=6)
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between one relay's return and the next flap")
    ap.add_argument("--detect", type=float, default=6.0, help="seconds from a flap to its detection")
    ap.add_argument("--rounds", type=int, default=300, help="rounds run after the last flap")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    args = ap.parse_args(argv)
    if args.stages < 1 or args.per_stage < 1 or args.flaps < 0 or args.seeds < 1 or args.rounds < 1:
        print("--stages, --per-stage, --seeds and --rounds must be at least 1, --flaps at least 0", file=sys.stderr)
        return 2
    both: dict[bool, list[dict]] = {True: [], False: []}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for free_back in (True, False):
            r = flap_run(args.stages, args.per_stage, args.delays, seed, args.flaps, args.gap, args.detect,
                         args.rounds, free_back)
            both[free_back].append(r)
            if args.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"seed {seed} free_back={free_back}: {r}", file=sys.stderr, flush=True)
    if not args.json:
        delays = "none" if args.delays is None else f"{args.delays[0]:g}-{args.delays[1]:g}"
        print(f"1 + {args.stages} x {args.per_stage}, delays {delays} ms, {args.flaps} flaps {args.gap:g} s apart, "
              f"seeds {args.first_seed}-{args.first_seed + args.seeds - 1}\n")
        print("| hand-back after a change | max flow reached | GWTF / optimum (mean, worst) | msgs/node after the "
              "first flap | rounds from the last heal to the last change | runs ending with negative labels |")
        print("|---|---|---|---|---|---|")
        print(f"| free (`reform_free_back`, default) | {summary(both[True])} |")
        print(f"| minus its link's cost | {summary(both[False])} |")
        on, off = (statistics.mean(r["msgs_per_node"] for r in both[v]) for v in (True, False))
        print(f"\nmessages after the first flap, free / minus its cost: {on / off:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Flow-routing benchmark: GWTF against the optimum and SWARM (Figure 7 of the paper).

For each flow-test setting of Table V and each seed, the three policies route
the same scenario in the same run:

* number of flows reached against the maximum flow,
* mean cost per microbatch against the optimum (networkx min-cost max-flow
  for one data node; the multi-commodity LP bound, scipy HiGHS, for 5-6),
* the same against SWARM's greedy routing,
* rounds to converge, messages per node and wall time of the simulation.

Writes a markdown table and a bar plot (docs/bench_flow.md, docs/bench_flow.png
by default; in a page that has the table's markers only the table is replaced)
and prints the table.  `--scale` adds the 1,000 relays x 16
stages instance.

    python scripts/bench_flow.py                 # settings 1-6 x 10 seeds
    python scripts/bench_flow.py --settings 1 5 --seeds 3
    python scripts/bench_flow.py --settings 5 6 --seeds 20 --first-seed 100   # held-out seeds
    python scripts/bench_flow.py --settings 5 6 --seeds 20 --first-seed 200 --pooled --out /tmp/pooled
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing, swarm_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.pooled import run_pooled
from gwtf_node.sim.scenarios import FlowSetting, generate_layered, load_flow_setting
from gwtf_node.sim.validate import check_routing


BEGIN, END = "<!-- table written by scripts/bench_flow.py -->", "<!-- end of table -->"


MOVES = {"default": None, "off": {"improve": False}, "greedy": {"improve": True},
         "anneal": {"improve": True, "anneal": True}}


def bench_one(scenario, seed: int, rounds: int, moves: str = "default", label_limits: bool = False,
              cycles: int | None = None, pooled: bool = False) -> dict:
    extra = {} if cycles is None else {"cycles": cycles}
    base = None if MOVES[moves] is None and not label_limits and not extra else \
        FlowConfig("-", False, 0, (), {}, {}, label_limits=label_limits, **(MOVES[moves] or {}), **extra)
    t = time.perf_counter()
    if pooled and len(scenario.data_nodes) > 1:
        g = run_pooled(scenario, seed=seed, rounds=rounds, base=base)
    else:
        g = run_gwtf(scenario, seed=seed, rounds=rounds, base=base)
    wall = time.perf_counter() - t
    check_routing(scenario, g)
    o = optimal_routing(scenario, seed=seed)
    s = swarm_routing(scenario, seed=seed)
    opt_mean = o.extra.get("lp_bound_mean_cost", o.mean_cost)
    max_flow = int(round(o.extra.get("lp_max_flow", o.num_flows)))
    return {
        "flows": g.num_flows, "max_flow": max_flow, "swarm_flows": s.num_flows,
        "gwtf_mean": g.mean_cost, "opt_mean": opt_mean, "swarm_mean": s.mean_cost,
        "vs_opt": g.mean_cost / opt_mean if opt_mean else 1.0,
        "vs_swarm": g.mean_cost / s.mean_cost if s.mean_cost else 1.0,
        "converged_round": g.converged_round, "rounds": g.rounds,
        "msgs_per_node": g.messages / len(scenario.nodes), "wall_s": wall,
        "inconsistent": g.extra.get("inconsistent_links", g.extra.get("unrouted_relays")),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--seeds", type=int, default=10,
                    help="instances per setting: seeds first-seed ... first-seed + seeds - 1")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the first seed (held-out seeds for settings 5-6: 100, docs/bench_flow.md)")
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--moves", choices=sorted(MOVES), default="default",
                    help="Request Change/Redirect: FlowConfig's default (on with several data nodes), off, greedy "
                         "all the time, or all the time with worse moves taken by annealing")
    ap.add_argument("--anneal", action="store_true", help="the same as --moves anneal")
    ap.add_argument("--scale", action="store_true", help="add 1,000 relays x 16 stages (one data node)")
    ap.add_argument("--label-limits", action="store_true", help="FlowConfig.label_limits on (flow/limits.py)")
    ap.add_argument("--cycles", type=int, default=None, metavar="TRIALS",
                    help="FlowConfig.cycles: on, with this many trials per data node (several data nodes, flow/cycles.py)")
    ap.add_argument("--pooled", action="store_true",
                    help="several data nodes: pooled formation, then homing (sim/pooled.py, protocol/flow/pool.py)")
    ap.add_argument("--out", default="docs/bench_flow", help="path prefix of the .md and .png written")
    args = ap.parse_args(argv)

    moves = "anneal" if args.anneal else args.moves
    rows = []
    per_setting: dict[int, list[dict]] = {}
    for setting in args.settings:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = bench_one(load_flow_setting(setting, seed), seed, args.rounds, moves, args.label_limits, args.cycles,
                          args.pooled)
            r.update(setting=setting, seed=seed)
            per_setting.setdefault(setting, []).append(r)
            print(f"setting {setting} seed {seed}: flows {r['flows']}/{r['max_flow']}  "
                  f"gwtf/opt {r['vs_opt']:.4f}  gwtf/swarm {r['vs_swarm']:.4f}  "
                  f"converged round {r['converged_round']}  {r['wall_s']:.2f}s", file=sys.stderr, flush=True)
            rows.append(r)

    lines = [
        "| setting | instances | max flow reached | GWTF / optimum (mean, worst) | GWTF / SWARM (mean, worst) "
        "| beats SWARM | converged round (mean, max) | messages per node | wall s (mean, max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, rs in per_setting.items():
        reach = sum(r["flows"] >= r["max_flow"] for r in rs)
        beats = sum(r["gwtf_mean"] < r["swarm_mean"] - 1e-9 for r in rs)
        lines.append(
            f"| {setting}{' (LP bound)' if setting >= 5 else ''} | {len(rs)} | {reach}/{len(rs)} "
            f"| {statistics.mean(r['vs_opt'] for r in rs):.4f}, {max(r['vs_opt'] for r in rs):.4f} "
            f"| {statistics.mean(r['vs_swarm'] for r in rs):.4f}, {max(r['vs_swarm'] for r in rs):.4f} "
            f"| {beats}/{len(rs)} "
            f"| {statistics.mean(r['converged_round'] for r in rs):.1f}, {max(r['converged_round'] for r in rs)} "
            f"| {statistics.mean(r['msgs_per_node'] for r in rs):.0f} "
            f"| {statistics.mean(r['wall_s'] for r in rs):.2f}, {max(r['wall_s'] for r in rs):.2f} |")
    if args.scale:
        sc = parse_scenario(generate_layered("scale-1000x16", FlowSetting(1, 1000, 16, (1, 3), (1, 20)), 0))
        r = bench_one(sc, 0, args.rounds, moves, args.label_limits)
        lines.append(
            f"| 1000 relays x 16 stages | 1 | {int(r['flows'] >= r['max_flow'])}/1 | {r['vs_opt']:.4f} "
            f"| {r['vs_swarm']:.4f} | {int(r['gwtf_mean'] < r['swarm_mean'])}/1 | {r['converged_round']} "
            f"| {r['msgs_per_node']:.0f} | {r['wall_s']:.2f} |")
    table = "\n".join(lines)
    print(table)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python scripts/bench_flow.py " + " ".join(argv if argv is not None else sys.argv[1:])
    block = f"{BEGIN}\nMeasured with `{cmd.strip()}`\n\n{table}\n{END}"
    md = out.with_suffix(".md")
    text = md.read_text() if md.exists() else ""
    if BEGIN in text and END in text:  # replace the table, keep the rest of the page
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = block + "\n"
    md.write_text(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return 0
    settings = list(per_setting)
    width = 0.27
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, (key, label) in enumerate((("opt_mean", "optimum / LP bound"), ("gwtf_mean", "GWTF"),
                                      ("swarm_mean", "SWARM"))):
        means = [statistics.mean(r[key] for r in per_setting[s]) for s in settings]
        sds = [statistics.pstdev(r[key] for r in per_setting[s]) for s in settings]
        ax.bar([i + (k - 1) * width for i in range(len(settings))], means, width, yerr=sds, label=label, capsize=2)
    ax.set_xticks(range(len(settings)), [f"setting {s}" for s in settings])
    ax.set_ylabel("average cost per microbatch")
    ax.set_title(f"Flow tests (Table V), {args.seeds} seeds each")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())

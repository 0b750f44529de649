#!/usr/bin/env python3
"""Table VI of the GWTF paper in the simulator: GWTF's flows against DT-FM's and OP-Fence's schedules, as the
swarm grows, with and without churn.

    nice -n 10 python scripts/bench_optimality.py [--setting table6|geo12] [--scales 1 2 4 8] [--seeds 3]
        [--iterations 5] [--json [--first-seed N]]

Setting (`sim.train.make_table6`): 3 x K data nodes and 3 x K relays in each
of the 5 relay stages (the paper's 6 stages counting the data nodes'), every
relay of capacity 4 (homogeneous), 4 microbatches per data node and
iteration, every node at one of the 12 locations of geo12-links.json; K = 1
is the paper's setting, `--scales 4 8` the big variants (slow: the flow
machines of 72 / 144 nodes run in the simulator; at 144 nodes a GWTF run
placed by its leader takes most of an hour, so `--systems gwtf_swarm dtfm
dtfm_pinned --json` leaves out the GWTF runs that take hours).  `--setting geo12`
(`sim.train.make_geo12`, the same counts and names): the 12 locations grouped in
their three regions (Europe, North America, Asia-Pacific), each region
holding a third of the data nodes and of the relays, so the bandwidth
clusters that OP-Fence looks for are there; the stages the setting gives the
relays ignore the regions.

Each (K, churn, seed) runs the same simulator three times
(`gwtf_node.sim.train.run_train`):

* `gwtf`: the flow machines form the flows and re-form them after crashes
  (the daemon's behaviour);
* `dtfm`: DT-FM's scheduler (`gwtf_node/sim/schedule/`) places every relay in
  a stage and forms the pipelines; the simulator routes along them
  (`--routing dtfm`) and recomputes after each membership change, the
  scheduler's CPU time as the delay;
* `dtfm_pinned`: DT-FM's pipelines over GWTF's placement (every relay keeps
  its given stage): the routing half of its schedule, on equal terms with
  GWTF, whose relays cannot choose their stage;
* `gwtf_swarm`: GWTF's flows over the placement its leader gives a swarm
  forming from scratch (`protocol/swarmplace.py`: every relay placed at once
  by the flows its links make possible; `run_train(placement="swarm")`);
* `gwtf_placed`: GWTF's flows over DT-FM's placement (every relay in the
  stage DT-FM's search gave it, `run_train(placement="dtfm")`): the other
  way to put the two routings on equal terms;
* `opfence`: FusionLLM's OP-Fence (`gwtf_node/sim/schedule/opfence.py`:
  Louvain clusters of the bandwidth graph, connected runs of stages per
  cluster) places the relays and forms one fixed pipeline per data node; the
  simulator routes along them as DT-FM's (`--routing dtfm`, the method
  `opfence`), recomputed after each membership change with OP-Fence's CPU
  time as the delay;
* `gwtf_opfence`: GWTF's flows over OP-Fence's placement
  (`run_train(placement="opfence")`): against `gwtf_swarm`, two placements
  under the same routing.

Scheduler cost: GWTF's flow machines' CPU time summed over all nodes (the
whole run; and up to the flows formed), their messages and the virtual time
until every data node had its flows (rounds of 1 s); the CPU time of the
leader's whole-swarm placement (`gwtf_swarm`, once per run); DT-FM's genetic
algorithm's generations, cost-model evaluations and CPU time, times the
number of schedules computed in the run; OP-Fence's CPU time (Louvain,
runs, chaining) per schedule and times the schedules of the `opfence` run.

`--json` prints one object per (setting, churn) with `gwtf`, `gwtf_swarm`,
`dtfm`, `dtfm_pinned`, `gwtf_placed`, `opfence` and `gwtf_opfence`, each
holding `time_per_microbatch_s`, `throughput_per_iteration` and
`scheduler_cpu_s` (means over the seeds); without it a table is printed
and written to docs/bench_optimality.md (everything from a "## Reading"
heading of the existing file on is kept).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from gwtf_node.sim.schedule import GENERATIONS, POPULATION
from gwtf_node.sim.train import run_train

ROOT = Path(__file__).resolve().parent.parent
PAPER = {"dtfm": (0.44, 9.0), "gwtf": (0.51, 8.08)}  # Table VI: time per microbatch, throughput per iteration
SYSTEMS = ("gwtf", "gwtf_swarm", "dtfm", "dtfm_pinned", "gwtf_placed", "opfence", "gwtf_opfence")
NAMES = ("GWTF", "GWTF swarm-placed", "DT-FM", "DT-FM pinned", "GWTF placed by DT-FM", "OP-Fence",
         "GWTF placed by OP-Fence")
SETTINGS = ("table6", "geo12")


def _mean(vals) -> float:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    return statistics.fmean(vals) if vals else math.nan


def run_one(scale: int, churn: float, seed: int, iterations: int, dtfm_opts: dict,
            systems: tuple[str, ...] = SYSTEMS, family: str = "table6", flow_neighbours: int | None = None,
            pooled: bool = False) -> dict:
    setting = f"{family}-x{scale}"
    out = {}
    fk = {"flow_neighbours": flow_neighbours, "pooled_formation": pooled}  # GWTF's flow machines (neighbourhood.py)
    if "gwtf" in systems:
        g = run_train(setting, "gwtf", churn, iterations, seed, scheduler_cost=True, **fk)
        form = g["flow_formation"]
        out["gwtf"] = {"time_per_microbatch_s": g["time_per_microbatch_s"],
                       "throughput_per_iteration": g["throughput_per_iteration"],
                       "scheduler_cpu_s": g["flow_cpu_s"], "formation_cpu_s": form.get("flow_cpu_s", math.nan),
                       "formation_rounds": form.get("formed_s", math.nan), "flow_messages": g["flow_messages"],
                       "formation_messages": form.get("flow_messages", math.nan),
                       "lost_microbatches": g["lost_microbatches"], "crashes": g["crashes"]}
    if "gwtf_swarm" in systems:
        w = run_train(setting, "gwtf", churn, iterations, seed, placement="swarm", scheduler_cost=True, **fk)
        place_cpu = w["placement_cpu_s"]
        out["gwtf_swarm"] = {"time_per_microbatch_s": w["time_per_microbatch_s"],
                             "throughput_per_iteration": w["throughput_per_iteration"], "placement_cpu_s": place_cpu,
                             "scheduler_cpu_s": place_cpu + w["flow_cpu_s"], "flow_messages": w["flow_messages"],
                             "formed_s": w["flow_formation"].get("formed_s", math.nan),
                             "lost_microbatches": w["lost_microbatches"], "crashes": w["crashes"]}
    if "gwtf_placed" in systems:
        p = run_train(setting, "gwtf", churn, iterations, seed, placement="dtfm", dtfm_options=dict(dtfm_opts), **fk)
        out["gwtf_placed"] = {"time_per_microbatch_s": p["time_per_microbatch_s"],
                              "throughput_per_iteration": p["throughput_per_iteration"],
                              "lost_microbatches": p["lost_microbatches"], "crashes": p["crashes"]}
    if "gwtf_opfence" in systems:
        o = run_train(setting, "gwtf", churn, iterations, seed, placement="opfence", scheduler_cost=True, **fk)
        out["gwtf_opfence"] = {"time_per_microbatch_s": o["time_per_microbatch_s"],
                               "throughput_per_iteration": o["throughput_per_iteration"],
                               "placement_cpu_s": o["placement_cpu_s"],
                               "scheduler_cpu_s": o["placement_cpu_s"] + o["flow_cpu_s"],
                               "flow_messages": o["flow_messages"], "lost_microbatches": o["lost_microbatches"],
                               "crashes": o["crashes"]}
    if "opfence" in systems:
        f = run_train(setting, "gwtf", churn, iterations, seed, routing="dtfm", dtfm_options={"method": "opfence"})
        sch = f["dtfm"]
        out["opfence"] = {"time_per_microbatch_s": f["time_per_microbatch_s"],
                          "throughput_per_iteration": f["throughput_per_iteration"],
                          "scheduler_cpu_s": sch["cpu_s"] * (1 + sch["recomputations"]), "search_cpu_s": sch["cpu_s"],
                          "recomputations": sch["recomputations"], "clusters": len(sch["clusters"]),
                          "cost_model_s": sch["total_cost_s"], "lost_microbatches": f["lost_microbatches"],
                          "crashes": f["crashes"]}
    for name, place in (("dtfm", True), ("dtfm_pinned", False)):
        if name not in systems:
            continue
        d = run_train(setting, "gwtf", churn, iterations, seed, routing="dtfm",
                      dtfm_options=dict(dtfm_opts, place=place))
        sch = d["dtfm"]
        out[name] = {"time_per_microbatch_s": d["time_per_microbatch_s"],
                     "throughput_per_iteration": d["throughput_per_iteration"],
                     "scheduler_cpu_s": sch["cpu_s"] * (1 + sch["recomputations"]), "search_cpu_s": sch["cpu_s"],
                     "generations": sch["generations"], "evaluations": sch["evaluations"],
                     "recomputations": sch["recomputations"], "cost_model_s": sch["total_cost_s"],
                     "lost_microbatches": d["lost_microbatches"], "crashes": d["crashes"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", choices=SETTINGS, nargs="+", default=["table6"],
                    help="table6: every node at one of the 12 locations (Table VI); geo12: the same counts dealt "
                         "to the three regions of the 12 locations in equal thirds (bandwidth clusters)")
    ap.add_argument("--scales", type=int, nargs="+", default=[1], choices=[1, 2, 4, 8],
                    help="swarm sizes, times the paper's 18 nodes (default 1; 2 takes minutes, 4 and 8 long)")
    ap.add_argument("--churns", type=float, nargs="+", default=[0.0, 0.1])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="run seeds FIRST_SEED .. FIRST_SEED + SEEDS - 1 (held-out seeds; with --json only)")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--generations", type=int, default=GENERATIONS, help="DT-FM's genetic algorithm")
    ap.add_argument("--population", type=int, default=POPULATION, help="DT-FM's genetic algorithm")
    ap.add_argument("--flow-neighbours", type=int, default=None, metavar="K",
                    help="GWTF's flow machines link each relay to its K cheapest relays of each adjacent stage "
                         "(protocol/neighbourhood.py; 0: every one; default auto, the daemon's)")
    ap.add_argument("--pooled-formation", action="store_true",
                    help="GWTF's flow machines form the flows of several data nodes as one commodity first, then "
                         "send each unit home (sim/train/pooling.py; the daemon's join --pooled-formation, off)")
    ap.add_argument("--json", action="store_true", help="one JSON object per setting and churn level, no docs")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                    help="run only these (with --json: the docs table needs all of them)")
    ap.add_argument("--scenario-out", metavar="FILE",
                    help="write the first --setting at scale 1, seed 0 (table6-x1 by default: the paper's) as a "
                         "scenario file for `gwtf-node sim schedule` and stop")
    args = ap.parse_args()
    if set(args.systems) != set(SYSTEMS) and not args.json and not args.scenario_out:
        ap.error("--systems runs a subset of the systems: add --json (the docs table shows all of them)")
    if args.first_seed and not args.json:
        ap.error("--first-seed runs other seeds than the docs table's: add --json")
    if args.scenario_out:
        from gwtf_node.sim.schedule.problems import setting_scenario
        from gwtf_node.sim.train import make_setting

        Path(args.scenario_out).write_text(json.dumps(setting_scenario(make_setting(f"{args.setting[0]}-x1", 0)),
                                                     indent=None))
        return 0
    t0 = time.time()
    dtfm_opts = {"generations": args.generations, "population": args.population}
    rows = []
    for family, scale in ((f, k) for f in args.setting for k in args.scales):
        for churn in args.churns:
            runs = [run_one(scale, churn, s, args.iterations, dtfm_opts, tuple(args.systems), family,
                            args.flow_neighbours, args.pooled_formation)
                    for s in range(args.first_seed, args.first_seed + args.seeds)]
            row = {"setting": f"{family}-x{scale}", "nodes": 18 * scale, "churn": churn, "seeds": args.seeds,
                   "first_seed": args.first_seed,
                   "iterations": args.iterations}
            for sysname in (s for s in SYSTEMS if s in args.systems):
                row[sysname] = {k: _mean([r[sysname][k] for r in runs]) for k in runs[0][sysname]}
                row[sysname]["per_seed_time_per_microbatch_s"] = [r[sysname]["time_per_microbatch_s"] for r in runs]
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{family}-x{scale} churn {churn:g}: " + "  ".join(
                    f"{s} {row[s]['time_per_microbatch_s']:.2f} s" for s in SYSTEMS), file=sys.stderr, flush=True)
    if args.json:
        return 0
    text = render(rows, args, time.time() - t0)
    print(text)
    md = ROOT / "docs" / "bench_optimality.md"
    keep = ""
    if md.exists() and "\n## Reading" in md.read_text():
        keep = "\n## Reading" + md.read_text().split("\n## Reading", 1)[1].rstrip("\n") + "\n"
    md.write_text(text + keep)
    return 0


def render(rows: list[dict], args, elapsed: float) -> str:
    cmd = (f"nice -n 10 python scripts/bench_optimality.py --setting {' '.join(args.setting)} "
           f"--scales {' '.join(map(str, args.scales))} "
           f"--churns {' '.join(f'{c:g}' for c in args.churns)} --seeds {args.seeds} --iterations {args.iterations}"
           + (f" --generations {args.generations}" if args.generations != GENERATIONS else "")
           + (f" --population {args.population}" if args.population != POPULATION else ""))
    pairs = (("gwtf_swarm", "dtfm"), ("gwtf", "dtfm"), ("gwtf", "dtfm_pinned"), ("gwtf_placed", "dtfm"),
             ("opfence", "dtfm"), ("gwtf_swarm", "opfence"), ("gwtf_swarm", "gwtf_opfence"),
             ("gwtf_opfence", "opfence"))
    label = dict(zip(SYSTEMS, NAMES))
    out = ["# Optimality: GWTF against DT-FM's and OP-Fence's schedules (Table VI of the GWTF paper)\n",
           f"`{cmd}` ({elapsed:.0f} s on 2 cores shared with other jobs). Setting, systems and scheduler costs: the "
           "docstring of `scripts/bench_optimality.py`; DT-FM: `gwtf_node/sim/schedule/`; OP-Fence: "
           "`gwtf_node/sim/schedule/opfence.py`. Means over seeds "
           f"0-{args.seeds - 1} of each run's mean over its iterations; time per microbatch in seconds of virtual "
           "time (iteration length, aggregation included, over microbatches completed); throughput in microbatches "
           "completed per iteration (12 x K pushed).\n",
           "## Time per microbatch and throughput\n",
           "| setting | nodes | churn | " + " | ".join(f"{n} s/microb" for n in NAMES) + " | "
           + " | ".join(f"{label[a]} vs {label[b]}" for a, b in pairs) + " | throughput / it (in the same order) |",
           "|---" * (4 + len(SYSTEMS) + len(pairs)) + "|"]

    def vs(a: dict, b: dict) -> str:
        return f"{(a['time_per_microbatch_s'] / b['time_per_microbatch_s'] - 1) * 100:+.0f}%"
    for r in rows:
        out.append(f"| {r['setting']} | {r['nodes']} | {int(r['churn'] * 100)}% | "
                   + " | ".join(f"{r[s]['time_per_microbatch_s']:.2f}" for s in SYSTEMS) + " | "
                   + " | ".join(vs(r[a], r[b]) for a, b in pairs) + " | "
                   + " / ".join(f"{r[s]['throughput_per_iteration']:.0f}" for s in SYSTEMS) + " |")
    out += ["", f"The paper (Table VI, its own simulator, the 18-node setting, no churn): DT-FM {PAPER['dtfm'][0]} "
            f"and GWTF {PAPER['gwtf'][0]} per microbatch (GWTF +{(PAPER['gwtf'][0] / PAPER['dtfm'][0] - 1) * 100:.0f}%), "
            f"throughput {PAPER['dtfm'][1]} and {PAPER['gwtf'][1]} per iteration.\n",
            f"Per seed, time per microbatch (s), {' / '.join(NAMES)}:\n"]
    for r in rows:
        per = zip(*(r[s]["per_seed_time_per_microbatch_s"] for s in SYSTEMS))
        out.append(f"- {r['setting']} {int(r['churn'] * 100)}%: " + "; ".join(" / ".join(f"{v:.1f}" for v in t)
                                                                          for t in per))
    out += ["\n## What each scheduler costs as the swarm grows\n",
            "| setting | nodes | churn | GWTF flows formed (rounds of 1 s) | GWTF messages to form | GWTF messages "
            "(run) | GWTF flow CPU s (run, all nodes) | GWTF whole-swarm placement CPU s | DT-FM generations | "
            "DT-FM evaluations | DT-FM search CPU s | DT-FM schedules computed | DT-FM scheduler CPU s (run) | "
            "OP-Fence clusters | OP-Fence CPU s | OP-Fence schedules computed | OP-Fence scheduler CPU s (run) | "
            "crashes |",
            "|---" * 18 + "|"]
    for r in rows:
        g, d, f = r["gwtf"], r["dtfm"], r["opfence"]
        out.append(f"| {r['setting']} | {r['nodes']} | {int(r['churn'] * 100)}% | {g['formation_rounds']:.0f} | "
                   f"{g['formation_messages']:.0f} | {g['flow_messages']:.0f} | {g['scheduler_cpu_s']:.2f} | "
                   f"{r['gwtf_swarm']['placement_cpu_s']:.3f} | "
                   f"{d['generations']:.0f} | {d['evaluations']:.0f} | {d['search_cpu_s']:.2f} | "
                   f"{1 + d['recomputations']:.1f} | {d['scheduler_cpu_s']:.2f} | {f['clusters']:.1f} | "
                   f"{f['search_cpu_s']:.4f} | {1 + f['recomputations']:.1f} | {f['scheduler_cpu_s']:.3f} | "
                   f"{g['crashes']:.1f} |")
    out += ["", "Lost microbatches (all runs): " + ", ".join(
        f"{r['setting']} {int(r['churn'] * 100)}% " + "/".join(f"{r[s]['lost_microbatches']:.0f}" for s in SYSTEMS)
        for r in rows) + f" ({' / '.join(NAMES)}).\n"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Spot check of the node-addition optimum by MILP (`gwtf_node.sim.join.milp_optimum`).

For each (setting, seed): the policies as in the bench, the proved LP bound
(`optimum_bound`), then the Dinkelbach MILP started from the best assignment
found, each solve stopped after --time-limit seconds.  Prints one line per
instance and writes a markdown table: the best improvement known (MILP or
local search), the MILP's proved upper bound and the LP's, next to GWTF,
highest-capacity-first and random.  Minutes per instance: run it on a sample.

    python scripts/join_exact.py --instances 1:0 4:0 --time-limit 120
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gwtf_node.sim.join import FlowModel, generate_join, milp_optimum, run_join


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", nargs="+", required=True, help="setting:seed, e.g. 1:0")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per MILP solve")
    ap.add_argument("--rounds", type=int, default=3, help="Dinkelbach rounds at most")
    ap.add_argument("--out", default="docs/bench_join_exact.md")
    args = ap.parse_args(argv)
    rows = [
        "# Node addition: the optimum by MILP on a sample (scripts/join_exact.py)",
        "",
        f"Command: `python scripts/join_exact.py --instances {' '.join(args.instances)} --time-limit "
        f"{args.time_limit:g} --rounds {args.rounds}`.  Improvement in %, cost = B*C/F^2 as in bench_join.md.  "
        "`best known`: the best assignment of the local search or the MILP; `MILP bound` and `LP bound`: proved "
        "upper bounds on the optimum's improvement (gwtf_node/sim/join/optimum.py, `milp_optimum`, `optimum_bound`).",
        "",
        "| instance | GWTF (ours) | paper rule | cap-first | random | local search | best known | MILP bound "
        "| LP bound | MILP solves | s |",
        "|---" * 11 + "|",
    ]
    for item in args.instances:
        setting, seed = map(int, item.split(":"))
        t = time.perf_counter()
        inst = generate_join(setting, seed)
        model = FlowModel(inst)
        res = run_join(setting, seed, instance=inst)
        opt_assign = tuple(res["policies"]["optimal"]["stages"][v] for v in inst.candidates)
        mr = milp_optimum(inst, model, incumbent=opt_assign, time_limit=args.time_limit, rounds=args.rounds)
        now = res["now"]["cost"]
        imp = res["improvement"]
        best = (now - mr.cost) / now
        mbound = (now - mr.cost_bound) / now
        wall = time.perf_counter() - t
        line = (f"| {setting}:{seed} | {100 * imp['gwtf']:.1f} | {100 * imp['gwtf_paper']:.1f} | "
                f"{100 * imp['capacity_first']:.1f} | {100 * imp['random']:.1f} | {100 * imp['optimal']:.1f} | "
                f"{100 * best:.1f} | {100 * mbound:.1f} | {100 * res['optimal_bound']['improvement']:.1f} | "
                f"{mr.solves} | {wall:.0f} |")
        print(line, file=sys.stderr, flush=True)
        rows.append(line)
    Path(args.out).write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

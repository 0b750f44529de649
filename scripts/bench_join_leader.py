#!/usr/bin/env python3
"""The daemon's leader policy against water-filling on the instances of scripts/bench_join.py, with its CPU time.

`leader` is the daemon's own code (protocol/membership.known_links and
place_by_search) on what the daemon tells its leader: stage capacities, each
member's link costs to its flow neighbours, each candidate's cost to each stage
and its link costs to every node; `no links` is the same search without any link
cost (every link at the mean of the candidates' stage costs).  Writes a markdown
table (mean improvement in %, mean CPU seconds of the leader's choice), side by
side with water-filling on the same instances.

    python scripts/bench_join_leader.py [--settings 1 2] [--seeds 10] [--out docs/bench_join_leader.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from gwtf_node.protocol.placement import DEFAULT_MAX_EVALUATIONS
from gwtf_node.sim.join import JOIN_SETTINGS, FlowModel, generate_join, policy_leader, policy_waterfill


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=sorted(JOIN_SETTINGS), choices=sorted(JOIN_SETTINGS))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--evaluations", type=int, default=DEFAULT_MAX_EVALUATIONS)
    ap.add_argument("--out", default="docs/bench_join_leader.md")
    args = ap.parse_args(argv)
    res = []
    for st in args.settings:
        for seed in range(args.seeds):
            inst = generate_join(st, seed)
            model = FlowModel(inst)
            now = model.evaluate(()).cost
            t = time.process_time()
            leader = policy_leader(inst, args.evaluations)
            cpu = time.process_time() - t
            t = time.process_time()
            blind = policy_leader(inst, args.evaluations, links=False)
            cpu_blind = time.process_time() - t
            res.append({"setting": st, "leader": (now - model.evaluate(leader).cost) / now, "cpu": cpu,
                        "blind": (now - model.evaluate(blind).cost) / now, "cpu_blind": cpu_blind,
                        "waterfill": (now - model.evaluate(policy_waterfill(inst)).cost) / now})
    cmd = "python scripts/bench_join_leader.py" + (f" --settings {' '.join(map(str, args.settings))}"
                                                  if args.settings != sorted(JOIN_SETTINGS) else "") \
        + (f" --seeds {args.seeds}" if args.seeds != 10 else "") \
        + (f" --evaluations {args.evaluations}" if args.evaluations != DEFAULT_MAX_EVALUATIONS else "")
    rows = ["# The daemon's leader policy (scripts/bench_join_leader.py)", "",
            f"Command: `{cmd}`.  Same instances and cost as docs/bench_join.md.  `leader`: "
            "protocol/membership.place_by_search with the daemon's budget of "
            f"{args.evaluations} evaluations on what the daemon's leader is told (stage capacities, each "
            "member's link costs to its flow neighbours, each candidate's cost to each stage and its link costs "
            "to every node); `no links`: the same search told no link cost; `water-filling`: "
            "protocol/membership.place.  Mean improvement in %, mean CPU seconds of the leader's choice "
            "(process time, one core).", "",
            "| setting | leader | no links | water-filling | leader CPU s | no links CPU s "
            "| leader vs water-filling better / equal / worse |", "|---" * 7 + "|"]
    for st in [*args.settings, "all"]:
        rs = res if st == "all" else [r for r in res if r["setting"] == st]
        cmp = (sum(r["leader"] > r["waterfill"] + 1e-9 for r in rs), sum(abs(r["leader"] - r["waterfill"]) <= 1e-9
                                                                         for r in rs),
               sum(r["leader"] < r["waterfill"] - 1e-9 for r in rs))
        rows.append(f"| {st} | {100 * statistics.fmean(r['leader'] for r in rs):.1f} | "
                    f"{100 * statistics.fmean(r['blind'] for r in rs):.1f} | "
                    f"{100 * statistics.fmean(r['waterfill'] for r in rs):.1f} | "
                    f"{statistics.fmean(r['cpu'] for r in rs):.3f} | {statistics.fmean(r['cpu_blind'] for r in rs):.3f} | "
                    f"{cmp[0]} / {cmp[1]} / {cmp[2]} |")
    Path(args.out).write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

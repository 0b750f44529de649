#!/usr/bin/env python3
"""Flow-routing scale benchmark: one data node, N relays over S stages (Table V setting-1 costs and capacities).

For each size, GWTF runs until it converges (or `--rounds` rounds, or
`--wall-limit` seconds of wall time) and is compared with the optimum
(networkx min-cost max-flow).  Prints flows reached, cost ratio, converged
round, messages (total, per node, CostAnnounce), wall time and CPU time (the
process's own: what the wall time is on an idle machine; the wall limit counts
wall time).

    nice -n 10 python scripts/bench_flow_scale.py                       # 160, 320, 1000 relays x 16 stages
    nice -n 10 python scripts/bench_flow_scale.py --relays 1000 --wall-limit 600
    python scripts/bench_flow_scale.py --relays 160 320 --json                  # one JSON object per size
    python scripts/bench_flow_scale.py --relays 160 320 --json --receipts       # + what each label changed

`--receipts` classifies every label a node receives in a CostAnnounce by what
it changed there (the node's IN and OUT labels and the choices behind them
compared before and after the message): `nothing`, `in_only` (the IN label or
its choice, not the OUT label) or `out` (the OUT label or its choice); and
counts the IN labels received per (sender, wave): how many previous-stage
peers x announcements one label of one wave costs.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from gwtf_node.protocol.flow import FlowNode
from gwtf_node.protocol.messages import CostAnnounce, Side
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import FlowSetting, generate_layered


class Receipts:
    """What the labels of each CostAnnounce changed at their receiver (`--receipts`): wraps
    `FlowNode.on_message` in this process while it is in force (a context manager)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.per_label: collections.Counter = collections.Counter()  # (sender, commodity, wave) -> IN labels
        self._orig = None

    def __enter__(self) -> "Receipts":
        self._orig = orig = FlowNode.on_message
        counts, per_label = self.counts, self.per_label

        def on_message(node, now, sender, msg):
            if type(msg) is not CostAnnounce:
                return orig(node, now, sender, msg)
            ds = {lab.commodity for lab in msg.labels}
            before = {d: (node.my_in.get(d), node.dec_in.get(d), node.my_out.get(d), node.dec_out.get(d)) for d in ds}
            eff = orig(node, now, sender, msg)
            for lab in msg.labels:
                d = lab.commodity
                b = before[d]
                a = (node.my_in.get(d), node.dec_in.get(d), node.my_out.get(d), node.dec_out.get(d))
                side = "in_label" if lab.side is Side.IN else "out_label"
                what = "nothing" if a == b else ("in_only" if a[2:] == b[2:] else "out")
                counts[f"{side}_{what}"] += 1
                if lab.side is Side.IN:
                    per_label[(sender, d, lab.epoch)] += 1
            return eff

        FlowNode.on_message = on_message
        return self

    def __exit__(self, *exc) -> None:
        FlowNode.on_message = self._orig

    def report(self) -> dict:
        n = len(self.per_label)
        return {**dict(sorted(self.counts.items())), "in_labels_per_label_wave":
                round(sum(self.per_label.values()) / n, 1) if n else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, nargs="+", default=[160, 320, 1000])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--wall-limit", type=float, default=300.0, help="stop a run after this many seconds of wall time")
    ap.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    ap.add_argument("--receipts", action="store_true", help="with --json: what each received label changed (doc)")
    args = ap.parse_args(argv)
    if args.receipts and not args.json:
        ap.error("--receipts needs --json (the receipts are fields of the JSON object)")
    if not args.json:
        print("| relays x stages | flows / max flow | GWTF / optimum | converged round | rounds run | waves | messages "
              "| per node | CostAnnounce | wall s | CPU s | stopped by wall limit |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.relays:
        sc = parse_scenario(generate_layered(f"scale-{n}x{args.stages}",
                                             FlowSetting(1, n, args.stages, (1, 3), (1, 20)), args.seed))
        t, c = time.perf_counter(), time.process_time()
        rec = Receipts() if args.receipts else None
        if rec is not None:
            with rec:
                g = run_gwtf(sc, seed=args.seed, rounds=args.rounds, wall_limit_s=args.wall_limit)
        else:
            g = run_gwtf(sc, seed=args.seed, rounds=args.rounds, wall_limit_s=args.wall_limit)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        o = optimal_routing(sc)
        ratio = g.mean_cost / o.mean_cost if o.mean_cost else 1.0
        if args.json:
            print(json.dumps({"relays": n, "stages": args.stages, "flows": g.num_flows, "max_flow": o.num_flows,
                              "cost_ratio": round(ratio, 6), "converged_round": g.converged_round,
                              "rounds": g.rounds, "waves": g.extra["waves"], "messages": g.messages,
                              "per_node": round(g.messages / len(sc.nodes), 1),
                              "messages_by_type": g.extra["messages_by_type"],
                              "inconsistent_links": g.extra["inconsistent_links"],
                              "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                              "wall_limited": g.extra["wall_limited"],
                              **({"receipts": rec.report()} if rec is not None else {})}), flush=True)
            continue
        print(f"| {n} x {args.stages} | {g.num_flows} / {o.num_flows} | {ratio:.4f} | {g.converged_round} "
              f"| {g.rounds} | {g.extra['waves']} | {g.messages} | {g.messages / len(sc.nodes):.0f} "
              f"| {g.extra['messages_by_type'].get('CostAnnounce', 0)} | {wall:.1f} | {cpu:.1f} "
              f"| {'yes' if g.extra['wall_limited'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

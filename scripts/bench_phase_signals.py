#!/usr/bin/env python3
"""Phase signals per node: BEGIN AGGREGATION to children and CAN TAKE to parents against every member of a stage.

    python scripts/bench_phase_signals.py [--settings table2-homogeneous table6-x2 table6-x4] [--churns 0 0.1]
                                          [--seeds 2] [--iterations 4] [--json]

Runs `sim train` (GWTF, the flow machines, the aggregation phase of
`protocol/phases.py` at every node) twice per setting, churn and seed, side by
side: with the daemon's fan-out (`protocol/phasefan.py`, FAN_OUT parents per
stage member) and with every member of the stage before (`phase_fan_out=None`),
and a third time with the fan-out and every BEGIN's groups in full
(`begin_groups="full"`, against the daemon's groups by digest,
`protocol/phasegroups.py`).  Prints, per setting and churn, the phase signals a
node sends per iteration (BEGIN, CAN TAKE, IterationDone and their
acknowledgements, resends included: `PhaseStats.signals + resent`), the relays
per stage, and the time per microbatch of both, with the ratios fan-out / all;
and the peer ids BEGIN's groups carry per node per iteration (about 55 bytes
each on the wire), by digest against in full.
"""

from __future__ import annotations

import argparse
import json
import statistics

from gwtf_node.protocol.phasefan import FAN_OUT
from gwtf_node.sim.train import run_train
from gwtf_node.sim.train.setting import make_setting


def one(setting: str, churn: float, iterations: int, seed: int, fan_out: int | None, groups: str = "digest") -> dict:
    r = run_train(setting, "gwtf", churn, iterations, seed, phase_fan_out=fan_out, begin_groups=groups)
    ph = r["phases"]
    return {"signals": ph["signals"] + ph["resent"], "time_per_microbatch_s": r["time_per_microbatch_s"],
            "iterations": iterations, "lost": r["lost_microbatches"], "group_ids": ph["group_ids_sent"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=["table2-homogeneous", "table6-x2", "table6-x4"])
    ap.add_argument("--churns", nargs="+", type=float, default=[0.0, 0.1])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="one JSON object per setting and churn")
    args = ap.parse_args(argv)
    rows = []
    for setting in args.settings:
        st = make_setting(setting, 0)
        n_nodes = len(st.relays) + len(st.data)
        per_stage = len(st.relays) / len({stage for stage, _cap in st.relays.values()})
        for churn in args.churns:
            runs = {k: [one(setting, churn, args.iterations, s, f, g) for s in range(args.seeds)]
                    for k, f, g in (("fan", FAN_OUT, "digest"), ("all", None, "digest"), ("full", FAN_OUT, "full"))}
            row = {"setting": setting, "churn": churn, "nodes": n_nodes, "relays_per_stage": per_stage,
                   "fan_out": FAN_OUT}
            for k, rs in runs.items():
                row[f"{k}_signals_per_node_it"] = statistics.fmean(
                    r["signals"] / n_nodes / r["iterations"] for r in rs)
                row[f"{k}_time_per_microbatch_s"] = statistics.fmean(r["time_per_microbatch_s"] for r in rs)
                row[f"{k}_lost"] = sum(r["lost"] for r in rs)
                row[f"{k}_group_ids_per_node_it"] = statistics.fmean(
                    r["group_ids"] / n_nodes / r["iterations"] for r in rs)
            row["signals_ratio"] = row["fan_signals_per_node_it"] / row["all_signals_per_node_it"]
            row["time_ratio"] = row["fan_time_per_microbatch_s"] / row["all_time_per_microbatch_s"]
            row["group_ids_ratio"] = row["fan_group_ids_per_node_it"] / row["full_group_ids_per_node_it"]
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        print(f"| setting | churn | nodes | relays / stage | phase signals / node / it, fan-out {FAN_OUT} | every member | ratio "
              "| time / microbatch s, fan-out | every member | ratio | BEGIN group ids / node / it, by digest "
              "| in full | ratio |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['setting']} | {r['churn']:.0%} | {r['nodes']} | {r['relays_per_stage']:.1f} "
                  f"| {r['fan_signals_per_node_it']:.1f} "
                  f"| {r['all_signals_per_node_it']:.1f} | {r['signals_ratio']:.2f} "
                  f"| {r['fan_time_per_microbatch_s']:.3f} | {r['all_time_per_microbatch_s']:.3f} "
                  f"| {r['time_ratio']:.3f} | {r['fan_group_ids_per_node_it']:.1f} "
                  f"| {r['full_group_ids_per_node_it']:.1f} | {r['group_ids_ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

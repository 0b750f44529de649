#!/usr/bin/env python3
"""Request Change / Request Redirect with simulated annealing: what it buys and what it costs.

For each setting and seed the flow machines route the same scenario twice,
with Request Change / Request Redirect off (`FlowConfig.improve` False) and
on all the time, with annealing (T0 1.7, alpha 0.95, as the paper) or, with
`--greedy`, taking only moves that lower the cost; and, with `--churn`, re-form the flows after 10 % of the relays
crashed (the churn of scripts/bench_flow_churn.py), again off and on.  Per
run: mean cost per microbatch against the LP bound (several data nodes) or the
min-cost max-flow optimum (one), flows against the maximum flow, messages and
rounds; the table puts the two side by side with the ratio of messages.

    python scripts/bench_flow_anneal.py --settings 5 6 --seeds 5
    python scripts/bench_flow_anneal.py --settings 5 --seeds 5 --churn
    python scripts/bench_flow_anneal.py --settings 5 --seeds 5 --greedy   # moves without annealing
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace

from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.sim.baselines import max_flow_value, optimal_routing
from gwtf_node.sim.flowchurn import random_churn, run_churn
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import FLOW_SETTINGS, load_flow_setting
from gwtf_node.sim.validate import check_routing


def _bound(scenario, seed: int) -> tuple[float, int]:
    o = optimal_routing(scenario, seed=seed)
    mean = o.extra.get("lp_bound_mean_cost", o.mean_cost)
    flows = int(round(o.extra.get("lp_max_flow", max_flow_value(scenario) if len(scenario.data_nodes) == 1
                                  else o.num_flows)))
    return mean, flows


def formation(setting: int, seed: int, base: FlowConfig, rounds: int) -> dict:
    sc = load_flow_setting(setting, seed)
    t = time.process_time()
    g = run_gwtf(sc, seed=seed, rounds=rounds, base=base)
    cpu = time.process_time() - t
    check_routing(sc, g)
    mean, flows = _bound(sc, seed)
    return {"vs_opt": g.mean_cost / mean, "flows_ok": g.num_flows >= flows, "messages": g.messages,
            "rounds": g.converged_round, "cpu": cpu, "moves": g.extra["moves"]}


def churn(setting: int, seed: int, base: FlowConfig, rounds: int) -> dict:
    sc = load_flow_setting(setting, seed)
    fs = FLOW_SETTINGS[setting]
    ch = random_churn(sc, random.Random(10_000 + seed), 0.1, 0, fs.capacity, fs.link_cost, 1.0)
    t = time.process_time()
    res = run_churn(sc, ch, seed=seed, rounds=rounds, base=base)
    cpu = time.process_time() - t
    check_routing(res.changed, res.after)
    mean, flows = _bound(res.changed, seed)
    return {"vs_opt": res.after.mean_cost / mean, "flows_ok": res.after.num_flows >= flows,
            "messages": res.messages_after, "rounds": res.reconverge_rounds, "cpu": cpu, "moves": 0}


def training(seeds: int, iterations: int) -> int:
    """`sim train` (Table II) with the flow machines' moves on (greedy, several data nodes) against off."""
    from gwtf_node.sim.train import run_train

    lines = [f"`python scripts/bench_flow_anneal.py --train --seeds {seeds} --iterations {iterations}` (GWTF)", "",
             "| setting | churn | time per microbatch (min) moves on | off | flow messages on | off | ratio |",
             "|---|---|---|---|---|---|---|"]
    for setting in ("table2-homogeneous", "table2-heterogeneous"):
        for churn in (0.0, 0.1):
            res = {}
            for label, opts in (("on", {"improve": None}), ("off", {"improve": False})):
                runs = [run_train(setting, "gwtf", churn, iterations, seed, flow_options=opts) for seed in range(seeds)]
                res[label] = (statistics.mean(r["time_per_microbatch_s"] / 60 for r in runs),
                              sum(r["flow_messages"] for r in runs))
                print(setting, churn, label, res[label], file=sys.stderr, flush=True)
            (t_on, m_on), (t_off, m_off) = res["on"], res["off"]
            lines.append(f"| {setting.split('-')[1]} | {churn:.0%} | {t_on:.4f} | {t_off:.4f} | {m_on:,} | {m_off:,} "
                         f"| {m_on / max(1, m_off):.1f} |")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=[5, 6])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--churn", action="store_true", help="re-formation after 10 %% of the relays crashed")
    ap.add_argument("--greedy", action="store_true", help="the moves that are on take no worse move (no annealing)")
    ap.add_argument("--after-change", action="store_true",
                    help="compare greedy moves all the time with the same plus anneal_after_change (annealed moves after a membership "
                         "change only; use with --churn)")
    ap.add_argument("--train", action="store_true",
                    help="training with churn (sim train, Table II): moves on against off, time per microbatch")
    ap.add_argument("--iterations", type=int, default=10, help="--train: iterations per run")
    args = ap.parse_args(argv)
    if args.train:
        return training(args.seeds, args.iterations)
    off = FlowConfig("-", False, 0, (), {}, {}, improve=False)
    on = replace(off, improve=True, anneal=not args.greedy)
    if args.after_change:
        off = FlowConfig("-", False, 0, (), {}, {}, improve=True)  # greedy moves all the time
        on = replace(off, anneal_after_change=True)
    run = churn if args.churn else formation
    what = "after 10 % of the relays crashed" if args.churn else "formation"
    cmd = "python scripts/bench_flow_anneal.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"{what} (`{cmd.strip()}`)", "",
             "| setting | instances | max flow reached (off / on) "
             f"| GWTF / optimum, {'defaults' if args.after_change else 'moves off'} (mean, worst) "
             f"| {'greedy moves' if args.greedy else 'annealed after a change' if args.after_change else 'annealing'}"
             " on (mean, worst) | better / worse / same | messages off / on (mean) | ratio on / off "
             "| rounds off / on (mean) | CPU s off / on (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for setting in args.settings:
        pairs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            a, b = run(setting, seed, off, args.rounds), run(setting, seed, on, args.rounds)
            pairs.append((a, b))
            print(f"setting {setting} seed {seed}: off {a['vs_opt']:.4f} {a['messages']} msgs {a['cpu']:.1f}s | "
                  f"on {b['vs_opt']:.4f} {b['messages']} msgs {b['cpu']:.1f}s ({b['moves']} moves)",
                  file=sys.stderr, flush=True)
        n = len(pairs)
        better = sum(b["vs_opt"] < a["vs_opt"] - 1e-9 for a, b in pairs)
        worse = sum(b["vs_opt"] > a["vs_opt"] + 1e-9 for a, b in pairs)
        m_off = statistics.mean(a["messages"] for a, _ in pairs)
        m_on = statistics.mean(b["messages"] for _, b in pairs)
        offs, ons = [a for a, _ in pairs], [b for _, b in pairs]

        def mean(rs: list, key: str) -> float:
            return statistics.mean(r[key] for r in rs)

        lines.append(
            f"| {setting} | {n} | {sum(a['flows_ok'] for a in offs)}/{n} / {sum(b['flows_ok'] for b in ons)}/{n} "
            f"| {mean(offs, 'vs_opt'):.4f}, {max(a['vs_opt'] for a in offs):.4f} "
            f"| {mean(ons, 'vs_opt'):.4f}, {max(b['vs_opt'] for b in ons):.4f} "
            f"| {better} / {worse} / {n - better - worse} | {m_off:.0f} / {m_on:.0f} | {m_on / m_off:.1f} "
            f"| {mean(offs, 'rounds'):.1f} / {mean(ons, 'rounds'):.1f} "
            f"| {mean(offs, 'cpu'):.1f} / {mean(ons, 'cpu'):.1f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

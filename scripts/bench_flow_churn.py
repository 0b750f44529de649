#!/usr/bin/env python3
"""Flow re-formation under churn: Table V settings, kill a share of the relays (and/or add relays) after the
flows converged; the flow machines re-form the flows (`gwtf_node/sim/flowchurn.py`).

Per setting and seed: flows reached against the new maximum flow, mean cost against the new optimum
(networkx min-cost max-flow; the LP bound with several data nodes), rounds and messages from the churn
to the last flow change.  Writes docs/bench_flow_churn.md by default.

    python scripts/bench_flow_churn.py                       # settings 1 3, kill 10%, 10 seeds
    python scripts/bench_flow_churn.py --kill 0 --joins 4    # 4 relays join
    python scripts/bench_flow_churn.py --layered 320 16 --seeds 3 --out /tmp/churn.md   # 320 relays x 16 stages
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.sim.baselines import max_flow_value, optimal_routing
from gwtf_node.sim.flowchurn import changed_scenario, random_churn, run_churn
from gwtf_node.sim.flowsim import add_flow_choice
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.scenarios import FLOW_SETTINGS, FlowSetting, generate_layered, load_flow_setting
from gwtf_node.sim.validate import check_routing


MOVES = {"off": {"improve": False}, "greedy": {"improve": True}, "anneal": {"improve": True, "anneal": True}}


def bench_one(setting: int | FlowSetting, seed: int, kill: float, joins: int, detect_s: float, rounds: int,
              improve: str | None = None, label_limits: bool = False, formation_waits: bool = True,
              announce_coalesce_s: float | None = None, neighbours: int | None = None,
              free_back: bool = True, formation: str = "auto") -> dict:
    """One churn run on Table V setting `setting`, or on a layered scenario of that FlowSetting."""
    if isinstance(setting, FlowSetting):
        fs = setting
        sc = parse_scenario(generate_layered(f"layered-{fs.relays}x{fs.stages}-s{seed}", fs, seed))
    else:
        sc = load_flow_setting(setting, seed)
        fs = FLOW_SETTINGS[setting]
    ch = random_churn(sc, random.Random(10_000 + seed), kill, joins, fs.capacity, fs.link_cost, detect_s)
    t = time.perf_counter()
    knobs = dict(MOVES.get(improve, {}))
    if label_limits:
        knobs["label_limits"] = True
    if not formation_waits:
        knobs["formation_waits"] = False
    if announce_coalesce_s is not None:
        knobs["announce_coalesce_s"] = announce_coalesce_s
    if not free_back:
        knobs["reform_free_back"] = False
    base = FlowConfig("-", False, 0, (), {}, {}, **knobs) if knobs else None
    res = run_churn(sc, ch, seed=seed, rounds=rounds, base=base, neighbours=neighbours, formation=formation)
    wall = time.perf_counter() - t
    new = res.changed  # the flow links after the churn (protocol/neighbourhood.py)
    every = changed_scenario(sc, ch)
    o_every = None if len(every.links) == len(new.links) else optimal_routing(every, seed=seed)
    check_routing(new, res.after)
    o = optimal_routing(new, seed=seed)
    opt_mean = o.extra.get("lp_bound_mean_cost", o.mean_cost)
    mf = int(round(o.extra.get("lp_max_flow", max_flow_value(new) if len(new.data_nodes) == 1 else o.num_flows)))
    return {"flows_before": res.before.num_flows, "flows": res.after.num_flows, "max_flow": mf,
            "vs_opt": res.after.mean_cost / opt_mean if opt_mean else 1.0,
            "rounds": res.reconverge_rounds, "messages": res.messages_after,
            "msgs_per_node": res.messages_after / len(new.nodes), "killed": len(ch.kill), "joined": len(ch.join),
            "inconsistent": res.after.extra["inconsistent_links"], "wall": wall,
            "vs_opt_every_link": res.after.mean_cost / (opt_mean if o_every is None else
                                                        o_every.extra.get("lp_bound_mean_cost", o_every.mean_cost)),
            "max_flow_every_link": mf if o_every is None else max_flow_value(every)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--kill", type=float, default=0.1, help="share of the relays killed")
    ap.add_argument("--joins", type=int, default=0, help="relays that join")
    ap.add_argument("--detect", type=float, default=1.0, help="seconds (rounds) before neighbours learn of it")
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--layered", type=int, nargs=2, metavar=("RELAYS", "STAGES"), default=None,
                    help="instead of --settings: one data node, RELAYS relays over STAGES stages (setting 1's "
                         "capacities and link costs)")
    ap.add_argument("--moves", choices=sorted(MOVES), default=None,
                    help="Request Change/Redirect all the time: off, greedy, or with annealing (default: FlowConfig's)")
    ap.add_argument("--label-limits", action="store_true", help="FlowConfig.label_limits on (flow/limits.py)")
    ap.add_argument("--announce-coalesce-s", type=float, default=None, metavar="S",
                    help="FlowConfig.announce_coalesce_s (labels changed within this window go out together)")
    ap.add_argument("--no-formation-waits", action="store_true",
                    help="FlowConfig.formation_waits off (flow/waves.py: units move on labels still spreading)")
    ap.add_argument("--no-reform-free-back", action="store_true",
                    help="FlowConfig.reform_free_back off (flow/labels.py: after the churn a hand-back costs minus "
                         "its link's cost, as in formation)")
    add_flow_choice(ap)  # (the formation before the churn)
    ap.add_argument("--out", default="docs/bench_flow_churn.md")
    ap.add_argument("--append", action="store_true", help="append the table to --out")
    args = ap.parse_args(argv)
    if args.layered is not None:
        if args.layered[0] < args.layered[1] or args.layered[1] < 1:
            print("--layered RELAYS STAGES: at least one relay per stage", file=sys.stderr)
            return 2
        args.settings = [FlowSetting(1, args.layered[0], args.layered[1], (1, 3), (1, 20))]
    lines = [f"### kill {args.kill:.0%} of the relays, {args.joins} join, detection {args.detect:g} s "
             f"(`python scripts/bench_flow_churn.py "
             f"{'--layered ' + ' '.join(map(str, args.layered)) if args.layered else '--settings ' + ' '.join(map(str, args.settings))} "
             f"--seeds {args.seeds} --kill {args.kill:g} --joins {args.joins}"
             f"{'' if args.moves is None else ' --moves ' + args.moves}"
             f"{' --label-limits' if args.label_limits else ''}"
             f"{' --no-formation-waits' if args.no_formation_waits else ''}"
             f"{' --no-reform-free-back' if args.no_reform_free_back else ''}"
             f"{'' if args.neighbours is None else f' --neighbours {args.neighbours}'}"
             f"{'' if args.formation == 'auto' else f' --formation {args.formation}'}"
             f"{'' if args.announce_coalesce_s is None else f' --announce-coalesce-s {args.announce_coalesce_s:g}'}`)", "",
             "| setting | instances | killed / joined (mean) | new max flow reached | GWTF / new optimum (mean, worst) "
             "| rounds to re-converge (mean, max) | messages after the churn (mean, per node) | inconsistent links "
             "| over every link: max flow reached, GWTF / optimum (mean, worst) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for setting in args.settings:
        rs = []
        for seed in range(args.seeds):
            r = bench_one(setting, seed, args.kill, args.joins, args.detect, args.rounds,
                          args.moves, args.label_limits, not args.no_formation_waits, args.announce_coalesce_s,
                          args.neighbours, not args.no_reform_free_back, args.formation)
            rs.append(r)
            print(f"setting {setting} seed {seed}: {r['flows_before']} -> {r['flows']}/{r['max_flow']} "
                  f"cost/opt {r['vs_opt']:.4f} rounds {r['rounds']:.1f} msgs {r['messages']} {r['wall']:.1f}s",
                  file=sys.stderr, flush=True)
        name = f"{setting.relays} x {setting.stages}" if isinstance(setting, FlowSetting) else setting
        lines.append(
            f"| {name} | {len(rs)} | {statistics.mean(r['killed'] for r in rs):.1f} / "
            f"{statistics.mean(r['joined'] for r in rs):.1f} | "
            f"{sum(r['flows'] >= r['max_flow'] for r in rs)}/{len(rs)} | "
            f"{statistics.mean(r['vs_opt'] for r in rs):.4f}, {max(r['vs_opt'] for r in rs):.4f} | "
            f"{statistics.mean(r['rounds'] for r in rs):.1f}, {max(r['rounds'] for r in rs):.1f} | "
            f"{statistics.mean(r['messages'] for r in rs):.0f}, {statistics.mean(r['msgs_per_node'] for r in rs):.0f} | "
            f"{sum(r['inconsistent'] for r in rs)} | {sum(r['flows'] >= r['max_flow_every_link'] for r in rs)}/{len(rs)}, "
            f"{statistics.mean(r['vs_opt_every_link'] for r in rs):.4f}, {max(r['vs_opt_every_link'] for r in rs):.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    if args.append and out.exists():
        out.write_text(out.read_text() + "\n" + text)
    else:
        out.write_text("# Flow re-formation under churn\n\nRelays crash (or join) after the flows converged; "
                       "their neighbours get `remove_neighbour` / `add_neighbour` after the detection delay "
                       "and the flow machines re-form the flows themselves (`gwtf_node/sim/flowchurn.py`).\n\n"
                       + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

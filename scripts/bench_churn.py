#!/usr/bin/env python3
"""Table II of the GWTF paper in the simulator: churn 0/10/20% x homogeneous/heterogeneous x GWTF/SWARM/task pool.

    nice -n 10 python scripts/bench_churn.py [--iterations 25] [--seeds 10]

Writes docs/bench_churn.md (and docs/bench_churn.json): mean and standard
deviation over seeds of the per-run means (`gwtf_node.sim.train`), checks
the targets (GWTF 40 % faster than SWARM at 10 % churn, a tenth of its
wasted compute, nothing lost), puts the task pool of the hybrid parameter-server
design beside them (`--policy taskpool`, gwtf_node/sim/train/taskpool.py), and
measures how much the model's switches matter
(`--no-sensitivity` to skip: TrainSimOptions fields at 10% and 20% churn).
Every policy sees the same setting and the same crash draws for a given seed
(the churn RNG does not depend on the policy; the crash times follow each
run's own iteration lengths).  Everything from a "## Reading" heading of an
existing docs/bench_churn.md on is kept (written by hand).

`--reuse docs/bench_churn.json` takes every (setting, churn, policy) row and
sensitivity cell found in that file from it and runs only the missing ones
(e.g. a policy added since), with the same `--iterations` and `--seeds` as
the file's run: only valid while the other policies behave as they did then,
which `scripts/golden_train.py --check` tells.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from gwtf_node.sim.train import SETTINGS, run_train

ROOT = Path(__file__).resolve().parent.parent
CHURNS = (0.0, 0.1, 0.2)
POLICIES = ("swarm", "gwtf", "taskpool")
LABELS = {"swarm": "SWARM", "gwtf": "GWTF", "taskpool": "Task pool"}
# (label, policies it changes, TrainSimOptions fields, the `gwtf-node sim train` flags that set them)
VARIANTS = (
    ("SWARM restarts only on its own timeouts (no membership reaction; the paper's baseline)", ("swarm",),
     {"swarm_reacts_to": "timeouts"}, "--swarm-reacts-to timeouts"),
    ("GWTF data node waits for its relays' BackwardStuck (does not act on the membership layer)", ("gwtf",),
     {"gwtf_acts_on_gone": False}, "--no-gwtf-acts-on-gone"),
    ("a peer presumed dead on a hop deadline stays dead while still heard (no un-presume)", ("swarm", "gwtf"),
     {"unpresume": False}, "--no-unpresume"),
    ("CAN TAKE after any one downstream member (the paper's sentence read literally)", ("swarm", "gwtf"),
     {"can_take": "any"}, "--can-take any"),
    ("GWTF flows: the LP optimum installed by an oracle, re-converged 60 s after a change", ("gwtf",),
     {"routing": "oracle"}, "--routing oracle"),
    ("GWTF flows: oracle's initial optimum + local repair only", ("gwtf",), {"routing": "oracle", "reflow": False},
     "--routing oracle --no-reflow"),
    ("GWTF without lending (a finished data node's units stay idle)", ("gwtf",), {"lend": False}, "--no-lend"),
    ("one wave per iteration: what finds no route is deferred (the paper's reading)", ("swarm", "gwtf"),
     {"one_wave": True}, "--one-wave"),
    ("GWTF flow machines with label waves", ("gwtf",), {"flow_options": {"waves": True}}, "--label-waves"),
    ("a crashed relay comes back in its own stage with a stage peer's state (no leader placement)", ("swarm", "gwtf"),
     {"joining": "restart"}, "--joining restart"),
    ("... and comes in only at the next iteration open", ("swarm", "gwtf"),
     {"joining": "restart", "join_mid_iteration": False}, "--joining restart --join-at-open"),
    ("the leader places joiners on their stage costs only (no link costs reported)", ("swarm", "gwtf"),
     {"join_links": False}, "--no-join-links"),
    ("timing priors from the peer's profiled compute x capacity (not the daemon's rule)", ("swarm", "gwtf"),
     {"priors": "modelled"}, "--priors modelled"),
    ("no membership layer for the microbatch and flow machines (crashes found by timeouts only)", ("swarm", "gwtf"),
     {"detect": False}, "--no-detect"),
    ("membership reports a crash 60 s after it (heartbeats / DHT entries expiring)", ("swarm", "gwtf"),
     {"detect_s": 60.0}, "--detect-s 60"),
    ("a crashed relay's process closes its connections: the relays near it that do not work with it learn of it "
     "in 7 s too", ("swarm", "gwtf"), {"idle_detect_s": 7.0}, "--idle-detect-s 7"),
)
KEYS = ("time_per_microbatch_s", "throughput_per_iteration", "communication_time_s", "wasted_compute_s",
        "lost_microbatches", "deferred_microbatches", "lost_contributions", "lost_contribution_compute_s",
        "unfinished_iterations")


def ms(vals):
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--variants", nargs="+", metavar="TEXT",
                    help="only the sensitivity rows whose label contains one of these texts")
    ap.add_argument("--reuse", metavar="JSON", help="rows of an earlier run of the same command (docstring)")
    args = ap.parse_args()
    t0 = time.time()
    rows = {}
    old = json.loads(Path(args.reuse).read_text()) if args.reuse else {}
    if "config" in old and old["config"] != {"iterations": args.iterations, "seeds": args.seeds}:
        sys.exit(f"--reuse {args.reuse}: its run had {old['config']}; give the same --iterations and --seeds, or "
                 "do not reuse it")  # (a file without 'config' predates it: its docs/bench_churn.md names the run)
    reused = []
    for setting in SETTINGS:
        for churn in CHURNS:
            for policy in POLICIES:
                key = "|".join(map(str, (setting, churn, policy)))
                if key in old:
                    rows[(setting, churn, policy)] = old[key]
                    reused.append(key)
                    continue
                runs = [run_train(setting, policy, churn, args.iterations, s, breakdown=True)
                        for s in range(args.seeds)]
                rows[(setting, churn, policy)] = {k: ms([r[k] for r in runs]) for k in KEYS}
                rows[(setting, churn, policy)]["lost_total"] = sum(r["lost_microbatches"] for r in runs)
                rows[(setting, churn, policy)]["unfinished_total"] = sum(r["unfinished_iterations"] for r in runs)
                rows[(setting, churn, policy)]["restarts"] = sum(r["protocol"]["restarts"] for r in runs)
                rows[(setting, churn, policy)]["waste_breakdown_s"] = {
                    k: statistics.fmean(r["waste_breakdown_s"][k] for r in runs) for k in runs[0]["waste_breakdown_s"]}
                for k in ("recovers", "resends", "probes", "gave_up"):
                    rows[(setting, churn, policy)][k] = sum(r["protocol"][k] for r in runs)
                rows[(setting, churn, policy)]["flow_messages"] = sum(r["flow_messages"] for r in runs)
                print(setting, churn, policy, {k: round(v[0], 2) for k, v in rows[(setting, churn, policy)].items()
                                               if isinstance(v, tuple)}, flush=True)
    main_s = time.time() - t0
    nice = f"nice -n {os.nice(0)} " if os.nice(0) > 0 else ""  # (what this process runs at, said as a command)
    flags = (" --no-sensitivity" if args.no_sensitivity else "") + (
        " --variants " + " ".join(f'"{v}"' for v in args.variants) if args.variants and not args.no_sensitivity else "") + (
        " --reuse docs/bench_churn.json" if reused else "")
    out = ["# Churn benchmark: Table II of the GWTF paper in the simulator\n",
           f"`{nice}python scripts/bench_churn.py --iterations {args.iterations} --seeds {args.seeds}{flags}` "
           f"({{SECONDS}}). Setting, model and metrics: docs/sim_train.md; "
           "protocol: `gwtf_node/protocol/recovery/`, `gwtf_node/protocol/phases.py`; task pool: "
           "`gwtf_node/sim/train/taskpool.py`. Mean ± std over seeds of each run's mean over its "
           "iterations. Times in minutes (time per microbatch, communication time per completed microbatch), "
           "wasted compute in seconds per iteration." + (
               f" Rows reused from the earlier run of the same command (`--reuse`; the other policies' behaviour "
               f"unchanged, `scripts/golden_train.py --check`): {len(reused)}." if reused else "") + "\n"]
    names = [("time_per_microbatch_s", "Time per microbatch (min)", 60), ("throughput_per_iteration",
             "Throughput (#microb/iteration)", 1), ("communication_time_s", "Communication time (min / microb)", 60),
             ("wasted_compute_s", "Wasted compute (s / iteration)", 1), ("lost_microbatches", "Lost microbatches", 1),
             ("deferred_microbatches", "Deferred microbatches (per run)", 1),
             ("lost_contributions", "Contributions lost in crashed relays (per run)", 1),
             ("lost_contribution_compute_s", "Their compute (s / iteration; not in wasted compute)", 1),
             ("unfinished_iterations", "Unfinished iterations (stalls, per run)", 1)]
    for setting in SETTINGS:
        head = "| | " + " | ".join(f"{LABELS[p]} {int(c*100)}%" for c in CHURNS for p in POLICIES) + " |"
        out += [f"\n## {setting}\n", head, "|---" * (1 + len(CHURNS) * len(POLICIES)) + "|"]
        for key, label, div in names:
            cells = []
            for c in CHURNS:
                for p in POLICIES:
                    m, sd = rows[(setting, c, p)][key]
                    cells.append(f"{m / div:.2f} ± {sd / div:.2f}")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        rr = [f"{p} {int(c*100)}%: " + ", ".join(f"{k} {rows[(setting, c, p)][k]}" for k in
                                                 ("restarts", "probes", "recovers", "resends", "gave_up",
                                                  "flow_messages"))
              for c in CHURNS for p in POLICIES]
        out.append("\nProtocol counts (sum over seeds): " + "; ".join(rr) + "\n")
    # targets
    g = rows[("table2-heterogeneous", 0.1, "gwtf")]["time_per_microbatch_s"][0]
    s = rows[("table2-heterogeneous", 0.1, "swarm")]["time_per_microbatch_s"][0]
    t1 = g <= 0.6 * s
    waste = []
    for setting in SETTINGS:
        for c in CHURNS:
            gw = rows[(setting, c, "gwtf")]["wasted_compute_s"][0]
            sw = rows[(setting, c, "swarm")]["wasted_compute_s"][0]
            waste.append((setting, c, gw, sw, gw <= sw / 10 + 1e-6))
    pool = [(st, c, rows[(st, c, "gwtf")]["time_per_microbatch_s"][0],
             rows[(st, c, "taskpool")]["time_per_microbatch_s"][0]) for st in SETTINGS for c in CHURNS]
    pool_lost = sum(r["lost_total"] + r["unfinished_total"] for k, r in rows.items() if k[2] == "taskpool")
    lost = sum(r["lost_total"] for k, r in rows.items() if k[2] == "gwtf")
    unf = sum(r["unfinished_total"] for k, r in rows.items() if k[2] == "gwtf")
    out += ["\n## Targets\n",
            f"- heterogeneous 10%: GWTF time per microbatch {g/60:.2f} min vs SWARM {s/60:.2f} min: "
            f"{(1 - g/s)*100:.0f}% lower (target >= 40%): {'MET' if t1 else 'NOT MET'}",
            "- wasted compute <= SWARM/10: " + "; ".join(
                f"{st[7:]} {int(c*100)}%: {gw:.2f} vs {sw:.2f} s {'MET' if ok else 'NOT MET'}"
                for st, c, gw, sw, ok in waste),
            f"- GWTF lost microbatches over all runs: {lost}; GWTF unfinished (stalled) iterations: {unf} "
            f"(target 0: {'MET' if lost == 0 and unf == 0 else 'NOT MET'})",
            "- GWTF vs the task pool, time per microbatch (min): " + "; ".join(
                f"{st[7:]} {int(c*100)}%: {g/60:.2f} vs {t/60:.2f} (GWTF {(1 - g/t)*100:.0f}% lower)"
                for st, c, g, t in pool)
            + f"; task pool lost or stalled over all runs: {pool_lost}\n"]
    causes = list(rows[(SETTINGS[0], CHURNS[0], "gwtf")]["waste_breakdown_s"])
    out += ["\n## Where the wasted compute goes\n",
            "Seconds per iteration, mean over seeds (`TrainSim.waste_breakdown`: `lost_in_crash` = work off the "
            "final path done by a relay that crashed before the microbatch completed; `off_path_crashed_later` = "
            "the same by a relay that crashed only after it completed (abandoned for another reason); "
            "`off_path_live` = abandoned attempts or branches on "
            "relays still alive; `repeated_on_path` = a final-path relay doing its stage again; `data_node` = a data "
            "node's repeated work; `deferred` = work on deferred microbatches).\n",
            "| setting | churn | policy | " + " | ".join(causes) + " | total |", "|---" * (4 + len(causes)) + "|"]
    for setting in SETTINGS:
        for c in CHURNS[1:]:
            for p in POLICIES:
                b = rows[(setting, c, p)]["waste_breakdown_s"]
                out.append(f"| {setting[7:]} | {int(c * 100)}% | {p} | " + " | ".join(f"{b[k]:.2f}" for k in causes)
                           + f" | {sum(b.values()):.2f} |")
    if not args.no_sensitivity:
        out += ["\n## Sensitivity to the model's switches\n",
                "Each row changes one field of `TrainSimOptions` (its default in gwtf_node/sim/train/options.py) for the "
                "policies named, same seeds; the flag in the row is `gwtf-node sim train`'s (the defaults are the "
                "daemon's behaviour); time per microbatch (min) / wasted compute (s / iteration), mean over "
                "seeds, next to the default run above; the throughput (microbatches per iteration) where it is below 8.\n",
                "| variant | " + " | ".join(f"{st[7:]} {int(c * 100)}% {p}" for st in SETTINGS for c in CHURNS[1:]
                                          for p in ("SWARM", "GWTF")) + " |",
                "|---" * (1 + 2 * len(SETTINGS) * len(CHURNS[1:])) + "|"]
        cells = []
        for st in SETTINGS:
            for c in CHURNS[1:]:
                for p in ("swarm", "gwtf"):
                    r = rows[(st, c, p)]
                    cells.append(f"{r['time_per_microbatch_s'][0] / 60:.2f} / {r['wasted_compute_s'][0]:.2f}")
        out.append("| default | " + " | ".join(cells) + " |")
        sens = {}
        for label, pols, opt, flags in VARIANTS:
            if args.variants and not any(v in label for v in args.variants):
                continue
            cells = []
            for st in SETTINGS:
                for c in CHURNS[1:]:
                    for p in ("swarm", "gwtf"):
                        if p not in pols:
                            cells.append("=")
                            continue
                        skey = "|".join((label, st, str(c), p))
                        prev = old.get("sensitivity", {}).get(skey)
                        if prev is not None:
                            sens[skey] = prev
                            t, w = prev["time_per_microbatch_s"], prev["wasted_compute_s"]
                            thr, bad = prev["throughput_per_iteration"], prev["lost_or_unfinished"]
                            cells.append(f"{t / 60:.2f} / {w:.2f}" + (f" ({thr:.1f} microb/it)" if thr < 7.99 else "")
                                         + (f" ({bad} lost/stalled)" if bad else ""))
                            continue
                        runs = [run_train(st, p, c, args.iterations, s, **opt) for s in range(args.seeds)]
                        t = ms([r["time_per_microbatch_s"] for r in runs])[0]
                        w = ms([r["wasted_compute_s"] for r in runs])[0]
                        thr = ms([r["throughput_per_iteration"] for r in runs])[0]
                        bad = sum(r["lost_microbatches"] + r["unfinished_iterations"] for r in runs)
                        sens["|".join((label, st, str(c), p))] = {"time_per_microbatch_s": t, "wasted_compute_s": w,
                                                                  "throughput_per_iteration": thr,
                                                                  "lost_or_unfinished": bad}
                        cells.append(f"{t / 60:.2f} / {w:.2f}" + (f" ({thr:.1f} microb/it)" if thr < 7.99 else "")
                                     + (f" ({bad} lost/stalled)" if bad else ""))
            out.append(f"| {label} (`{flags}`) | " + " | ".join(cells) + " |")
            print(label, flush=True)
        rows[("sensitivity",)] = sens
    md = ROOT / "docs" / "bench_churn.md"
    if md.exists() and "\n## Reading" in md.read_text():
        out.append("\n## Reading" + md.read_text().split("\n## Reading", 1)[1].rstrip("\n"))
    total_s = time.time() - t0
    took = f"{total_s:.0f} s" + (f", the main tables {main_s:.0f} s of it" if total_s - main_s >= 1 else "")
    out[1] = out[1].replace("{SECONDS}", took)  # (the header: the whole run's time, known only now)
    md.write_text("\n".join(out) + "\n")
    dump = {"|".join(map(str, k)): v for k, v in rows.items()}
    dump["config"] = {"iterations": args.iterations, "seeds": args.seeds}
    (ROOT / "docs" / "bench_churn.json").write_text(json.dumps(dump, indent=1, default=list))
    print("\n".join(out[-5:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

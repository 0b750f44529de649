#!/usr/bin/env python
"""GWTF's flows vs SWARM's routing vs random next hops, on a small internet in network namespaces.

One invocation trains the same run once per routing policy (`--policy` of
the daemon: `gwtf`, `swarm`, `random`), each time on a fresh network lab
(`gwtf_node/testing/netlab.py`, root): every node in its own namespace on the
"internet" segment, d0 also a circuit relay (`--relay-service`); with `--nat`
every second relay sits behind a home NAT router of its own (two homes reach
each other through d0).  The links between the nodes have the latencies and
bandwidths of `gwtf_node/data/geo12-links.json` (nodes placed round-robin on
its 12 locations, d0 first), emulated by the daemons themselves (`--links`:
this kernel has no netem).  The manifests are identical, so the three runs
see the same microbatches; every iteration must complete all of them.

Per policy: seconds per iteration (median of the leader's per-iteration
`seconds`, the first iteration left out: it pays the flow formation; mean and
standard deviation beside it), and the ratio to GWTF's, measured side by side
in one invocation.

    sudo python scripts/bench_internet.py [--iterations N] [--stages S] [--relays-per-stage K] [--nat] [--json]

`--json` prints one object per policy with `policy`, `seconds_per_iteration`,
`ratio_to_gwtf`, `seconds` and `losses` (the Markdown table on stderr).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gwtf_node.model.manifest import default_manifest, save_manifest  # noqa: E402
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local  # noqa: E402
from gwtf_node.testing.netlab import NetLab, lab_unavailable  # noqa: E402

LINKS = ROOT / "gwtf_node" / "data" / "geo12-links.json"
POLICIES = ("gwtf", "swarm", "random")


def run_policy(policy: str, args: argparse.Namespace, workdir: Path) -> dict:
    man = default_manifest(family="llama", stages=args.stages, hidden=args.hidden, seq_len=args.seq_len,
                           microbatch_size=args.microbatch_size, microbatches_per_iteration=args.microbatches,
                           seed=args.seed, run_name="bench-internet")
    workdir.mkdir(parents=True, exist_ok=True)
    run = workdir / "run.json"
    save_manifest(man, run)
    names = ["d0"] + [f"r{s}_{i}" for s in range(args.stages) for i in range(args.relays_per_stage)]
    with NetLab() as lab:
        where = {}
        for k, name in enumerate(names):
            label = name.replace("_", "")
            if args.nat and name != "d0" and k % 2 == 0:
                where[name] = lab.home(label).hosts[0]
            else:
                where[name] = lab.public(label)
        swarm = LocalSwarm(workdir, run, data_nodes=1, stages=args.stages, relays_per_stage=args.relays_per_stage,
                           iterations=args.iterations, links=LINKS, seed=args.seed, policy=policy,
                           relay_capacity=args.relay_capacity,
                           netns={n: node.ns for n, node in where.items()},
                           extra_args={n: ["--listen", "0.0.0.0:4001", *(["--relay-service"] if n == "d0" else [])]
                                       for n in names})
        swarm.startup_timeout_s = 180
        swarm.iteration_timeout_s = 300
        records = run_local(swarm, lambda rec: print(f"  {policy} iteration {rec['iteration']}: loss "
                                                     f"{rec['loss']:.4f} {rec['seconds']:.2f} s", file=sys.stderr))
    for rec in records:
        if rec["microbatches"] != args.microbatches:
            raise SystemExit(f"{policy}: iteration {rec['iteration']} completed {rec['microbatches']} of "
                             f"{args.microbatches} microbatches: no comparison")
    secs = [r["seconds"] for r in records[1:]] or [r["seconds"] for r in records]
    return {"policy": policy, "seconds_per_iteration": round(statistics.median(secs), 4),
            "seconds_per_iteration_mean": round(statistics.mean(secs), 4),
            "seconds_per_iteration_stdev": round(statistics.stdev(secs), 4) if len(secs) > 1 else 0.0,
            "seconds": [r["seconds"] for r in records], "losses": [round(r["loss"], 5) for r in records]}


def table(results: list[dict], args: argparse.Namespace) -> str:
    lines = [f"1 data node, {args.stages} stages x {args.relays_per_stage} relays (capacity {args.relay_capacity} "
             f"of a demand of {args.microbatches}), geo12 links{', every second relay behind NAT' if args.nat else ''}",
             "",
             "| policy | s / iteration, median | mean (stdev) | ratio to GWTF (median) |",
             "|---|---|---|---|"]
    base = next(r for r in results if r["policy"] == "gwtf")["seconds_per_iteration"]
    for r in results:
        lines.append(f"| {r['policy']} | {r['seconds_per_iteration']:.3f} | {r['seconds_per_iteration_mean']:.3f} "
                     f"({r['seconds_per_iteration_stdev']:.3f}) | {r['seconds_per_iteration'] / base:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=6, help="per iteration")
    p.add_argument("--relay-capacity", type=int, default=3, help="microbatches a relay holds at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--relays-per-stage", type=int, default=3)
    p.add_argument("--nat", action="store_true", help="every second relay behind a home NAT router of its own")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of gwtf,swarm,random")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    why = lab_unavailable()
    if why is not None:
        print(f"bench_internet: the network lab cannot be made here: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the lab and the swarm are taken down
    policies = [q for q in args.policies.split(",") if q]
    if "gwtf" not in policies:
        policies.insert(0, "gwtf")
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        print(f"bench_internet: --policies {', '.join(unknown)}: use gwtf, swarm, random", file=sys.stderr)
        return 2
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gwtf-bench-internet-"))
    results = []
    for policy in policies:
        print(f"{policy}: training {args.iterations} iterations in {workdir / policy}", file=sys.stderr)
        results.append(run_policy(policy, args, workdir / policy))
    base = next(r for r in results if r["policy"] == "gwtf")["seconds_per_iteration"]
    for r in results:
        r["ratio_to_gwtf"] = round(r["seconds_per_iteration"] / base, 4)
    if args.json:
        for r in results:
            print(json.dumps(r))
        print(table(results, args), file=sys.stderr)
    else:
        print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

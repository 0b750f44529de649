#!/usr/bin/env python
"""Top-K on slow links (FusionLLM section 5): none vs uniform Top-K vs AdaTopK on a local swarm with geo links.

One invocation trains the same run three times, once per `train.compression`
(`none`, `topk`, `adatopk`, same ratio r), each on a fresh local swarm of
separate daemon processes (`gwtf_node/runtime/local/swarm.py`): 1 data node, 2
stages x 2 relays by default (`--stages`, `--relays-per-stage`), the links
between them emulated from `gwtf_node/data/geo12-links.json` (nodes placed
round-robin on its locations: d0 Australia, r0_0 Belgium, r0_1 Canada, r1_0
Germany, r1_1 Iowa; `--locations` lists other ones to place them on).  The
manifests differ only in the compression, so the three runs see the same
microbatches in the same order (equal samples); every iteration must complete
all of its microbatches, or the run is reported as failed.

Per method: seconds per iteration (median of the leader's per-iteration
`seconds`, robust to other work on the machine; the mean and standard
deviation beside it; the first iteration left out: it pays the flow
formation and the first torch calls), the loss of the last iteration, its gap to `none`, and
the link ratios the senders chose (their log lines).

    python scripts/bench_compression.py [--iterations N] [--ratio R] [--json] [--plot docs/bench_compression.png]
        [--stages S --relays-per-stage K --locations Germany,NL,Iowa,Belgium]

`--gradients aligned,topk` runs each compressed method once per rule for the
gradient of a sparse activation (`train.compression_gradients`; default:
`aligned` only).

`--centralized` measures the loss side without a swarm: the centralized chain
trained with the Top-K of each method at its crossings (`model/crossings.py`),
on the path d0 -> r0_0 -> r1_0 -> ... -> d0 with the ratios Equation 7 gives
those links among all the swarm's links (the same placement and rule as the
senders of a swarm); no seconds per iteration then.

`--json` prints one object per method with `method`, `gradients`,
`seconds_per_iteration`, `final_loss`, `loss_gap_vs_none`, `last10_loss` (the
mean of the last 10 iterations), `losses`, `seconds` and `link_ratios` (and
the Markdown table on stderr); the table goes to stdout otherwise (docs/bench_compression.md holds a run).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gwtf_node.model.adatopk import (  # noqa: E402
    Compression, Gradients, link_ratio, pipeline_link, sparse_overhead, transfer_s,
)
from gwtf_node.model.crossings import Crossings  # noqa: E402
from gwtf_node.model.manifest import default_manifest, save_manifest  # noqa: E402
from gwtf_node.model.reference import train_centralized  # noqa: E402
from gwtf_node.runtime.net.linkspec import resolve_links  # noqa: E402
from gwtf_node.runtime.local.swarm import LocalSwarm, run_local  # noqa: E402

LINKS = ROOT / "gwtf_node" / "data" / "geo12-links.json"
METHODS = ("none", "topk", "adatopk")
_RATIO_LINE = re.compile(r"compression (\w+) to (\S+): ratio ([0-9.]+)")


def links_file(args: argparse.Namespace, workdir: Path) -> Path:
    """geo12 as published, or with its locations listed in the order `--locations` gives (nodes are placed
    round-robin on that list, in the order d0, r0_0, r0_1, ..., r1_0, ...; the links between locations stay)."""
    if not args.locations:
        return LINKS
    geo = json.loads(LINKS.read_text())
    order = args.locations.split(",")
    unknown = sorted(set(order) - set(geo["locations"]))
    if unknown:
        raise SystemExit(f"--locations: {', '.join(unknown)} not in {LINKS.name} ({', '.join(geo['locations'])})")
    geo["locations"] = order
    path = workdir / "geo12-placed.json"
    path.write_text(json.dumps(geo))
    return path


def _manifest(method: str, gradients: str, args: argparse.Namespace):
    return default_manifest(family="llama", stages=args.stages, hidden=args.hidden, seq_len=args.seq_len,
                            microbatch_size=args.microbatch_size, microbatches_per_iteration=args.microbatches,
                            seed=args.seed, compression=method, compression_ratio=args.ratio,
                            compression_gradients=gradients, run_name=f"bench-compression-{method}")


def swarm_names(args: argparse.Namespace) -> list[str]:
    return ["d0"] + [f"r{k}_{i}" for k in range(args.stages) for i in range(args.relays_per_stage)]


def chain_crossings(method: str, gradients: str, args: argparse.Namespace, workdir: Path) -> Crossings | None:
    """The Top-K of `method` at the crossings of the path d0 -> r0_0 -> ... -> d0, with the ratios the senders
    of the swarm choose (`runtime/node/linkcompress.py`: Equation 7 over all the pipeline's links)."""
    if method == "none":
        return None
    names = swarm_names(args)
    bw = {(ln["a"], ln["b"]): ln["bandwidth_mbps"]
          for ln in resolve_links(links_file(args, workdir), names)["links"]}
    stage = {n: (-1 if n == "d0" else int(n[1:].split("_")[0])) for n in names}
    last = args.stages - 1
    slowest = min(bw[(a, b)] for a in names for b in names if a != b and pipeline_link(stage[a], stage[b], last))
    path = ["d0"] + [f"r{k}_0" for k in range(args.stages)] + ["d0"]
    c = sparse_overhead(4)

    def ratio(a: str, b: str) -> float:
        return link_ratio(Compression(method), args.ratio, transfer_s(1, bw[(a, b)]), transfer_s(1, slowest), c)

    hops = list(zip(path, path[1:]))
    return Crossings([ratio(a, b) for a, b in hops], [ratio(b, a) for a, b in hops], Gradients(gradients))


def run_centralized(method: str, gradients: str, args: argparse.Namespace, workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cross = chain_crossings(method, gradients, args, workdir)
    res = train_centralized(_manifest(method, gradients, args), args.iterations, crossings=cross,
                            on_iteration=lambda t, loss: print(f"  {method}/{gradients} iteration {t}: loss "
                                                                 f"{loss:.4f}", file=sys.stderr))
    ratios = {} if cross is None else {f"crossing {i}": [round(f, 2), round(b, 2)]
                                       for i, (f, b) in enumerate(zip(cross.forward, cross.backward))}
    return {"method": method, "gradients": gradients if method != "none" else None,
            "ratio": args.ratio if method != "none" else None, "seconds_per_iteration": None,
            "final_loss": round(res.losses[-1], 5), "losses": [round(x, 5) for x in res.losses],
            "link_ratios": ratios}


def run_method(method: str, gradients: str, args: argparse.Namespace, workdir: Path) -> dict:
    man = _manifest(method, gradients, args)
    workdir.mkdir(parents=True, exist_ok=True)
    run = workdir / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(workdir, run, data_nodes=1, stages=args.stages, relays_per_stage=args.relays_per_stage,
                       iterations=args.iterations, links=links_file(args, workdir), seed=args.seed)
    swarm.iteration_timeout_s = 300
    records = run_local(swarm, lambda rec: print(f"  {method} iteration {rec['iteration']}: loss {rec['loss']:.4f} "
                                                 f"{rec['seconds']:.2f} s", file=sys.stderr))
    for rec in records:
        if rec["microbatches"] != args.microbatches:
            raise SystemExit(f"{method}: iteration {rec['iteration']} completed {rec['microbatches']} of "
                             f"{args.microbatches} microbatches: the samples are not equal, no comparison")
    ratios: dict[str, float] = {}
    for name in swarm.names():
        log = workdir / name / "node.log"
        if log.exists():
            for m in _RATIO_LINE.finditer(log.read_text(errors="replace")):
                ratios[f"{name}->{m.group(2)}"] = float(m.group(3))
    secs = [r["seconds"] for r in records[1:]] or [r["seconds"] for r in records]
    act_bytes = args.microbatch_size * args.seq_len * args.hidden * 4
    return {"method": method, "gradients": gradients if method != "none" else None,
            "ratio": args.ratio if method != "none" else None,
            "seconds_per_iteration": round(statistics.median(secs), 4),
            "seconds_per_iteration_mean": round(statistics.mean(secs), 4),
            "seconds_per_iteration_stdev": round(statistics.stdev(secs), 4) if len(secs) > 1 else 0.0,
            "seconds": [r["seconds"] for r in records],
            "final_loss": round(records[-1]["loss"], 5), "losses": [round(r["loss"], 5) for r in records],
            "activation_bytes": act_bytes, "link_ratios": dict(sorted(ratios.items()))}


def _label(r: dict) -> str:
    if r["ratio"] is None:
        return r["method"]
    return f"{r['method']} (r={r['ratio']:g}, {r['gradients']} gradients)"


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        secs = "" if r["seconds_per_iteration"] is None else f": {r['seconds_per_iteration']:.2f} s/it"
        ax.plot(range(len(r["losses"])), r["losses"], label=_label(r) + secs)
    ax.set_xlabel("iteration (equal samples)")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _gap(loss: float, base: float) -> str:
    return f"{100 * (loss - base) / base:+.2f} %"


def _last10(r: dict) -> float:
    """The mean loss of the last 10 iterations (one iteration's 4 microbatches move by several % from the next)."""
    tail = r["losses"][-10:]
    return sum(tail) / len(tail)


def table(results: list[dict], args: argparse.Namespace) -> str:
    base = next(r for r in results if r["method"] == "none")
    timed = base["seconds_per_iteration"] is not None
    lines = ["| method | ratio r | gradients | s / iteration, median | mean (stdev) | speed-up vs none (median) "
             "| final loss | loss vs none | mean loss, last 10 | vs none |" if timed else
             "| method | ratio r | gradients | final loss | loss vs none | mean loss, last 10 | vs none |",
             "|---|---|---|---|---|---|---|---|---|---|" if timed else "|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:g}"
        head = f"| {r['method']} | {ratio} | {r['gradients'] or '-'} |"
        if timed:
            head += (f" {r['seconds_per_iteration']:.3f} | {r['seconds_per_iteration_mean']:.3f} "
                     f"({r['seconds_per_iteration_stdev']:.3f}) | "
                     f"{base['seconds_per_iteration'] / r['seconds_per_iteration']:.2f}x |")
        lines.append(f"{head} {r['final_loss']:.4f} | {_gap(r['final_loss'], base['final_loss'])} | "
                     f"{_last10(r):.4f} | {_gap(_last10(r), _last10(base))} |")
    n = len(base["losses"])
    marks = sorted({min(n - 1, i) for i in range(9, n, 10)} | {n - 1})
    lines += ["", "Loss at equal samples along the run (gap to `none`):", "",
              "| iteration | " + " | ".join(_label(r) for r in results) + " |",
              "|---|" + "---|" * len(results)]
    for i in marks:
        cells = [f"{r['losses'][i]:.3f}" + ("" if r is base else f" ({_gap(r['losses'][i], base['losses'][i])})")
                 for r in results]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios per link (1: dense)" + (" the senders chose:" if timed else
                                                  ", forward and backward, at each crossing of the chain:"), ""]
    for r in results:
        if r["link_ratios"]:
            shown = ", ".join(f"{k} {v}" if isinstance(v, list) else f"{k} {v:g}" for k, v in r["link_ratios"].items())
            lines.append(f"- {_label(r)}: {shown}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--ratio", type=float, default=10.0, help="the run's Top-K ratio r (keeps 1/r of the elements)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatch-size", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=4, help="per iteration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--relays-per-stage", type=int, default=2)
    p.add_argument("--locations", default=None,
                   help="comma-separated geo12 locations to place the nodes on, round-robin (default: the file's order)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of none,topk,adatopk")
    p.add_argument("--gradients", default="aligned",
                   help="comma-separated rules for the gradient of a sparse activation: aligned,topk")
    p.add_argument("--centralized", action="store_true",
                   help="train the centralized chain with each method's Top-K at its crossings (loss only, no swarm)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--plot", default=None, help="write the loss curves to this PNG")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    # SIGTERM unwinds like Ctrl-C, so that run_local takes its swarm down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    rules = [g for g in args.gradients.split(",") if g]
    bad_rules = sorted(set(rules) - {g.value for g in Gradients})
    if unknown or bad_rules or not rules:
        raise SystemExit(f"--methods takes {','.join(METHODS)} and --gradients aligned,topk "
                         f"(got {args.methods!r}, {args.gradients!r})")
    if "none" not in methods:
        methods.insert(0, "none")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gwtf-bench-compression-"))
    run = run_centralized if args.centralized else run_method
    results = []
    for method in methods:
        for rule in rules if method != "none" else rules[:1]:
            where = workdir / (method if method == "none" else f"{method}-{rule}")
            print(f"{method} ({rule} gradients): training {args.iterations} iterations"
                  + ("" if args.centralized else f" in {where}"), file=sys.stderr)
            results.append(run(method, rule, args, where))
    base = results[0]["final_loss"]
    for r in results:
        r["loss_gap_vs_none"] = round((r["final_loss"] - base) / base, 5)
        r["last10_loss"] = round(_last10(r), 5)
    if args.plot:
        plot(results, Path(args.plot), ("Centralized chain with Top-K crossings" if args.centralized
                                        else "Top-K on geo links") + f": 1 data node, {args.stages} stages x "
                                       f"{args.relays_per_stage} relays")
    if args.json:
        for r in results:
            print(json.dumps(r))
        print(table(results, args), file=sys.stderr)  # the same figures, readable
    else:
        print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

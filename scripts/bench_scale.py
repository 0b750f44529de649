#!/usr/bin/env python
"""A model of 100M+ parameters on home broadband: throughput against its bound, wire bytes, loss, memory per node.

One invocation trains the same run once per wire setting (`--settings`):

    fp32           fp32 compute, fp32 activations and gradients on every link
    bf16           bf16-mixed compute (fp32 master weights), bf16 on every link
    bf16+adatopk   as bf16, with FusionLLM's AdaTopK (Equation 7) on every link

each time on a fresh network lab (`gwtf_node/testing/netlab.py`, root): 1
data node and `--relays-per-stage` relays on each of `--stages` stages, every
node a public host in a namespace of its own.

Links.  Each node's uplink veth carries a `tbf` at the node's rate on both
ends (`--rates` Mbit/s, round-robin over d0, r0_0, r0_1, r1_0, ...): upload
and download capped, shared by all its traffic.  The daemons emulate a
seeded one-way latency per pair from `--latency-ms` (`--links`; no netem
here).  Their emulation would also serialize each frame at the declared
bandwidth, on top of the tbf, so the links file declares
`DECLARED_BANDWIDTH_SCALE` x the physical min(rate_a, rate_b): their own
serialization is negligible, AdaTopK's ratios (which depend only on the
ratios of the bandwidths) are the physical ones, and Equation 1's bandwidth
term is understated by that factor.

CPU shares (`--cpu-shares`).  The nine nodes share the machine's cores,
and the bound lets its flow share them as it needs: the data node computes
every microbatch's embedding, head and loss, a relay its share of its stage.
The kernel gives every node's session an equal share instead, which starves
the data node, the pipeline's busiest.  With `flow` (the default) each
node's process runs at the nice level that makes its CPU weight proportional
to what its part costs an iteration (`calibrate`'s figures; about 1.25x a
level), the busiest at 0, as the bound assumes; with `equal`,
every node at 0.

Checkpoints.  Each node checkpoints after every `--checkpoint-every`
iterations (10 by default: for a 100M+ model a checkpoint is 0.3-0.5 GB
per node, taken after the step and written in the background while the
next iteration runs, runtime/node/checkpointer.py); a run shorter than that
writes one as each node stops, after the measured window.

Figures per setting:

* tokens_per_s: tokens of iterations 1..N-1 over the wall time from the end
  of iteration 0 to the end of the last (iteration 0 pays the start).
* wire_bytes_per_token: bytes of activations and their gradients the nodes
  sent (status.json `compression.sent_bytes`: after the wire dtype and
  Top-K), over all iterations' tokens; `lab_bytes_per_token`: every byte the
  nodes' veths sent (also the within-stage all-reduce, control messages and
  the start), from the kernel's counters.
* final_loss: the last iteration's loss (the same microbatches everywhere).
* peak_memory_mb: per node, its peak RSS (status.json `resources`) less that
  of a process that only imported what a node imports (`baseline_rss_mb`);
  estimated_memory_mb: model/memory.py's estimate of its part holding what
  it carried (the data node the iteration's microbatches, a relay the most
  it carried in one iteration: `carried_microbatches`, from its log).
* bound_tokens_per_s (`gwtf_node/sim/bound.py`, `swarm_bound`): the
  maximum flow of microbatches per second through the stages, each node a
  split vertex whose capacity is the least of its compute rate and its
  link's rate over the bytes it sends per microbatch (about as many come
  in), each link between adjacent stages an edge of capacity min(uplink,
  downlink) over the bytes per microbatch crossing it.  The nodes share
  the machine's `--cores`, and the CPU is a capacity of its own: a unit of
  flow through a node costs its part's CPU seconds per microbatch, and the
  flow's cost per second must fit in the cores (a min-cost flow, bisected
  on its value).  A part's compute rate and cost come from `calibrate`:
  what its node computes for a microbatch (a relay's gradients held and
  added in chunks, the data node's head gradients in chunks) timed alone
  on one thread (CPU time) before the swarm starts.  The nodes' own `compute_ms_per_microbatch` is wall
  time in the swarm, which counts the waiting for a core shared with eight
  other nodes (and whatever else the machine runs): it is reported beside
  (`compute_s_per_microbatch`), as is the CPU the swarm's processes used
  (`cores_used`: all their work, compute and the rest, per second).
  utilization = tokens_per_s / bound_tokens_per_s.
  The bound leaves out what an iteration does once whatever its tokens:
  the within-stage all-reduce and the optimizer step.
  `iteration_bound_tokens_per_s` adds to the pipeline time of an iteration
  at the bound the all-reduce at the links' rates (each relay sends and
  receives 2(n-1)/n of its stage's gradient at its own rate, in the wire
  dtype: float32, or bfloat16 with `bf16` on the wire) and
  the steps (each part's gradient vector and AdamW update timed alone by
  `calibrate`: the slowest, or all of them over the cores if more);
  `iteration_utilization` = tokens_per_s / that.
  `other_jobs_cores`: the CPU the machine's other processes used during the
  window (/proc/stat less the swarm's own), in cores: the bound gives the
  swarm all `--cores`, so a shared machine lowers the utilization.
* swarm_cpu_s_per_microbatch: per node, the CPU seconds a microbatch it
  carried cost it in the swarm (`swarm_cpu`: its torch worker's compute, a
  relay's products, the process outside torch) over the window, against
  `calibrate`'s alone; `swarm_cpu_bound_tokens_per_s` is the same maximum
  flow with these costs (`swarm_cpu_utilization` = tokens_per_s / it), and
  `pipeline_cpu_bound_tokens_per_s` with compute and outside torch only,
  against the pipeline's tokens/s (`pipeline_cpu_utilization`): how much
  of the gap is the CPU a microbatch costs nine nodes sharing the cores.

    sudo python scripts/bench_scale.py [--hidden H --layers L | --preset NAME] [--iterations N] [--json]

`--json` prints one object per setting (the Markdown table on stderr); `--reestimate FILE` runs nothing and
prints the table of a saved `--json` output (the same flags) with this build's memory estimates.
Every iteration must complete all its microbatches, else the script says so
and exits 1.  The lab (namespaces, processes) is taken down on every exit
path, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import _thread
import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_scale_measure import (aggregation_breakdown, allreduce_s, apply_nice, calibrate, carried, cpu_busy_s,  # noqa: E402
                                 flow_nice, node_figures, part_key, read_text, swarm_bound, swarm_cpu)

SETTINGS = {
    "fp32": {"precision": "fp32", "wire_dtype": "fp32", "compression": "none"},
    "bf16": {"precision": "bf16-mixed", "wire_dtype": "bf16", "compression": "none"},
    "bf16+adatopk": {"precision": "bf16-mixed", "wire_dtype": "bf16", "compression": "adatopk"},
}
DECLARED_BANDWIDTH_SCALE = 1000.0  # the links file's bandwidth over the physical one (module doc)
STATUS_SETTLE_S = 2.5  # status.json is rewritten every second: wait for one written after the last step


def manifest_for(setting: str, args: argparse.Namespace):
    """The run of one setting: the same model, data and seed in every setting, only `train`'s wire fields differ."""
    from gwtf_node.model.manifest import TrainSpec, default_manifest

    fields = {f.name for f in dataclasses.fields(TrainSpec)}
    wanted = {k: v for k, v in SETTINGS[setting].items() if not (k != "compression" and v == "fp32")}
    missing = sorted(set(wanted) - fields)
    if missing:
        raise SystemExit(f"bench_scale: setting {setting} needs train.{', train.'.join(missing)}, which this build's "
                         "manifest lacks: leave it out of --settings")
    shape: dict = {"family": "llama", "layers": args.layers, "hidden": args.hidden}
    if args.preset:
        try:
            from gwtf_node.model.hfconfig import family_config
            from gwtf_node.model.presets import PRESETS, preset_config
        except ImportError:
            raise SystemExit("bench_scale: this build has no model presets: give --hidden and --layers") from None
        if args.preset not in PRESETS or PRESETS[args.preset] is None:
            raise SystemExit(f"bench_scale: --preset {args.preset}: use one of "
                             f"{', '.join(k for k, v in PRESETS.items() if v is not None)}")
        family, config, _ = family_config(preset_config(args.preset))
        shape = {"family": family, "config": config}
    man = default_manifest(stages=args.stages, seq_len=args.seq_len, microbatch_size=args.microbatch_size,
                           microbatches_per_iteration=args.microbatches, lr=args.lr, seed=args.seed,
                           run_name="bench-scale", compression_ratio=args.compression_ratio, **shape)
    return dataclasses.replace(man, train=dataclasses.replace(man.train, **wanted))


def parameter_counts(man) -> tuple[int, list[int]]:
    """Parameters of the whole model the manifest describes, and of each relay stage's layers (its skeleton on the
    meta device: no memory)."""
    import re

    from gwtf_node.model.materialize import build_skeleton

    model = build_skeleton(man)
    per_layer: dict[int, int] = {}
    for name, p in model.named_parameters():
        m = re.match(r"(?:model\.layers|transformer\.h)\.(\d+)\.", name)
        if m:
            per_layer[int(m[1])] = per_layer.get(int(m[1]), 0) + p.numel()
    return sum(p.numel() for p in model.parameters()), [sum(per_layer.get(i, 0) for i in range(a, b))
                                                         for a, b in man.stages]


def memory_estimates(man, names: list[str], capacity: dict[str, int]) -> dict[str, dict | None]:
    """Each node's estimate from the manifest (model/memory.py `estimate`, holding `capacity[node]` microbatches):
    `part_mb`, its part without the process, and `total_mb` with the process's fixed overhead; None where this
    build has no estimate."""
    try:
        from gwtf_node.model import memory
    except ImportError:
        return {n: None for n in names}
    out = {}
    for n in names:
        k = part_key(n)
        role, stage = ("data", None) if k < 0 else ("relay", k)
        est = memory.estimate(man, role, stage, capacity[n])
        out[n] = {"part_mb": round(est.part_bytes / 2**20, 1), "total_mb": round(est.total / 2**20, 1)}
    return out


BASELINE_PROBE = """
import resource, torch, gwtf_node.cli, gwtf_node.runtime.node.node, gwtf_node.model.stages
from transformers import GPT2LMHeadModel, LlamaForCausalLM
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def capacities(names: list[str], args: argparse.Namespace, most: dict | None = None) -> dict[str, int]:
    """The microbatches each node carries in an iteration, what its estimate holds (model/memory.py): the data node
    the iteration's; a relay the most it carried in one iteration (`most`, from its log: the flows may send one
    relay of a stage more than its share, and its held gradients grow with them), else its share."""
    relay = -(-args.microbatches // args.relays_per_stage)
    return {n: args.microbatches if n.startswith("d") else (most or {}).get(n) or relay for n in names}


def reestimate(path: Path, args: argparse.Namespace) -> list[dict]:
    """The results saved in `path` (--json's lines, measured with the same flags), their memory estimates made
    again by this build's model/memory.py; the measured peaks do not depend on it."""
    results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in results:
        names = list(r["peak_memory_mb"])
        est = memory_estimates(manifest_for(r["setting"], args), names,
                               capacities(names, args, r.get("carried_microbatches")))
        r["estimated_memory_mb"] = {n: e["part_mb"] for n, e in est.items()}
        r["estimated_total_mb"] = {n: e["total_mb"] for n, e in est.items()}
    return results


def baseline_rss_mb() -> float:
    """Peak resident memory of a process that imported what a node imports before it builds its part."""
    out = subprocess.run([sys.executable, "-c", BASELINE_PROBE], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise SystemExit(f"bench_scale: the baseline process failed: {out.stderr.strip()[-500:]}")
    return float(out.stdout.split()[-1])


def node_rates(names: list[str], rates: list[float]) -> dict[str, float]:
    return {n: rates[i % len(rates)] for i, n in enumerate(names)}


def links_file(names: list[str], rates: dict[str, float], lat: tuple[float, float], seed: int, path: Path) -> dict:
    """A scenario links file (runtime/net/linkspec.py) of every pair: the seeded one-way latency, the declared
    bandwidth (module doc); returns {(a, b): latency_ms}."""
    rng = random.Random(f"bench-scale-latency:{seed}")
    links, latency = [], {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ms = round(rng.uniform(*lat), 1)
            latency[(a, b)] = latency[(b, a)] = ms
            links.append({"a": a, "b": b, "latency_ms": ms,
                          "bandwidth_mbps": min(rates[a], rates[b]) * DECLARED_BANDWIDTH_SCALE})
    path.write_text(json.dumps({"links": links}, indent=1))
    return latency


def read_status(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def tx_bytes(ns: str) -> int:
    """Bytes the node's uplink sent (the kernel's counter of its eth0)."""
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", "eth0"], capture_output=True,
                         text=True, timeout=20)
    link = json.loads(out.stdout)[0]
    return int((link.get("stats64") or link["stats"])["tx"]["bytes"])


def mem_available_mb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


class MemoryGuard:
    """Stops the swarm when the machine's available memory falls below `floor_mb` (the nodes of a large model
    share one machine: better a failed setting than the kernel's OOM killer choosing among everyone's processes)."""

    def __init__(self, swarm, floor_mb: float) -> None:
        self.swarm, self.floor_mb = swarm, floor_mb
        self.fired: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            free = mem_available_mb()
            if free is not None and free < self.floor_mb:
                self.fired = f"the machine had {free:.0f} MiB available, under --min-available-mb {self.floor_mb:.0f}"
                self.swarm.expected_dead.update(self.swarm.procs)  # the launcher then reports no crash of its own
                self.swarm.stop(grace_s=2.0)
                _thread.interrupt_main()  # the launcher's wait ends now, not at its timeout
                return


def run_setting(setting: str, args: argparse.Namespace, workdir: Path, baseline: float) -> dict:
    from gwtf_node.model.manifest import save_manifest
    from gwtf_node.runtime.local.swarm import LocalError, LocalSwarm
    from gwtf_node.testing.netlab import NetLab

    man = manifest_for(setting, args)
    workdir.mkdir(parents=True, exist_ok=True)
    run = workdir / "run.json"
    save_manifest(man, run)
    names = ["d0"] + [f"r{s}_{i}" for s in range(args.stages) for i in range(args.relays_per_stage)]
    rates = node_rates(names, args.rates)
    links_file(names, rates, args.latency_ms, args.seed, workdir / "links-scenario.json")
    records, first, last = [], None, None
    tokens_per_mb = args.microbatch_size * args.seq_len
    part_cpu, step_cpu = calibrate(run)  # (before the swarm: nothing else runs meanwhile)
    nice = flow_nice(part_cpu, capacities(names, args)) if args.cpu_shares == "flow" else dict.fromkeys(names, 0)
    with NetLab() as lab:
        where = {n: lab.public(n.replace("_", "")) for n in names}
        for n, node in where.items():
            lab.shape(node, rates[n])
        swarm = LocalSwarm(workdir, run, data_nodes=1, stages=args.stages, relays_per_stage=args.relays_per_stage,
                           iterations=args.iterations, links=workdir / "links-scenario.json", seed=args.seed,
                           netns={n: node.ns for n, node in where.items()},
                           fork_server=False,  # (each node its own process: the memory baseline is one such)
                           extra_args={n: ["--listen", "0.0.0.0:4001", "--keep-checkpoints", "1",
                                           "--checkpoint-every", str(args.checkpoint_every)] for n in names})
        swarm.startup_timeout_s = args.startup_timeout
        swarm.iteration_timeout_s = args.iteration_timeout
        guard = MemoryGuard(swarm, args.min_available_mb)
        try:
            with guard:
                swarm.start()
                apply_nice({n: p.pid for n, p in swarm.procs.items()}, nice)
                for rec in swarm.iterations_done():
                    records.append(rec)
                    print(f"  {setting} iteration {rec['iteration']}: loss {rec['loss']:.4f}, {rec['microbatches']} "
                          f"microbatches, {rec['seconds']:.1f} s (aggregation {rec['aggregation_seconds']:.1f} s)",
                          file=sys.stderr)
                    if rec["iteration"] == 0:
                        first = {n: read_status(swarm.state_dir(n)) for n in names}
                        busy0 = cpu_busy_s()
                time.sleep(STATUS_SETTLE_S)
            last = {n: read_status(swarm.state_dir(n)) for n in names}
            busy1 = cpu_busy_s()
            sent_on_wire = {n: tx_bytes(node.ns) for n, node in where.items()}
        except KeyboardInterrupt:
            if guard.fired:
                raise SystemExit(f"bench_scale: {setting}: stopped: {guard.fired}") from None
            raise
        except LocalError as e:
            raise SystemExit(f"bench_scale: {setting}: {e}") from None
        finally:
            swarm.stop()
            for n in names:  # a relay's checkpoints are its stage's whole state: gigabytes per setting
                shutil.rmtree(swarm.state_dir(n) / "checkpoints", ignore_errors=True)
                (swarm.state_dir(n) / "checkpoint.pt").unlink(missing_ok=True)
    short = [f"iteration {r['iteration']}: {r['microbatches']} of {args.microbatches}" for r in records
             if r["microbatches"] != args.microbatches]
    if short or len(records) < args.iterations:
        raise SystemExit(f"bench_scale: {setting}: not every iteration completed all its microbatches ("
                         f"{'; '.join(short) or f'{len(records)} of {args.iterations} iterations'}): no figures")
    (workdir / "statuses.json").write_text(json.dumps({"after_iteration_0": first, "end": last}))
    missing = [n for n in names if not first.get(n) or not last.get(n)]
    if missing:
        raise SystemExit(f"bench_scale: {setting}: no status.json from {', '.join(missing)}")
    window = {}
    for n in names:
        a, b = node_figures(first[n]), node_figures(last[n])
        window[n] = {k: b[k] - a[k] for k in a}
    steady = records[1:]
    tokens = sum(r["microbatches"] for r in steady) * tokens_per_mb
    wall = records[-1]["time"] - records[0]["time"]
    pipeline = sum(r["pipeline_seconds"] for r in steady if r["pipeline_seconds"] == r["pipeline_seconds"])
    # the machine's other jobs: the CPU all processes used over the window less the swarm's own
    span = max(w["seconds"] for w in window.values())
    other_cores = max(0.0, (busy1 - busy0) - sum(w["cpu_s"] for w in window.values())) / max(span, 1e-9)
    bound = swarm_bound(last, window, rates, args.cores, part_cpu)
    spent = swarm_cpu(window)  # what a microbatch cost each node in the swarm, against `calibrate`'s alone
    own = {k: swarm_bound(last, window, rates, args.cores, part_cpu, {n: c[p] for n, c in spent.items()})
           for k, p in (("all", "total"), ("pipeline", "pipeline"))}
    own_tps = {k: b["microbatches_per_s"] * tokens_per_mb for k, b in own.items()}
    all_tokens = sum(r["microbatches"] for r in records) * tokens_per_mb
    sent = sum(node_figures(last[n])["sent_bytes"] for n in names)
    dense = sum(node_figures(last[n])["dense_bytes"] for n in names)
    tps = tokens / wall
    bound_tps = bound["microbatches_per_s"] * tokens_per_mb
    params, stage_params = parameter_counts(man)
    reduce_s = allreduce_s(stage_params, [[rates[f"r{k}_{i}"] for i in range(args.relays_per_stage)]
                                          for k in range(args.stages)],
                           2 if SETTINGS[setting]["wire_dtype"] == "bf16" else 4)
    # the steps run at once on every node after the all-reduce: the slowest alone, or all of them on the cores
    node_steps = [step_cpu[part_key(n)] for n in names]
    step_s = max(max(node_steps), sum(node_steps) / args.cores)
    iter_bound_s = (args.microbatches / bound["microbatches_per_s"] if bound["microbatches_per_s"] else math.inf) \
        + reduce_s + step_s
    peak = {n: round(last[n]["resources"]["peak_rss_mb"] - baseline, 1) for n in names}
    most = {n: carried(workdir / n / "node.log") for n in names if n[0] == "r"}
    est = memory_estimates(man, names, capacities(names, args, most))
    return {
        "setting": setting, **SETTINGS[setting], "params": params, "stage_params": stage_params,
        "tokens_per_s": round(tps, 2), "bound_tokens_per_s": round(bound_tps, 2),
        "utilization": round(tps / bound_tps, 3) if bound_tps > 0 else None,
        # the bound with each iteration's all-reduce at the links' rates added to its pipeline time
        "allreduce_bound_s": round(reduce_s, 3), "step_bound_s": round(step_s, 3),
        "iteration_bound_tokens_per_s": round(args.microbatches * tokens_per_mb / iter_bound_s, 2),
        "iteration_utilization": round(tps * iter_bound_s / (args.microbatches * tokens_per_mb), 3),
        "other_jobs_cores": round(other_cores, 3),
        "pipeline_tokens_per_s": round(tokens / pipeline, 2) if pipeline > 0 else None,
        "bound_limited_by": bound["limited_by"], "bound_flow_only_tokens_per_s": round(
            bound["flow_only"] * tokens_per_mb, 2),
        "wire_bytes_per_token": round(sent / all_tokens, 1), "dense_fp32_bytes_per_token": round(dense / all_tokens, 1),
        "lab_bytes_per_token": round(sum(sent_on_wire.values()) / all_tokens, 1),
        "final_loss": records[-1]["loss"], "losses": [r["loss"] for r in records],
        "seconds": [r["seconds"] for r in records], "aggregation_seconds": [r["aggregation_seconds"] for r in records],
        # from the data node's step to its next iteration's start: the relays' all-reduce and step, CAN TAKE
        "presumed_dead": sum(read_text(workdir / n / "node.log").count(" presumed dead: ") for n in names),
        "relay_aggregation_s": aggregation_breakdown([workdir / n / "node.log" for n in names if n[0] == "r"]),
        "between_iterations_s": round(sum(b["time"] - a["time"] - b["seconds"] for a, b in zip(records, steady))
                                      / len(steady), 3),
        "peak_memory_mb": peak, "peak_rss_mb": {n: last[n]["resources"]["peak_rss_mb"] for n in names},
        "baseline_rss_mb": round(baseline, 1), "estimated_memory_mb": {n: e and e["part_mb"] for n, e in est.items()},
        "estimated_total_mb": {n: e and e["total_mb"] for n, e in est.items()}, "carried_microbatches": most,
        "compute_ms_per_microbatch": {n: last[n]["compute_ms_per_microbatch"] for n in names},
        "compute_s_per_microbatch": {n: round(w["compute_s"] / max(w["microbatches"], 1e-9), 3)
                                     for n, w in window.items()},
        "part_cpu_s_per_microbatch": {str(k): round(v, 4) for k, v in part_cpu.items()},
        "swarm_cpu_s_per_microbatch": spent,
        "swarm_cpu_bound_tokens_per_s": round(own_tps["all"], 2),
        "swarm_cpu_utilization": round(tps / own_tps["all"], 3) if own_tps["all"] > 0 else None,
        "pipeline_cpu_bound_tokens_per_s": round(own_tps["pipeline"], 2),
        "pipeline_cpu_utilization": round(tokens / pipeline / own_tps["pipeline"], 3)
        if pipeline > 0 and own_tps["pipeline"] > 0 else None,
        "cores_used": bound["cores_used"], "cpu_shares": args.cpu_shares, "nice": nice,
        "link_ratios": {n: last[n]["compression"]["link_ratios"] for n in names
                        if last[n]["compression"]["link_ratios"]},
        "rates_mbit": rates,
    }


def table(results: list[dict], args: argparse.Namespace) -> str:
    r0 = results[0]
    model = f"preset {args.preset}" if args.preset else f"llama, hidden {args.hidden}, {args.layers} layers"
    lines = [f"{r0['params'] / 1e6:.1f}M parameters ({model}), 1 data node + "
             f"{args.stages} stages x {args.relays_per_stage} relays, {args.microbatches} microbatches of "
             f"{args.microbatch_size} x {args.seq_len} tokens per iteration, {args.iterations} iterations; uplinks "
             f"{'/'.join(f'{r:g}' for r in args.rates)} Mbit/s (tbf), one-way latency {args.latency_ms[0]:g}-"
             f"{args.latency_ms[1]:g} ms; {args.cores:g} cores shared", "",
             "| setting | tokens/s | bound (limited by) | utilization | bound with all-reduce and step | utilization | "
             "cores used | other jobs' cores | between iterations s | wire B/token | vs fp32 | all veth B/token | "
             "final loss | vs fp32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = next((r for r in results if r["setting"] == "fp32"), None)
    for r in results:
        wire = f"{r['wire_bytes_per_token'] / base['wire_bytes_per_token']:.2f}x" if base else "-"
        loss = f"{(r['final_loss'] / base['final_loss'] - 1) * 100:+.2f} %" if base else "-"
        it = r["iteration_bound_tokens_per_s"]
        lines.append(f"| {r['setting']} | {r['tokens_per_s']:.1f} | {r['bound_tokens_per_s']:.1f} "
                     f"({r['bound_limited_by']}) | {r['utilization']:.2f} | {it:.1f} | {r['iteration_utilization']:.2f} | "
                     f"{r['cores_used']:.2f} | {r['other_jobs_cores']:.2f} | {r['between_iterations_s']:.1f} | "
                     f"{r['wire_bytes_per_token']:.0f} | {wire} | {r['lab_bytes_per_token']:.0f} | "
                     f"{r['final_loss']:.4f} | {loss} |")
    lines += ["", "CPU seconds a microbatch cost each part: alone on one thread (`calibrate`, the bound's) and in the "
              "swarm (`swarm_cpu`, the mean of the part's nodes: its compute, the process outside torch and outside "
              "the aggregations, a relay's products), and the bound at the swarm's costs (the pipeline's: without "
              "the products).", "",
              "| setting | part | alone | compute | outside torch | products | total | / alone | rest of the "
              "aggregation |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        by_part: dict[int, list] = {}
        for n, c in r.get("swarm_cpu_s_per_microbatch", {}).items():
            by_part.setdefault(part_key(n), []).append(c)
        for k, cs in sorted(by_part.items()):
            mean = {p: sum(c[p] for c in cs) / len(cs) for p in cs[0]}
            alone = r["part_cpu_s_per_microbatch"][str(k)]
            lines.append(f"| {r['setting']} | {'data' if k < 0 else f'stage {k}'} | {alone:.4f} | "
                         + " | ".join(f"{mean[p]:.4f}" for p in ("compute", "outside_torch", "products", "total"))
                         + f" | {mean['total'] / alone:.2f} | {mean['aggregation_rest']:.4f} |")
        if "swarm_cpu_bound_tokens_per_s" in r:
            lines.append(f"| {r['setting']} | bound | {r['bound_tokens_per_s']:.1f} tokens/s | | | pipeline "
                         f"{r['pipeline_cpu_bound_tokens_per_s']:.1f} (utilization {r['pipeline_cpu_utilization'] or 0:.2f}) "
                         f"| {r['swarm_cpu_bound_tokens_per_s']:.1f} (utilization {r['swarm_cpu_utilization']:.2f}) | | |")
    lines += ["", f"Memory per node: peak RSS less a process that only imported what a node imports "
              f"({r0['baseline_rss_mb']:.0f} MiB), against model/memory.py's estimate of the part; and the raw peak "
              f"RSS against the estimate with its fixed process overhead.", "",
              "| setting | node | peak over baseline MiB | estimate MiB | estimate / peak | peak RSS MiB | "
              "estimate with overhead | / peak |", "|---|---|---|---|---|---|---|---|"]

    def ratio(est, peak) -> str:
        return "-" if est is None or peak <= 0 else f"{est / peak:.2f}"

    for r in results:
        for n, peak in r["peak_memory_mb"].items():
            est, tot, rss = r["estimated_memory_mb"].get(n), r["estimated_total_mb"].get(n), r["peak_rss_mb"][n]
            lines.append(f"| {r['setting']} | {n} | {peak:.0f} | {'-' if est is None else f'{est:.0f}'} | "
                         f"{ratio(est, peak)} | {rss:.0f} | {'-' if tot is None else f'{tot:.0f}'} | "
                         f"{ratio(tot, rss)} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, help="a named model shape of init-run (e.g. llama-135m) instead of "
                   "--hidden/--layers")
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--microbatch-size", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=16, help="per iteration")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--relays-per-stage", type=int, default=2)
    p.add_argument("--compression-ratio", type=float, default=10.0, help="r of AdaTopK (Equation 7)")
    p.add_argument("--rates", default="100,50", help="uplink Mbit/s, given round-robin to d0, r0_0, r0_1, ...")
    p.add_argument("--latency-ms", default="20-60", help="one-way latency range of a pair of nodes, LO-HI")
    p.add_argument("--cores", type=float, default=None, help="CPU cores the nodes share (default: this machine's)")
    p.add_argument("--cpu-shares", choices=("flow", "equal"), default="flow",
                   help="flow: each node's CPU weight (nice level) in proportion to what its part costs an iteration, "
                        "as the bound shares the cores; equal: the kernel's equal shares of the nodes' sessions")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated subset of {','.join(SETTINGS)}")
    p.add_argument("--checkpoint-every", type=int, default=10, metavar="N",
                   help="each node checkpoints after every N-th iteration (join --checkpoint-every; default 10, as "
                        "for a large model: a checkpoint of the 134.5M model's stages is 0.3-0.5 GB per node)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-available-mb", type=float, default=2048.0,
                   help="stop a setting when the machine's available memory falls below this")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--iteration-timeout", type=float, default=600.0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--reestimate", metavar="FILE", default=None,
                   help="run nothing: print the table of a saved --json output (same flags) with the memory "
                        "estimates of this build")
    args = p.parse_args()
    from gwtf_node.testing.netlab import lab_unavailable

    try:
        args.rates = [float(x) for x in args.rates.split(",") if x]
        lo, hi = (float(x) for x in args.latency_ms.split("-"))
        if not args.rates or min(args.rates) <= 0 or lo < 0 or hi < lo:
            raise ValueError
        args.latency_ms = (lo, hi)
    except ValueError:
        print("bench_scale: --rates takes positive Mbit/s separated by commas, --latency-ms LO-HI", file=sys.stderr)
        return 2
    settings = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown or not settings:
        print(f"bench_scale: --settings {','.join(unknown)}: use {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    if args.iterations < 2:
        print("bench_scale: --iterations must be at least 2 (iteration 0 is left out of the rates)", file=sys.stderr)
        return 2
    args.cores = args.cores or float(len(os.sched_getaffinity(0)))
    if args.reestimate:
        try:
            print(table(reestimate(Path(args.reestimate), args), args))
        except (OSError, ValueError, KeyError) as e:
            print(f"bench_scale: --reestimate {args.reestimate}: not a saved --json output of this script ({e})",
                  file=sys.stderr)
            return 2
        return 0
    why = lab_unavailable()
    if why is not None:
        print(f"bench_scale: the network lab cannot be made here: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the lab and the swarm are taken down
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gwtf-bench-scale-"))
    baseline = baseline_rss_mb()
    results = []
    for setting in settings:
        print(f"{setting}: training {args.iterations} iterations in {workdir / setting}", file=sys.stderr)
        results.append(run_setting(setting, args, workdir / setting.replace("+", "-"), baseline))
    if args.json:
        for r in results:
            print(json.dumps(r))
        print(table(results, args), file=sys.stderr)
    else:
        print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

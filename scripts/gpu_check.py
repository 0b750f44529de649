"""The GPU path: the stage executor on `cuda` in fp32 and bf16-mixed against the centralized reference on the CPU.

Part 1 needs only `gwtf_node.model` (torch and transformers; no trio, no
libp2p): the parts of a 2-stage LLaMA-like run (the data node's embedding and
head, relay stages 0 and 1) are built on the device and chained in one
process as `model/reference.py` chains them, for fp32 with an fp32 wire and
for bf16-mixed with a bf16 wire, and the centralized reference trains the
same manifests on the CPU.  Printed: each iteration's loss side by side (CPU
reference, device chain) with their relative difference, tokens per second
of the device chain (iterations after the first, CUDA synchronized), and per
part its peak memory: the bytes its parameters, gradient accumulators and
optimizer state hold on the device, plus the largest growth of
`torch.cuda.max_memory_allocated` during one of its calls (its stash and
temporaries); the process's overall peak too.

Part 2, only where trio and libp2p import: a real swarm (`gwtf-node local`'s
launcher, 1 data node, 2 stages x `--swarm-relays` relays (1 by default;
with 2 or more each stage's all-reduce sums device tensors), every node
`join --device DEVICE`)
trains the bf16 manifest; its losses are printed beside the CPU reference's,
with tokens per second, and with the peak GPU memory of each node's process
as `nvidia-smi` reports it (polled every 0.5 s; it includes the CUDA context), and the count of "presumed
dead" lines in the nodes' logs.

Part 3, `--memory-preset NAME` (default llama-135m; `none` skips it): the run of that preset cut into
`--memory-stages` stages, fp32 and bf16-mixed; for the data part and relay stage 1 at capacity
`--memory-capacity`, tests/support/memprobe.py on the device prints the estimate (`model/memory.py` for this
device) beside the measured growth of `torch.cuda.max_memory_allocated`, and the tokens per second of the
part's timed forwards and backwards (bf16-mixed against fp32 on the same part).

`--swarm-preset NAME` adds part 2 again for that preset in `--swarm-stages` stages, fp32 then bf16-mixed,
against the centralized reference trained on the same device.

Without CUDA, `--device cuda` (the default) prints one line saying it skipped
and exits 0; `--device cpu` runs both parts on the CPU (what tests the
script on a machine without a GPU).  Exit status 1 when a loss differs from
the reference by more than `--tolerance` (relative; the CPU and the GPU run
different kernels, so the device chain is close, not equal).

    python scripts/gpu_check.py [--device cuda|cpu] [--iterations 4] [--hidden 512] [--layers 8] [--no-swarm]
                                [--swarm-relays 1] [--memory-preset llama-135m|none] [--memory-stages 4]
                                [--memory-capacity 4]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gwtf_node.model.manifest import RunManifest, default_manifest, load_manifest, save_manifest  # noqa: E402
from gwtf_node.model.reference import build_chain, make_sources, train_centralized  # noqa: E402

SETTINGS = (("fp32", "fp32"), ("bf16-mixed", "bf16"))
MB = 1 << 20


def manifest(args: argparse.Namespace, precision: str, wire: str) -> RunManifest:
    m = default_manifest(stages=2, layers=args.layers, hidden=args.hidden, seq_len=args.seq_len,
                         microbatch_size=args.microbatch_size, microbatches_per_iteration=args.microbatches)
    m = dataclasses.replace(m, train=dataclasses.replace(m.train, precision=precision, wire_dtype=wire))
    m.validate(check_files=False)
    return m


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident_bytes(part) -> int:
    """Bytes of the part's parameters, gradient accumulators and optimizer state."""
    tensors = list(part.params) + list(part._acc)
    for state in part.optimizer.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)


class Meter:
    """The largest growth of the device's allocated memory during one call, per part."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.growth: dict[str, int] = {}

    def call(self, name: str, fn, *args):
        if self.device.type != "cuda":
            return fn(*args)
        _sync(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        out = fn(*args)
        _sync(self.device)
        grew = torch.cuda.max_memory_allocated(self.device) - before
        self.growth[name] = max(self.growth.get(name, 0), grew)
        return out


def chain_on_device(man: RunManifest, iterations: int, device: torch.device) -> dict:
    """Train the chained parts on `device`: losses, tokens per second, memory per part."""
    data, relays = build_chain(man, device)
    source = make_sources(man, 1)[0]
    meter = Meter(device)
    M = man.data.microbatches_per_iteration
    losses, seconds = [], []
    for t in range(iterations):
        _sync(device)
        t0 = time.perf_counter()
        mb_losses = []
        for seq in range(t * M, (t + 1) * M):
            x, y = source.get(seq)
            key = (0, seq)
            h = meter.call("data", data.embed, key, x)
            for r in relays:
                h = meter.call(r.name, r.forward, key, h)
            loss, g = meter.call("data", data.head_loss, key, h, y)
            for r in reversed(relays):
                g = meter.call(r.name, r.backward, key, g)
            meter.call("data", data.embed_backward, key, g)
            mb_losses.append(loss)
        for part in (data, *relays):
            meter.call(part.name, part.apply_mean_grad, part.grad_vector(), len(mb_losses))
        _sync(device)
        seconds.append(time.perf_counter() - t0)
        losses.append(sum(mb_losses) / len(mb_losses))
    tokens = M * man.data.microbatch_size * man.data.seq_len
    timed = seconds[1:] or seconds
    memory = {p.name: {"resident_mb": resident_bytes(p) / MB, "call_growth_mb": meter.growth.get(p.name, 0) / MB}
              for p in (data, *relays)}
    peak = torch.cuda.max_memory_allocated(device) / MB if device.type == "cuda" else None
    return {"losses": losses, "tokens_per_s": tokens * len(timed) / sum(timed), "memory": memory, "peak_mb": peak}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else math.inf


def part1(args: argparse.Namespace, device: torch.device) -> tuple[bool, dict]:
    ok, refs = True, {}
    for precision, wire in SETTINGS:
        man = manifest(args, precision, wire)
        ref = train_centralized(man, args.iterations).losses
        refs[(precision, wire)] = ref
        got = chain_on_device(man, args.iterations, device)
        print(f"\n== part 1: {precision} compute, {wire} wire: stage executor on {device} vs the CPU reference")
        print(f"{'iteration':>9s} {'cpu reference':>14s} {str(device) + ' chain':>14s} {'rel diff':>9s}")
        for i, (a, b) in enumerate(zip(ref, got["losses"])):
            bad = _rel(b, a) > args.tolerance or not math.isfinite(b)
            ok &= not bad
            print(f"{i:9d} {a:14.6f} {b:14.6f} {_rel(b, a):9.2e}{'  <- over --tolerance' if bad else ''}")
        print(f"tokens/s on {device}: {got['tokens_per_s']:.0f}")
        for name, mem in got["memory"].items():
            grow = f", + {mem['call_growth_mb']:.1f} MB during its largest call" if device.type == "cuda" else ""
            print(f"  {name:7s} state {mem['resident_mb']:.1f} MB (params, gradient accumulators, optimizer){grow}")
        if got["peak_mb"] is not None:
            print(f"  process peak torch.cuda.max_memory_allocated: {got['peak_mb']:.1f} MB")
    return ok, refs


class GpuPoller:
    """Peak GPU memory per pid from nvidia-smi, polled in a thread."""

    def __init__(self) -> None:
        self.peak: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.splitlines():
                try:
                    pid, used = (int(x) for x in line.split(","))
                except ValueError:
                    continue
                self.peak[pid] = max(self.peak.get(pid, 0), used)

    def __enter__(self) -> "GpuPoller":
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


def preset_manifest(args: argparse.Namespace, precision: str, wire: str, folder: Path) -> RunManifest:
    """`--swarm-preset`'s run, in `--swarm-stages` stages, as `gwtf-node init-run` writes it."""
    from gwtf_node.cli import main as cli

    run = folder / f"{args.swarm_preset}-{precision}.json"
    with contextlib.redirect_stdout(io.StringIO()):
        made = cli(["init-run", "--out", str(run), "--preset", args.swarm_preset, "--stages", str(args.swarm_stages),
                    "--precision", precision, "--wire-dtype", wire, "--microbatches", str(args.microbatches),
                    "--seq-len", str(args.seq_len), "--microbatch-size", str(args.microbatch_size)])
    if made != 0:
        raise SystemExit(f"gpu_check: init-run --preset {args.swarm_preset} failed")
    return load_manifest(run, check_files=False)


def part2(args: argparse.Namespace, device: torch.device, man: RunManifest, ref: list[float], where: str,
          owner: Path | None = None) -> bool:
    """A local swarm of `man` on `device`, its losses beside `ref` (the centralized reference on `where`);
    `owner`: the key that signed `man`, given to the launcher."""
    missing = [m for m in ("trio", "libp2p") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"\n== part 2 skipped: {' and '.join(missing)} not importable here (the swarm needs them)")
        return True
    from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

    ok = True
    stages = man.num_stages
    with tempfile.TemporaryDirectory(prefix="gwtf-gpu-check-") as tmp:
        run = Path(tmp) / "run.json"
        save_manifest(man, run)
        if owner is not None:
            shutil.copyfile(owner, Path(tmp) / "owner.key")
        swarm = LocalSwarm(Path(tmp), run, data_nodes=1, stages=stages, relays_per_stage=args.swarm_relays,
                           iterations=args.iterations)
        swarm.extra_args = {name: ["--device", str(device)] for name in swarm.names()}
        swarm.fork_server = not args.no_fork_server
        swarm.startup_timeout_s = 300
        swarm.iteration_timeout_s = 300
        with GpuPoller() as poller:
            records = run_local(swarm, lambda rec: None)
            pids = {name: getattr(proc, "pid", None) for name, proc in swarm.procs.items()}
        dead = 0
        for name in swarm.names():
            log = swarm.state_dir(name) / "node.log"
            if log.exists():
                dead += log.read_text(errors="replace").count("presumed dead")
                if args.logs:
                    Path(args.logs).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(log, Path(args.logs) / f"h{man.dims.hidden}-{man.train.precision}-{name}.log")
    print(f"\n== part 2: a swarm on {device} ({man.model.family}, {man.dims.hidden} hidden, "
          f"{sum(e - s for s, e in man.stages)} layers; 1 data node, {stages} stages x {args.swarm_relays} "
          f"relay{'s' if args.swarm_relays > 1 else ''}), "
          f"{man.train.precision} compute, {man.train.wire_dtype} wire")
    print(f"{'iteration':>9s} {where + ' reference':>14s} {'swarm':>14s} {'rel diff':>9s} {'tokens/s':>9s}")
    for rec, a in zip(records, ref):
        b = rec["loss"]
        bad = _rel(b, a) > args.tolerance or not math.isfinite(b)
        ok &= not bad
        tps = rec["samples"] * man.data.seq_len / max(rec.get("seconds") or 0.0, 1e-9)
        print(f"{rec['iteration']:9d} {a:14.6f} {b:14.6f} {_rel(b, a):9.2e} {tps:9.0f}{'  <- over' if bad else ''}")
    if len(records) < args.iterations:
        print(f"the swarm completed {len(records)} of {args.iterations} iterations")
        ok = False
    print(f"  'presumed dead' lines in the nodes' logs: {dead}")
    ok &= dead == 0
    if poller.peak:
        for name, pid in sorted(pids.items()):
            print(f"  {name:6s} peak GPU memory (nvidia-smi, with the CUDA context): {poller.peak.get(pid, 0):.0f} MiB")
    elif device.type == "cuda":
        print("  peak GPU memory per node: nvidia-smi not available")
    return ok


def part3(args: argparse.Namespace, device: torch.device) -> bool:
    """The memory estimate against the measured peak on `device`, and bf16-mixed against fp32 throughput."""
    from gwtf_node.cli import main as cli

    root = Path(__file__).resolve().parent.parent
    ok = True
    print(f"\n== part 3: the {args.memory_preset} preset in {args.memory_stages} stages on {device}, microbatches of "
          f"{args.microbatch_size} x {args.seq_len}: memory estimate against the measured peak, capacity "
          f"{args.memory_capacity}")
    print(f"{'precision':>10s} {'part':>7s} {'params':>11s} {'estimate MiB':>13s} {'measured MiB':>13s} {'ratio':>6s} "
          f"{'tokens/s':>9s}")
    with tempfile.TemporaryDirectory(prefix="gwtf-gpu-mem-") as tmp:
        for precision, wire in SETTINGS:
            run = Path(tmp) / f"{precision}.json"
            with contextlib.redirect_stdout(io.StringIO()):
                made = cli(["init-run", "--out", str(run), "--preset", args.memory_preset, "--stages",
                            str(args.memory_stages), "--precision", precision, "--wire-dtype", wire,
                            "--seq-len", str(args.seq_len), "--microbatch-size", str(args.microbatch_size)])
            if made != 0:
                return False
            for role, stage in (("data", 0), ("relay", min(1, args.memory_stages - 1))):
                env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536",
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
                out = subprocess.run([sys.executable, str(root / "tests" / "support" / "memprobe.py"), str(run), role,
                                      str(stage), str(args.memory_capacity), str(device)],
                                     capture_output=True, text=True, timeout=900, env=env, cwd=root)
                if out.returncode != 0:
                    print(f"  memprobe {precision} {role} failed: {out.stderr[-2000:]}")
                    ok = False
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                ratio = r["estimate"] / max(1, r["measured"])
                bad = not 0.75 <= ratio <= 1.25
                ok &= not bad
                print(f"{precision:>10s} {r['part']:>7s} {r['params']:11,d} {r['estimate'] / MB:13.1f} "
                      f"{r['measured'] / MB:13.1f} {ratio:6.3f} {r['tokens'] / r['seconds']:9.0f}"
                      f"{'  <- outside 0.75..1.25' if bad else ''}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--hidden", type=int, default=None, help="default 512 on cuda, 64 on cpu")
    p.add_argument("--layers", type=int, default=None, help="default 8 on cuda, 4 on cpu")
    p.add_argument("--seq-len", type=int, default=None, help="default 256 on cuda, 32 on cpu")
    p.add_argument("--microbatch-size", type=int, default=None, help="default 8 on cuda, 2 on cpu")
    p.add_argument("--microbatches", type=int, default=4, help="per iteration")
    p.add_argument("--tolerance", type=float, default=1e-2, help="relative loss difference allowed")
    p.add_argument("--no-swarm", action="store_true", help="leave out part 2 (the swarm)")
    p.add_argument("--swarm-preset", default="none",
                   help="also a swarm of this preset (fp32, then bf16-mixed) against the reference on the device")
    p.add_argument("--swarm-stages", type=int, default=4)
    p.add_argument("--swarm-relays", type=int, default=1,
                   help="relays per stage in the swarms (2 or more: the within-stage all-reduce runs on the device)")
    p.add_argument("--skip-chain", action="store_true", help="leave out part 1 (the chain against the CPU)")
    p.add_argument("--no-fork-server", action="store_true", help="start each swarm node as a fresh process")
    p.add_argument("--logs", default=None, help="a folder to copy the swarm's node logs into")
    p.add_argument("--memory-preset", default="llama-135m", help="part 3's preset; none leaves part 3 out")
    p.add_argument("--memory-stages", type=int, default=4)
    p.add_argument("--memory-capacity", type=int, default=4)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: skipped: torch sees no CUDA device here (--device cpu runs the check on the CPU)")
        return 0
    if device.type not in ("cuda", "cpu"):
        print(f"gpu_check: --device is {args.device!r}; use cuda, cuda:N or cpu", file=sys.stderr)
        return 2
    big = device.type == "cuda"
    for name, on_gpu, on_cpu in (("hidden", 512, 64), ("layers", 8, 4), ("seq_len", 256, 32),
                                 ("microbatch_size", 8, 2)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if big else on_cpu)
    torch.set_num_threads(max(1, min(8, torch.get_num_threads())))
    where = torch.cuda.get_device_name(device) if big else "CPU"
    print(f"gpu_check on {where}: llama hidden {args.hidden}, {args.layers} layers in 2 stages, seq {args.seq_len}, "
          f"{args.microbatches} microbatches of {args.microbatch_size} per iteration, {args.iterations} iterations")
    if args.skip_chain:
        ok, refs = True, {}
        if not args.no_swarm:
            refs[("bf16-mixed", "bf16")] = train_centralized(manifest(args, "bf16-mixed", "bf16"), args.iterations).losses
    else:
        ok, refs = part1(args, device)
    if not args.no_swarm:
        ok &= part2(args, device, manifest(args, "bf16-mixed", "bf16"), refs[("bf16-mixed", "bf16")], "cpu")
        if args.swarm_preset != "none":
            with tempfile.TemporaryDirectory(prefix="gwtf-gpu-preset-") as tmp:
                for precision, wire in SETTINGS:
                    man = preset_manifest(args, precision, wire, Path(tmp))
                    ref = train_centralized(man, args.iterations, device=device).losses
                    ok &= part2(args, device, man, ref, str(device), Path(tmp) / "owner.key")
    if args.memory_preset != "none":
        ok &= part3(args, device)
    print("\ngpu_check:", "ok" if ok else "FAILED (a loss over --tolerance, an iteration missing, a node presumed dead, "
                                    "or an estimate outside 0.75..1.25 of the measured peak)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

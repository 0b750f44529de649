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
launcher, 1 data node, 2 stages x 1 relay, every node `join --device DEVICE`)
trains the bf16 manifest; its losses are printed beside the CPU reference's,
with tokens per second, and with the peak GPU memory of each node's process
as `nvidia-smi` reports it (polled every 0.5 s; it includes the CUDA context).

Without CUDA, `--device cuda` (the default) prints one line saying it skipped
and exits 0; `--device cpu` runs both parts on the CPU (what tests the
script on a machine without a GPU).  Exit status 1 when a loss differs from
the reference by more than `--tolerance` (relative; the CPU and the GPU run
different kernels, so the device chain is close, not equal).

    python scripts/gpu_check.py [--device cuda|cpu] [--iterations 4] [--hidden 512] [--layers 8] [--no-swarm]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gwtf_node.model.manifest import RunManifest, default_manifest, save_manifest  # noqa: E402
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


def part2(args: argparse.Namespace, device: torch.device, ref: list[float]) -> bool:
    missing = [m for m in ("trio", "libp2p") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"\n== part 2 skipped: {' and '.join(missing)} not importable here (the swarm needs them)")
        return True
    from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

    man = manifest(args, "bf16-mixed", "bf16")
    ok = True
    with tempfile.TemporaryDirectory(prefix="gwtf-gpu-check-") as tmp:
        run = Path(tmp) / "run.json"
        save_manifest(man, run)
        swarm = LocalSwarm(Path(tmp), run, data_nodes=1, stages=2, relays_per_stage=1, iterations=args.iterations)
        swarm.extra_args = {name: ["--device", str(device)] for name in swarm.names()}
        swarm.startup_timeout_s = 300
        swarm.iteration_timeout_s = 300
        with GpuPoller() as poller:
            records = run_local(swarm, lambda rec: None)
            pids = {name: getattr(proc, "pid", None) for name, proc in swarm.procs.items()}
    print(f"\n== part 2: a swarm on {device} (1 data node, 2 stages x 1 relay), bf16-mixed compute, bf16 wire")
    print(f"{'iteration':>9s} {'cpu reference':>14s} {'swarm':>14s} {'rel diff':>9s} {'tokens/s':>9s}")
    for rec, a in zip(records, ref):
        b = rec["loss"]
        bad = _rel(b, a) > args.tolerance or not math.isfinite(b)
        ok &= not bad
        tps = rec["samples"] * man.data.seq_len / max(rec.get("seconds") or 0.0, 1e-9)
        print(f"{rec['iteration']:9d} {a:14.6f} {b:14.6f} {_rel(b, a):9.2e} {tps:9.0f}{'  <- over' if bad else ''}")
    if len(records) < args.iterations:
        print(f"the swarm completed {len(records)} of {args.iterations} iterations")
        ok = False
    if poller.peak:
        for name, pid in sorted(pids.items()):
            print(f"  {name:6s} peak GPU memory (nvidia-smi, with the CUDA context): {poller.peak.get(pid, 0):.0f} MiB")
    elif device.type == "cuda":
        print("  peak GPU memory per node: nvidia-smi not available")
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
    p.add_argument("--no-swarm", action="store_true", help="part 1 only")
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
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    where = torch.cuda.get_device_name(device) if big else "CPU"
    print(f"gpu_check on {where}: llama hidden {args.hidden}, {args.layers} layers in 2 stages, seq {args.seq_len}, "
          f"{args.microbatches} microbatches of {args.microbatch_size} per iteration, {args.iterations} iterations")
    ok, refs = part1(args, device)
    if not args.no_swarm:
        ok &= part2(args, device, refs[("bf16-mixed", "bf16")])
    print("\ngpu_check:", "ok" if ok else "FAILED (a loss over --tolerance, or an iteration missing)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

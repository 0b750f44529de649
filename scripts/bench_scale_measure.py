"""What `bench_scale.py` measures of a swarm and the bound it compares it with (its docstring says what each is).

`swarm_bound` (the maximum flow of microbatches through the stages, `gwtf_node/sim/bound.py`, from each node's
status.json), `allreduce_s` (the least time of an iteration's within-stage all-reduces at the links' rates),
`calibrate` (each part's forward + backward and its step timed alone on one thread), `cpu_busy_s` (the CPU the
whole machine used: the other jobs' share of it), and the readers of status.json and node.log.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS_PER_MICROBATCH = {"relay": 2, "data": 3}  # runtime/node/stage.py: stage calls of one microbatch


def swarm_bound(status: dict[str, dict], window: dict[str, dict], rates: dict[str, float], cores: float,
                part_cpu_s: dict[int, float], node_cpu_s: dict[str, float] | None = None) -> dict:
    """`throughput_bound` of the swarm: `status`, each node's status.json (its role and stage); `window`, what it
    measured after iteration 0 (node -> {"microbatches", "sent_bytes", "cpu_s", "seconds"}, differences of two
    status.json); `rates`, its uplink and downlink in Mbit/s; `part_cpu_s`, the CPU seconds one microbatch costs
    each part computed alone (`calibrate`; -1: the data part), or `node_cpu_s`, what each node spent per microbatch
    in the swarm (`swarm_cpu`).

    A node handles at most 1 / its part's cost microbatches per second (one torch thread), and no more than its
    link's rate over the bytes it sends per microbatch (it receives about as many: an activation of the same
    shape, a gradient back); a unit of flow through it costs its part's CPU seconds, all nodes within `cores`."""
    from gwtf_node.sim.bound import throughput_bound

    stage_of, node_rate, cost = {}, {}, {}
    per_mb_bytes = {}
    for n, st in status.items():
        stage_of[n] = -1 if st["role"] == "data" else st["stage"]
        w = window[n]
        per_mb_bytes[n] = w["sent_bytes"] / max(w["microbatches"], 1e-9)  # activations and gradients it sends
        cost[n] = node_cpu_s[n] if node_cpu_s is not None else part_cpu_s[stage_of[n]]
        compute = 1.0 / cost[n] if cost[n] > 0 else math.inf
        nic = rates[n] * 1e6 / 8 / per_mb_bytes[n] if per_mb_bytes[n] > 0 else math.inf
        node_rate[n] = min(compute, nic)
    link_rate = {}
    for a in status:
        for b in status:
            if a != b:
                both = min(rates[a], rates[b]) * 1e6 / 8
                # about half of what a node sends per microbatch is the activation forward, half the gradient
                # back: a -> b carries a's activation, b -> a b's gradient, each direction at `both`
                crossing = max(per_mb_bytes[a], per_mb_bytes[b]) / 2
                link_rate[(a, b)] = both / crossing if crossing > 0 else math.inf
    out = throughput_bound(stage_of, node_rate, link_rate, cost, cores)
    out["node_rate"] = {n: round(v, 3) for n, v in sorted(node_rate.items())}
    # the CPU the swarm's processes used, in cores, over the window: all of its work, the compute's and the rest
    out["cores_used"] = round(sum(w["cpu_s"] for w in window.values()) / max(
        max(w["seconds"] for w in window.values()), 1e-9), 3)
    return out


def swarm_cpu(window: dict[str, dict]) -> dict[str, dict[str, float]]:
    """The CPU seconds each node spent per microbatch it carried over the window: `compute`, its torch worker inside
    the microbatches' compute (status.json `compute_cpu_s`); `outside_torch`, the rest of the process's CPU outside
    its aggregations (the event loop: frames, link emulation, flow and liveness messages); `products`, a relay's
    weight gradients multiplied out from the held factors at the aggregation (its `commit_many` work); `pipeline`
    (compute and outside torch) and `total` (the three).  What an aggregation costs beside its products (the
    all-reduce's transfers and sums, the gradient vector, the step) is once per iteration, not per microbatch:
    `aggregation_rest`, per microbatch, beside."""
    out = {}
    for n, w in window.items():
        mb = max(w["microbatches"], 1e-9)
        parts = {"compute": w["compute_cpu_s"] / mb, "products": w["products_cpu_s"] / mb,
                 "outside_torch": max(0.0, w["cpu_s"] - w["aggregation_cpu_s"] - w["compute_cpu_s"]) / mb}
        parts["pipeline"] = parts["compute"] + parts["outside_torch"]
        parts["total"] = parts["pipeline"] + parts["products"]
        parts["aggregation_rest"] = max(0.0, w["aggregation_cpu_s"] - w["products_cpu_s"]) / mb
        out[n] = {k: round(v, 4) for k, v in parts.items()}
    return out


# ------------------------------------------------------------------ the run


def allreduce_s(stage_params: list[int], stage_rates: list[list[float]], bytes_per_param: int = 4) -> float:
    """The least time of an iteration's within-stage all-reduces (runtime/node/allreduce.py: each of n relays sends and
    receives 2(n-1)/n of its stage's gradient, `bytes_per_param` each on the wire, through its own link; the stages
    reduce at once, the slowest member of the slowest stage binds)."""
    worst = 0.0
    for params, rates in zip(stage_params, stage_rates):
        n = len(rates)
        if n > 1:
            worst = max(worst, 2 * (n - 1) / n * bytes_per_param * params * 8 / (min(rates) * 1e6))
    return worst


AGGREGATION_LOG = re.compile(r"iteration (\d+): .*aggregation [\d.]+ s: (.*)$")


def aggregation_breakdown(logs: list[Path], skip: int = 1) -> dict[str, float]:
    """Mean seconds per phase of the relays' aggregations after iteration `skip - 1`, from their node.log lines
    "iteration N: summed in round ...; aggregation S s: gradient a, all_reduce b, step c, checkpoint d" (empty where
    none say so)."""
    sums: dict[str, list[float]] = {}
    for log in logs:
        for line in read_text(log).splitlines():
            m = AGGREGATION_LOG.search(line)
            if m and int(m[1]) >= skip:
                for part in m[2].split(","):
                    key, _, val = part.strip().rpartition(" ")
                    try:
                        sums.setdefault(key, []).append(float(val))
                    except ValueError:
                        pass
    return {k: round(sum(v) / len(v), 3) for k, v in sums.items()}


CONTRIBUTIONS_LOG = re.compile(r"iteration (\d+): summed in round \S+ contributions (\[.*?\]);")


def carried(log: Path) -> int | None:
    """The most microbatches a relay carried in one iteration (their gradients held to its step), from its node.log
    lines "iteration N: summed in round R: contributions [[data node, seq], ...]"; None without one."""
    counts = [len(json.loads(m[2])) for m in CONTRIBUTIONS_LOG.finditer(read_text(log))]
    return max(counts, default=None)


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def node_figures(st: dict) -> dict:
    calls = CALLS_PER_MICROBATCH["data" if st["role"] == "data" else "relay"]
    work = st.get("work_cpu_s", {})
    return {"microbatches": st["compute_calls"] / calls, "cpu_s": st["resources"]["cpu_s"],
            "compute_s": st["compute_s"], "seconds": st["time"], "compute_cpu_s": st.get("compute_cpu_s", 0.0),
            "products_cpu_s": work.get("commit_many", 0.0),
            "aggregation_cpu_s": st.get("aggregation_cpu_s", 0.0),
            "sent_bytes": st["compression"]["sent_bytes"], "dense_bytes": st["compression"]["dense_bytes"]}


CALIBRATE = """
import json, sys, time, torch
torch.set_num_threads(1)
from gwtf_node.model.manifest import load_manifest
from gwtf_node.model.stages import build_stage
man = load_manifest(sys.argv[1], check_files=False)
b, t, h, v = man.data.microbatch_size, man.data.seq_len, man.dims.hidden, man.dims.vocab
n = int(sys.argv[2])
g = torch.Generator().manual_seed(0)
out = {}
for k in [-1] + list(range(len(man.stages))):
    part = build_stage(man, "data" if k < 0 else "relay", None if k < 0 else k)
    spent = []
    for r in range(3):  # a warm-up, then the least of two
        keys = [(r, i) for i in range(n)]
        t0 = time.process_time()
        for key in keys:
            x, ids = torch.randn(b, t, h, generator=g), torch.randint(0, v, (b, t), generator=g)
            if k < 0:
                part.embed(key, ids)
                _, grad = part.head_loss(key, x, ids, hold=True)
                part.count_held(key)
                part.embed_backward(key, grad)
            else:
                part.forward(key, x)
                part.backward(key, torch.randn(b, t, h, generator=g), hold=True)
        if k >= 0:
            part.commit_many(keys)
        spent.append((time.process_time() - t0) / n)
    out[str(k)] = min(spent[1:])
    steps = []
    for i in range(2):  # the aggregation's own compute: the gradient vector and the optimizer step
        t0 = time.process_time()
        part.apply_mean_grad(part.grad_vector(), 1)
        steps.append(time.process_time() - t0)
    out[f"step{k}"] = min(steps)
    del part
print(json.dumps(out))
"""

CALIBRATE_MICROBATCHES = 16  # held, then added together, as a relay adds what it holds


def calibrate(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    """CPU seconds one microbatch costs each part (-1: the data part) computed alone on one thread, as a node
    computes it: a relay's forward and backward holding its gradients and its share of adding
    `CALIBRATE_MICROBATCHES` held microbatches together (`StageModel.commit_many`), a data part's embedding,
    head and loss (the head's gradients held and counted) and embedding backward; per microbatch of
    `CALIBRATE_MICROBATCHES`, the least of two after a warm-up.  And the CPU seconds of each part's step (its
    gradient vector and AdamW update), the least of two.  In the swarm the nodes' compute times count the
    waiting for a core shared with the others; this does not."""
    out = subprocess.run([sys.executable, "-c", CALIBRATE, str(run), str(CALIBRATE_MICROBATCHES)],
                         capture_output=True, text=True, timeout=900,
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise SystemExit(f"bench_scale: calibrating the parts failed: {out.stderr.strip()[-500:]}")
    got = json.loads(out.stdout.splitlines()[-1])
    return ({int(k): v for k, v in got.items() if not k.startswith("step")},
            {int(k[4:]): v for k, v in got.items() if k.startswith("step")})


def cpu_busy_s() -> float:
    """CPU seconds every process of the machine has used since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


NICE_STEP = 1.25  # CFS: one nice level is about 1.25x the CPU weight


def part_key(name: str) -> int:
    """The part a node of the bench computes, as `calibrate` keys it: -1 for a data node (d0), else its stage
    (r<stage>_<i>)."""
    return -1 if name.startswith("d") else int(name[1:].split("_")[0])


def flow_nice(part_cpu: dict[int, float], capacity: dict[str, int]) -> dict[str, int]:
    """The nice level of each node that shares the cores as the bound's flow does: a node's CPU weight in
    proportion to the CPU seconds its part costs an iteration (`capacity`: the microbatches it carries, the data
    node every one, a relay its share of its stage's), the busiest at nice 0."""
    work = {n: c * part_cpu[part_key(n)] for n, c in capacity.items()}
    top = max(work.values())
    return {n: min(19, max(0, round(math.log(top / max(w, 1e-9)) / math.log(NICE_STEP)))) for n, w in work.items()}


def apply_nice(pids: dict[str, int], nice: dict[str, int]) -> None:
    """Give each node's process its nice level: its autogroup's (a node runs in a session of its own, and with
    autogroups the kernel shares the CPU between sessions, not threads) and every thread's (threads started later
    take their creator's)."""
    for n, pid in pids.items():
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice[n]))
        except OSError:
            pass  # no autogroups here: the threads' nice levels alone
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # a node that ended already: the swarm says so
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice[n])
            except OSError:
                pass  # a thread that ended meanwhile

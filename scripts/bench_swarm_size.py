#!/usr/bin/env python
"""What each node of a real swarm pays for the swarm's size: connections, flow messages, control traffic, CPU.

For each `--nodes N`, a local swarm of daemon processes on this machine
(`gwtf-node local`'s launcher, runtime/local/swarm.py, its nodes forked from
one fork server): `--data-nodes D` data nodes and `--stages S` stages of
k = ceil((N - D) / S) relays each (so at least N processes), a tiny model
(one layer of `--hidden` a stage), and k microbatches per data node per
iteration: every relay carries D microbatches an iteration at every size,
so what grows with N is the swarm, not a node's work.  The swarm forms its
flows and trains `--warmup` + `--iterations` iterations (with `--until-formed
S`, the window starts after the warmup only once the data nodes' flows hold
their whole demand, at most S seconds later: `formed_s`); every iteration
must settle D x k microbatches (one that settles fewer ends that size at
once: its loss cannot be the reference's), every stage must sum exactly the
microbatches its data nodes settled (the node logs: "settled: completed"
and "summed in round ... contributions"), and every loss must equal the
centralized reference (model/reference.py, 1e-4 relative) up to the
iteration where the reference itself, run with each iteration's microbatches
in reverse order, first leaves 1e-6 of it (the "order horizon": the same sums
in another order drift apart chaotically, DESIGN.md "up to floating-point
summation order"; a tiny model's reach 1e-6 after about 50 iterations and
1e-4 after about 70), else the exit status is 1.  Past the horizon the
ledger of contributions is the check that nothing was lost.

Per iteration, two times: the pipeline's (`seconds_per_iteration`, the data
node's records: from opening an iteration to its microbatches settled) and
the whole iteration's (`window_seconds_per_iteration`: the window's seconds
over its iterations, the aggregation and phase signals included; what the
per-iteration figures below are divided by).

Per node, over the `--iterations` measured iterations (the window between
two readings of every status.json and /proc, after the warmup), divided by
the iterations of the window:

* connections: the peers in its status.json (the peers it works with:
  protocol/fanout.py), and of those the ones with a live libp2p connection;
  beside them, the peers it holds a libp2p connection to at all (status.json
  `connections`: the DHT's walks leave theirs open) and the DHT operations
  it started (`dht_ops`, since its start);
* flow messages: the frames of flow formation it sent (`FLOW_KINDS`: cost
  announcements, flow requests and replies, changes, redirects, launch
  bids, relabels, link costs), per iteration in the window and in all
  until the first iteration ended (the flows' formation);
* control traffic: the frames with no payload it sent and their bytes
  (Wire's counters, status.json "sent": envelope bytes; the DHT's and
  libp2p's own frames and the all-reduce's chunks are not in them), per
  iteration and per second;
* CPU outside compute: the CPU of its main thread, which runs the event
  loop (the protocol, framing, encryption, status), from
  /proc/<pid>/task/<pid>/stat (stage computations run in worker threads);
  and the whole process' CPU minus its compute seconds (status.json
  `resources.cpu_s` - `compute_s`, a cross-check: compute_s is wall time in
  computations, which a loaded machine stretches);
* memory: the proportional set size (PSS: pages shared with the fork server
  and the other nodes counted in shares) and the private pages (USS), from
  /proc/<pid>/smaps_rollup, and how much MemAvailable dropped per process.

Beside them: the swarm's CPU since its start in cores (all its processes,
/proc/<pid>/stat) against the cores the whole machine was busy (/proc/stat),
since the machine may be shared.  Between sizes the script waits for the
previous swarm's processes to be gone.  A size that fails (MemAvailable
under `--min-free-gib` while it runs, a node that exits, no progress within
the deadlines, an iteration short of microbatches) is reported with its
reason and a diagnosis (the swarm's CPU, the "presumed dead" detections
in the node logs with the minute that had the most and how many had the
liveness floor for deadline, unknown-peer refusals, memory, what the first
data node knew), the swarm taken down, and the exit status is 1.

    python scripts/bench_swarm_size.py --nodes 25 50 100 --json     # [--flow-neighbours K]: the daemons' bound

`--pooled-formation` starts every daemon with it (several data nodes form
their flows pooled, then homed: runtime/node/pooling.py), and so does
`--scaled-formation` (one data node: its flows formed by cost scaling first,
runtime/node/scaledformation.py; its frames count as flow messages); `flow_cost_formed`
and `flow_cost` are the cost of the swarm's flows at the first iteration and
at the end (each node's units per next hop times that link's cost, from
status.json) with the units the data nodes placed, to set side by side with a
run without it, `negative_labels`, the nodes whose OUT label is below 0
(only a negative cycle of the flows gives one: docs/bench_flow.md, "Flaps"),
and `requests_sent_again`, the flow requests the nodes sent again so far, their
reply lost (protocol/flow/units.py `retry_due`).

`--links FILE` declares the links (emulated in user space and costed as
declared, `gwtf-node local --links`): on one machine a loopback "link"
measured under load times the machine's scheduling, not a link.

`--json` prints one object per size on stdout; the Markdown table goes to
stderr.  Every process started is stopped on every exit path (SIGTERM, then
SIGKILL; Ctrl-C and SIGTERM to this script included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gwtf_node.protocol.scalemsgs import SCALE_MESSAGES  # noqa: E402 - after the path is set

# message types of flow formation (protos/gwtf.proto, the flow section; LinkCost fixes a flow link's cost)
FLOW_KINDS = frozenset({
    "CostAnnounce", "RequestFlow", "FlowReply", "Deny", "Withdraw", "Reroute", "BidFeed", "LaunchBid", "Relabel",
    "RelabelCost", "QueryFlows", "FlowReport", "RequestChange", "RequestRedirect", "MoveReply", "LinkCost",
    "PoolFrame",  # pooled formation's flow and homing messages (--pooled-formation)
    *(t.__name__ for t in SCALE_MESSAGES),  # scaled formation's (--scaled-formation)
})
REL_TOL = 1e-4  # the swarm tests' tolerance against the centralized reference (tests/swarm/test_swarm.py)
ORDER_TOL = 1e-6  # the order horizon: where summation order alone starts to show (module doc)
CLK_TCK = os.sysconf("SC_CLK_TCK")


class SizeFailed(RuntimeError):
    """One size could not be measured; the message says why."""


# ---------------------------------------------------------------- readings (pure but for /proc)

def thread_cpu_s(pid: int, tid: int | None = None) -> float | None:
    """utime + stime of one thread (the main thread by default) in seconds, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5), after "pid (comm)"


def memory_mb(pid: int) -> dict | None:
    """PSS and USS (private clean + dirty) of a process in MiB, from smaps_rollup; None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kb = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            kb[parts[0].rstrip(":")] = int(parts[1])
    return {"pss_mb": round(kb.get("Pss", 0) / 1024, 1),
            "uss_mb": round((kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024, 1),
            "rss_mb": round(kb.get("Rss", 0) / 1024, 1)}


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a whole process (all its threads) in seconds, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores, /proc/stat: everything but idle and iowait)."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(vals[:8]) - vals[3] - vals[4]) / CLK_TCK


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return math.nan


def reading(status: dict, loop_cpu_s: float | None) -> dict:
    """What the bench keeps of one node's status.json (plus its main thread's CPU read at the same moment)."""
    sent = status.get("sent") or {"ctrl": {}, "payload": {}}
    ctrl = sent.get("ctrl", {})
    peers = status.get("peers") or {}
    return {
        "name": status["name"], "role": status["role"], "stage": status.get("stage"), "pid": status.get("pid"),
        "time": status["time"], "iteration": status.get("iteration"),
        "peers": len(peers), "connected": sum(1 for p in peers.values() if p.get("connection", "none") != "none"),
        "libp2p": status.get("connections"),  # peers with a libp2p connection, in the table or not (DHT walks)
        "dht_ops": sum((sent.get("dht") or {}).values()),  # DHT operations it started, since its start
        "ctrl_frames": sum(v[0] for v in ctrl.values()), "ctrl_bytes": sum(v[1] for v in ctrl.values()),
        "flow_frames": sum(v[0] for k, v in ctrl.items() if k in FLOW_KINDS)
        + sum(v[0] for k, v in sent.get("payload", {}).items() if k in FLOW_KINDS),
        "payload_bytes": sum(v[1] for v in sent.get("payload", {}).values()),
        "compute_s": float(status.get("compute_s") or 0.0),
        "cpu_s": float((status.get("resources") or {}).get("cpu_s") or 0.0),
        "loop_cpu_s": loop_cpu_s,
        "out_cost": out_cost(status),
        "out_units": sum(n for per in (status.get("flows") or {}).values() for n in per.values()),
        "out_label": min((m["out_cost"] for m in (status.get("flow_machine") or {}).values()
                          if m.get("out_cost") is not None), default=None),
        "sent_again": max((m.get("sent_again", 0) for m in (status.get("flow_machine") or {}).values()), default=0),
        "ctrl": {k: v[0] for k, v in ctrl.items()},
    }


def out_cost(status: dict) -> float:
    """What a node's flows cost on its next links: its units to each next hop times the cost of that link
    (status.json `flows` and `link_costs`); summed over the swarm, the units' path costs (Equation 1 per link)."""
    costs = (status.get("link_costs") or {}).get("next", {})
    return sum(n * costs.get(p, 0.0) for per in (status.get("flows") or {}).values() for p, n in per.items())


def flow_cost(readings: dict[str, dict]) -> dict:
    """The swarm's flows: their cost (`out_cost` summed), the units the data nodes have placed, the nodes whose
    OUT label (status.json `flow_machine`) is below 0: with link costs above 0 only a negative cycle of the flows
    gives one (docs/bench_flow.md, "Flaps"), and the flow requests sent again (their reply lost)."""
    return {"cost": round(sum(r["out_cost"] for r in readings.values()), 3),
            "units": sum(r["out_units"] for r in readings.values() if r["role"] == "data"),
            "negative_labels": sum(1 for r in readings.values() if (r.get("out_label") or 0.0) < 0),
            "requests_sent_again": sum(r.get("sent_again", 0) for r in readings.values())}


def per_node(before: dict, after: dict, iterations: int) -> dict:
    """One node's figures between two readings, per iteration of the window: the iterations the node itself went
    through between them (its status.json's `iteration`), else `iterations` (the leader's records)."""
    own = (after.get("iteration") or 0) - (before.get("iteration") or 0)
    iterations = own if own > 0 else iterations
    d = {k: after[k] - before[k] for k in ("ctrl_frames", "ctrl_bytes", "flow_frames", "payload_bytes",
                                           "compute_s", "cpu_s")}
    secs = max(1e-9, after["time"] - before["time"])
    loop = None
    if after["loop_cpu_s"] is not None and before["loop_cpu_s"] is not None:
        loop = after["loop_cpu_s"] - before["loop_cpu_s"]
    return {
        "name": after["name"], "role": after["role"], "stage": after["stage"], "iterations": iterations,
        "seconds": round(secs, 2), "peers": after["peers"], "connected": after["connected"],
        "libp2p": after["libp2p"], "dht_ops": after["dht_ops"],
        "ctrl_frames_per_it": round(d["ctrl_frames"] / iterations, 1),
        "ctrl_bytes_per_it": round(d["ctrl_bytes"] / iterations),
        "ctrl_bytes_per_s": round(d["ctrl_bytes"] / secs),
        "flow_msgs_per_it": round(d["flow_frames"] / iterations, 2),
        "payload_bytes_per_it": round(d["payload_bytes"] / iterations),
        "loop_cpu_ms_per_it": None if loop is None else round(1000 * loop / iterations, 1),
        "cpu_minus_compute_ms_per_it": round(1000 * (d["cpu_s"] - d["compute_s"]) / iterations, 1),
        "compute_ms_per_it": round(1000 * d["compute_s"] / iterations, 1),
        "ctrl_kinds_per_it": {k: round((n - before["ctrl"].get(k, 0)) / iterations, 2)
                              for k, n in sorted(after["ctrl"].items()) if n > before["ctrl"].get(k, 0)},
    }


def _stats(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "max": None}
    return {"mean": round(statistics.mean(vals), 1), "max": round(max(vals), 1)}


def summarize(nodes: list[dict], formation: dict[str, int]) -> dict:
    """Relays' and data nodes' figures: mean and max of each per-node figure, by role."""
    out = {}
    for role in ("relay", "data"):
        rows = [n for n in nodes if n["role"] == role]
        if not rows:
            continue
        keys = ("peers", "connected", "libp2p", "dht_ops", "ctrl_frames_per_it", "ctrl_bytes_per_it",
                "ctrl_bytes_per_s", "flow_msgs_per_it", "loop_cpu_ms_per_it", "cpu_minus_compute_ms_per_it", "compute_ms_per_it")
        out[role] = {k: _stats([r[k] for r in rows]) for k in keys}
        out[role]["flow_msgs_formation"] = _stats([formation.get(r["name"]) for r in rows])
        kinds = sorted({k for r in rows for k in r["ctrl_kinds_per_it"]})
        out[role]["ctrl_kinds_per_it"] = {k: round(statistics.mean(r["ctrl_kinds_per_it"].get(k, 0.0) for r in rows), 2)
                                          for k in kinds}
    return out


def departs(losses: list[float], reference: list[float], tol: float = REL_TOL) -> int | None:
    """The first iteration whose loss is not within `tol` (relative) of the reference's (None: none)."""
    return next((t for t, (x, want) in enumerate(zip(losses, reference)) if not abs(x - want) <= tol * abs(want)),
                None)


def check_losses(records: list[dict], reference: list[float], microbatches: int,
                 horizon: int | None = None) -> list[str]:
    """What is wrong with the swarm's records against the centralized losses (empty: nothing); losses are
    compared before `horizon` (the order horizon, module doc; None: all)."""
    bad = []
    if [r["iteration"] for r in records] != list(range(len(reference))):
        bad.append(f"iterations {[r['iteration'] for r in records]}, expected 0..{len(reference) - 1}")
    for rec, want in zip(records, reference):
        if rec["microbatches"] != microbatches:
            bad.append(f"iteration {rec['iteration']}: {rec['microbatches']} microbatches, expected {microbatches}")
        if (horizon is None or rec["iteration"] < horizon) and not abs(rec["loss"] - want) <= REL_TOL * abs(want):
            bad.append(f"iteration {rec['iteration']}: loss {rec['loss']:.6f}, centralized {want:.6f}")
    return bad


SETTLED = re.compile(r"iteration (\d+) settled: completed \[([^\]]*)\]")
SUMMED = re.compile(r"iteration (\d+): summed in round (s(\d+)/\S+): contributions (\[.*\]);")


def node_log(state_dir: Path) -> str:
    """A node's whole log, its rotated files (node.log.N .. node.log.1, runtime/ops/logs.py) first."""
    rotated = sorted(state_dir.glob("node.log.*"), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    return "".join(p.read_text(errors="replace") for p in [*rotated, state_dir / "node.log"] if p.exists())


def check_ledger(logs: dict[str, tuple[str, str]], iterations: int) -> list[str]:
    """Every stage of every iteration < `iterations` summed exactly the microbatches its data nodes settled, all
    its relays in one round (relays that stepped in rounds of their own, or alone, hold different parameters
    even when together they summed every microbatch): `logs` maps a node's name to (role, its node.log); the
    problems (empty: none)."""
    settled: dict[int, set] = {}
    summed: dict[tuple[int, int], list] = {}
    rounds: dict[tuple[int, int], set] = {}
    for name, (role, text) in logs.items():
        pattern = SETTLED if role == "data" else SUMMED
        for m in pattern.finditer(text):
            t = int(m.group(1))
            if role == "data":
                settled.setdefault(t, set()).update((name, int(q)) for q in m.group(2).replace(",", " ").split())
            else:
                summed.setdefault((t, int(m.group(3))), []).extend(tuple(k) for k in json.loads(m.group(4)))
                rounds.setdefault((t, int(m.group(3))), set()).add(m.group(2) if not m.group(2).endswith("/alone")
                                                                   else f"{m.group(2)} ({name})")
    bad = [f"iteration {t} stage {stage}: its relays summed in {len(keys)} rounds ({', '.join(sorted(keys)[:3])})"
           for (t, stage), keys in sorted(rounds.items()) if t < iterations and len(keys) > 1]
    for (t, stage), keys in sorted(summed.items()):
        want = settled.get(t, set())
        if t < iterations and (sorted(keys) != sorted(want)):
            missing, extra = sorted(want - set(keys)), sorted(set(keys) - want)
            twice = len(keys) - len(set(keys))
            bad.append(f"iteration {t} stage {stage}: summed {len(keys)} of {len(want)} settled microbatches"
                       f" (missing {missing[:4]}, not settled {extra[:4]}, twice {twice})")
    stages = {s for _t, s in summed}
    for t in range(iterations):
        for stage in sorted(stages - {s for tt, s in summed if tt == t}):
            bad.append(f"iteration {t} stage {stage}: no relay logged its sum")
    return bad


def fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v >= 100:
        v = round(v)
    return f"{v}{unit}"


def table(rows: list[dict]) -> str:
    """The Markdown table of the measured sizes (one row per size; relays' figures as mean / max)."""
    head = ("| nodes (D + S x k) | formed in | pipeline s / it | window s / it | relay conns (libp2p) | data conns "
            "| relay flow msgs / it (formation) | relay ctrl frames / it | relay ctrl bytes / it | ctrl bytes / s "
            "| relay loop CPU ms / it | CPU - compute ms / it | swarm CPU cores (machine busy) "
            "| PSS / USS MiB per node | losses |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        size = f"{r['nodes']} ({r['data_nodes']} + {r['stages']} x {r['relays_per_stage']})"
        if r.get("error"):
            lines.append(f"| {size} | failed: {r['error']} |" + " |" * (head.count("|") - 3))
            continue
        s, d = r["summary"]["relay"], r["summary"].get("data", {})
        mm = lambda x: f"{fmt(x['mean'])} / {fmt(x['max'])}"  # noqa: E731
        lines.append(
            f"| {size} | {fmt(r['startup_s'], ' s')} | {fmt(r['seconds_per_iteration'])} | "
            f"{fmt(r['window_seconds_per_iteration'])} | {mm(s['connected'])} "
            f"({fmt(s.get('libp2p', {}).get('mean'))}) | "
            f"{fmt(d.get('connected', {}).get('max'))} | {mm(s['flow_msgs_per_it'])} "
            f"({fmt(s['flow_msgs_formation']['mean'])}) | {mm(s['ctrl_frames_per_it'])} | "
            f"{mm(s['ctrl_bytes_per_it'])} | {fmt(s['ctrl_bytes_per_s']['mean'])} | {mm(s['loop_cpu_ms_per_it'])} | "
            f"{fmt(s['cpu_minus_compute_ms_per_it']['mean'])} | {fmt(r['cpu']['swarm_cores'])} "
            f"({fmt(r['cpu']['machine_busy_cores'])}) | {fmt(r['memory']['pss_mb_mean'])} / "
            f"{fmt(r['memory']['uss_mb_mean'])} | {verdict(r)} |")
    return "\n".join(lines)


def verdict(r: dict) -> str:
    """The table's losses column: equal everywhere, equal up to the order horizon (module doc), or DIFFER."""
    if not r["losses_equal"]:
        return "DIFFER"
    if r.get("first_departure") is None:
        return "equal"
    return f"equal to it {r['order_horizon']} (order horizon; swarm leaves 1e-4 at {r['first_departure']})"


def flatness(rows: list[dict], key: str = "ctrl_bytes_per_it") -> float | None:
    """The largest measured size's mean relay figure over the smallest's (1.0: flat)."""
    ok = [r for r in rows if not r.get("error")]
    if len(ok) < 2:
        return None
    first, last = ok[0]["summary"]["relay"][key]["mean"], ok[-1]["summary"]["relay"][key]["mean"]
    return None if not first else round(last / first, 2)


# ---------------------------------------------------------------- one swarm

def read_statuses(swarm, names: list[str], deadline_s: float = 5.0) -> dict[str, dict]:
    """Every node's status.json caught as it is rewritten (once a second), with its main thread's CPU read at that
    moment: each node's counters, its iteration and its CPU then belong to one instant (a file not rewritten
    within `deadline_s`, a node busy beyond it, is read as it is)."""
    paths = {name: swarm.state_dir(name) / "status.json" for name in names}

    def mtime(path: Path) -> int:
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return 0

    old = {name: mtime(p) for name, p in paths.items()}
    out: dict[str, dict] = {}
    end = time.monotonic() + deadline_s
    while len(out) < len(names):
        late = time.monotonic() >= end
        for name in names:
            if name in out or (not late and mtime(paths[name]) == old[name]):
                continue
            pid = swarm.procs[name].pid
            loop_cpu = thread_cpu_s(pid)
            try:
                st = json.loads(paths[name].read_text())
            except (OSError, json.JSONDecodeError):
                if late and time.monotonic() > end + deadline_s:
                    raise SizeFailed(f"node {name} has no readable status.json") from None
                continue
            out[name] = reading(st, loop_cpu)
            out[name]["pid"] = pid
            out[name]["loop_lag_max_s"] = (st.get("event_loop") or {}).get("max_lag_s")
        time.sleep(0.02)
    return out


def cpu_share(swarm, names: list[str], t0: float, busy0: float) -> dict:
    """The CPU the swarm's processes spent since they started, in cores, beside the machine's busy cores."""
    spent = [process_cpu_s(swarm.procs[n].pid) for n in names if n in swarm.procs]
    secs = max(1e-9, time.monotonic() - t0)
    known = [c for c in spent if c is not None]
    busy = (machine_busy_s() - busy0) / secs
    return {"swarm_cores": round(sum(known) / secs, 2), "machine_busy_cores": round(busy, 2),
            "per_node_ms_per_s": round(1000 * sum(known) / secs / max(1, len(known)), 1),
            "seconds": round(secs, 1)}


DEAD_LINE = re.compile(r"^\S+ (\d\d:\d\d):\S+ WARNING gwtf\.node: peer \S+ presumed dead: silent for [\d.]+ s "
                       r"\(deadline ([\d.]+) s\)", re.M)


def dead_events(texts: list[str]) -> dict:
    """The "presumed dead" detections in node logs: how many, the minute with the most (HH:MM) and how many fell
    in it, and how many had the liveness floor for deadline (runtime/node/liveness.py DEAD_AFTER_S): a storm in
    one minute at the floor is a saturated machine, not crashes."""
    from gwtf_node.runtime.node.liveness import DEAD_AFTER_S

    per_minute: dict[str, int] = {}
    floor = 0
    for text in texts:
        for minute, deadline in DEAD_LINE.findall(text):
            per_minute[minute] = per_minute.get(minute, 0) + 1
            floor += float(deadline) == DEAD_AFTER_S
    peak = max(sorted(per_minute), key=per_minute.__getitem__, default=None)
    return {"presumed_dead_events": sum(per_minute.values()), "presumed_dead_peak_minute": peak,
            "presumed_dead_in_peak_minute": per_minute.get(peak, 0), "presumed_dead_at_floor": floor}


def diagnose(swarm, t0: float, busy0: float) -> dict:
    """Why a size failed, from what the swarm left: its CPU against the machine's, the false crash detections and
    refusals in the node logs, its memory, and what the first data node knew (peers met, slots routed)."""
    names = [n for n in swarm.names() if n in swarm.procs]
    out: dict = {"cpu": cpu_share(swarm, names, t0, busy0)}
    texts = [node_log(swarm.state_dir(n)) for n in names]
    mems = [m for m in (memory_mb(swarm.procs[n].pid) for n in names) if m is not None]
    out.update(dead_events(texts), unknown_peer_refusals=sum(t.count("(UNKNOWN_PEER)") for t in texts),
               pss_mb_mean=round(statistics.mean(m["pss_mb"] for m in mems), 1) if mems else None,
               mem_available_gib=round(mem_available_gib(), 2))
    try:
        st = json.loads((swarm.state_dir("d0") / "status.json").read_text())
        out["d0_peers"] = len(st.get("peers") or {})
        out["d0_slots_routed"] = sum((st.get("flows") or {}).get(st.get("peer_id"), {}).values())
        out["d0_loop_lag_max_s"] = (st.get("event_loop") or {}).get("max_lag_s")
    except (OSError, json.JSONDecodeError, AttributeError):
        pass
    return out


def run_size(n: int, a: argparse.Namespace, work: Path, say) -> dict:
    """Start the swarm of at least `n` nodes, measure it (module doc), take it down; the size's object."""
    from gwtf_node.model.manifest import default_manifest, save_manifest
    from gwtf_node.model.reference import train_centralized
    from gwtf_node.runtime.local.swarm import LocalError, LocalSwarm

    d, s = a.data_nodes, a.stages
    k = max(1, math.ceil((n - d) / s))
    row = {"nodes_asked": n, "nodes": d + s * k, "data_nodes": d, "stages": s, "relays_per_stage": k,
           "microbatches_per_iteration": d * k}
    man = default_manifest(stages=s, layers=s, hidden=a.hidden, seq_len=16, microbatch_size=2,
                           microbatches_per_iteration=k)
    run = work / "run.json"
    save_manifest(man, run)
    swarm = LocalSwarm(work, run, data_nodes=d, stages=s, relays_per_stage=k, iterations=10**6,
                       startup_timeout_s=a.startup_timeout, iteration_timeout_s=a.iteration_timeout,
                       log_level=a.log_level, relay_nice=a.relay_nice, links=a.links)
    if a.flow_neighbours is not None:  # every node's `join --flow-neighbours K` (protocol/neighbourhood.py)
        swarm.extra_args = {name: ["--flow-neighbours", str(a.flow_neighbours)] for name in swarm.names()}
    row["flow_neighbours"] = a.flow_neighbours
    if a.pooled_formation:  # every node's `join --pooled-formation` (runtime/node/pooling.py)
        for name in swarm.names():
            swarm.extra_args.setdefault(name, []).append("--pooled-formation")
    row["pooled_formation"] = a.pooled_formation
    for flag in ("scaled_formation", "waves_formation"):  # every node's `join --scaled-formation` / `--waves-...`
        if getattr(a, flag):
            for name in swarm.names():
                swarm.extra_args.setdefault(name, []).append("--" + flag.replace("_", "-"))
        row[flag] = getattr(a, flag)
    row["relay_nice"] = a.relay_nice
    row["links"] = None if a.links is None else str(a.links)
    avail0 = mem_available_gib()
    row["mem_available_gib_before"] = round(avail0, 2)
    busy0 = machine_busy_s()
    low = avail0
    t0 = time.monotonic()
    formation = before = after = None
    try:
        say(f"{row['nodes']} nodes: starting ({d} data nodes, {s} stages x {k} relays)")
        try:
            swarm.start()
        except LocalError as e:
            raise SizeFailed(str(e).splitlines()[0]) from None
        row["spawn_s"] = round(time.monotonic() - t0, 1)
        names = swarm.names()
        seen, last, told, checked, warm_at = 0, time.monotonic(), 0.0, 0.0, None
        while True:
            try:
                swarm._check_alive()
            except LocalError as e:
                raise SizeFailed(str(e).splitlines()[0]) from None
            low = min(low, mem_available_gib())
            if low < a.min_free_gib:
                raise SizeFailed(f"MemAvailable fell to {low:.1f} GiB (< --min-free-gib {a.min_free_gib}) with "
                                 f"{len(names)} nodes started")
            recs = swarm.records()
            if len(recs) > seen:
                seen, last = len(recs), time.monotonic()
                short = [r for r in recs if r["microbatches"] != d * k]
                if short:  # (its loss is not the reference's: the size failed, no need to measure on)
                    r = short[0]
                    raise SizeFailed(f"iteration {r['iteration']} settled {r['microbatches']} of {d * k} "
                                     f"microbatches (deferred {r.get('deferred')}, lost {r.get('lost')})")
            if seen and time.monotonic() - told >= 10:
                told = time.monotonic()
                say(f"{row['nodes']} nodes: iteration {recs[-1]['iteration']} loss {recs[-1]['loss']} "
                    f"({recs[-1]['seconds']:.1f} s)")
            if formation is None and seen >= 1:
                row["startup_s"] = round(time.monotonic() - t0, 1)
                formation = read_statuses(swarm, names)
            if before is None and seen >= a.warmup and a.until_formed > 0 and "formed_s" not in row:
                warm_at = warm_at or time.monotonic()
                if time.monotonic() - checked >= 5:  # (every status.json read: not at every turn)
                    checked = time.monotonic()
                    row["units_placed"] = flow_cost(read_statuses(swarm, names))["units"]
                    if row["units_placed"] >= d * k or time.monotonic() - warm_at > a.until_formed:
                        row["formed_s"] = round(time.monotonic() - t0, 1) if row["units_placed"] >= d * k else None
            if before is None and seen >= a.warmup and (a.until_formed <= 0 or "formed_s" in row):
                before = read_statuses(swarm, names)
                at, from_rec = time.monotonic(), len(swarm.records())
            if before is not None and seen >= from_rec + a.iterations and time.monotonic() - at >= a.window:
                after = read_statuses(swarm, names)
                mem = {name: memory_mb(swarm.procs[name].pid) for name in names}
                low = min(low, mem_available_gib())
                break
            limit = a.startup_timeout if seen == 0 else a.iteration_timeout
            if time.monotonic() - last > limit:
                raise SizeFailed(f"{'no iteration finished' if seen == 0 else 'no progress'} within {limit:.0f} s "
                                 f"({seen} iterations done)")
            time.sleep(0.5)
        records = swarm.records()
        row["cpu"] = cpu_share(swarm, names, t0, busy0)
    except SizeFailed as e:
        e.diagnosis = diagnose(swarm, t0, busy0)
        raise
    finally:
        say(f"{row['nodes']} nodes: stopping")
        swarm.stop()
    reference = train_centralized(man, len(records), data_nodes=d).losses
    horizon = departs(train_centralized(man, len(records), data_nodes=d, reverse=True).losses, reference, ORDER_TOL)
    logs = {name: (after[name]["role"], node_log(swarm.state_dir(name))) for name in names}
    nodes = [per_node(before[name], after[name], len(records) - from_rec) for name in names]
    for node in nodes:
        node["loop_lag_max_s"] = after[node["name"]]["loop_lag_max_s"]
    fm = {name: formation[name]["flow_frames"] for name in names}
    mems = [m for m in mem.values() if m is not None]
    # (the last iteration's relays may still be summing when the swarm is stopped: its loss is known at BEGIN)
    bad = check_losses(records, reference, d * k, horizon) + check_ledger(logs, len(records) - 1)
    row.update(
        iterations=len(records), window_s=round(statistics.mean(nd["seconds"] for nd in nodes), 1),
        window_iterations=round(statistics.mean(nd["iterations"] for nd in nodes), 1),
        seconds_per_iteration=round(statistics.mean(r["seconds"] for r in records[a.warmup:]), 2),
        window_seconds_per_iteration=round(statistics.mean(nd["seconds"] / nd["iterations"] for nd in nodes), 2),
        losses=[round(r["loss"], 6) for r in records], centralized=[round(x, 6) for x in reference],
        losses_equal=not bad, problems=bad, order_horizon=horizon,
        first_departure=departs([r["loss"] for r in records], reference),
        summary=summarize(nodes, fm), flow_cost_formed=flow_cost(formation), flow_cost=flow_cost(after),
        memory={"pss_mb_mean": round(statistics.mean(m["pss_mb"] for m in mems), 1),
                "uss_mb_mean": round(statistics.mean(m["uss_mb"] for m in mems), 1),
                "rss_mb_mean": round(statistics.mean(m["rss_mb"] for m in mems), 1),
                "mem_available_drop_gib": round(avail0 - low, 2),
                "drop_per_node_mb": round((avail0 - low) * 1024 / len(names), 1)},
        loop_lag_max_s=max((nd["loop_lag_max_s"] or 0.0) for nd in nodes),
        per_node=nodes)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[25, 50, 100], help="swarm sizes (at least so many)")
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--data-nodes", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=5, help="iterations measured at least, after the warmup")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured at least, after the warmup")
    ap.add_argument("--warmup", type=int, default=2, help="iterations before the measured window")
    ap.add_argument("--until-formed", type=float, default=0.0, metavar="S",
                    help="after the warmup, start the window only once the data nodes' flows hold their whole "
                         "demand, or S seconds have passed (formed_s: the time from the start, None if not)")
    ap.add_argument("--hidden", type=int, default=32, help="the tiny model's width (a multiple of 4)")
    ap.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for the first iteration")
    ap.add_argument("--iteration-timeout", type=float, default=300.0, help="seconds for each next iteration")
    ap.add_argument("--min-free-gib", type=float, default=3.0,
                    help="stop a size when MemAvailable falls under this (the machine is shared)")
    ap.add_argument("--links", type=Path, default=None,
                    help="links to emulate and cost as declared (gwtf-node local --links: a scenario or location "
                         "file such as data/geo12-links.json), instead of measuring loopback")
    ap.add_argument("--relay-nice", type=int, default=0,
                    help="the relays' niceness (gwtf-node local --relay-nice): the data nodes' CPU share")
    ap.add_argument("--flow-neighbours", type=int, default=None, metavar="K",
                    help="the daemons' --flow-neighbours K (0: every link; default: the daemons' default)")
    ap.add_argument("--pooled-formation", action="store_true",
                    help="the daemons' --pooled-formation (several data nodes: pooled, then homed)")
    ap.add_argument("--scaled-formation", action="store_true",
                    help="the daemons' --scaled-formation (one data node: cost scaling, then the flow machines)")
    ap.add_argument("--waves-formation", action="store_true",
                    help="the daemons' --waves-formation (label waves alone; default: auto, the daemons' default)")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--keep", action="store_true", help="keep each size's workdir (node logs)")
    ap.add_argument("--json", action="store_true", help="one JSON object per size on stdout")
    a = ap.parse_args()
    problems = []
    if a.flow_neighbours is not None and a.flow_neighbours < 0:
        problems.append("use --flow-neighbours >= 0")
    if a.scaled_formation and a.waves_formation:
        problems.append("give --scaled-formation or --waves-formation, not both")
    if a.data_nodes not in (1, 2, 3) or a.stages < 1 or a.iterations < 1 or a.warmup < 1:
        problems.append("use --data-nodes 1..3, --stages >= 1, --iterations >= 1 and --warmup >= 1")
    if any(n < a.data_nodes + a.stages for n in a.nodes):
        problems.append(f"every --nodes must be at least --data-nodes + --stages ({a.data_nodes + a.stages})")
    if a.hidden < 4 or a.hidden % 4:
        problems.append("--hidden must be a positive multiple of 4")
    if problems:
        print(f"bench_swarm_size: {'; '.join(problems)}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def on_term(signum, frame):  # noqa: ARG001 - SIGTERM takes the same path as Ctrl-C: every swarm stopped
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    rows = []
    try:
        for n in a.nodes:
            work = Path(tempfile.mkdtemp(prefix=f"gwtf-size{n}-"))
            try:
                row = run_size(n, a, work, say)
            except SizeFailed as e:
                row = {"nodes_asked": n, "nodes": a.data_nodes + a.stages * math.ceil((n - a.data_nodes) / a.stages),
                       "data_nodes": a.data_nodes, "stages": a.stages,
                       "relays_per_stage": math.ceil((n - a.data_nodes) / a.stages), "error": str(e),
                       "diagnosis": getattr(e, "diagnosis", None)}
                say(f"{row['nodes']} nodes: FAILED: {e} (workdir {work} kept); {json.dumps(row['diagnosis'])}")
                a.keep = True
            finally:
                if not a.keep:
                    shutil.rmtree(work, ignore_errors=True)
            rows.append(row)
            if a.json:
                print(json.dumps(row), flush=True)
    except KeyboardInterrupt:
        say("interrupted: the swarm is stopped")
        return 130
    print(table(rows), file=sys.stderr)
    ratio = flatness(rows)
    if ratio is not None:
        print(f"relay control bytes per iteration, largest size / smallest: {ratio}x", file=sys.stderr)
    failed = [r for r in rows if r.get("error") or not r.get("losses_equal")]
    for r in failed:
        print(f"size {r['nodes']}: {r.get('error') or '; '.join(r['problems'])}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

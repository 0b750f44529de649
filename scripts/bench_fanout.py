#!/usr/bin/env python
"""Connections per node: bounded fan-out (protocol/fanout.py) against a full mesh, by the rule and measured.

By the rule: the GWTF paper's Table VI swarm (3 data nodes, 15 relays over 6
stages, round-robin) and its 2x, 4x, 8x scale-ups (data nodes and relays
scaled, up to 145 nodes), then deeper pipelines of 5 relays a stage (12, 24,
48 stages), each with one relay not placed yet (a candidate): the
connections of each node when every node follows `fanout.works_with`
(`fanout.degrees`), against the N-1 of a full mesh, and the ratio.  A relay's
connections grow with three stages, not with the swarm: with 6 stages that
is about half of a full mesh, with 48 stages a sixteenth.

Measured (`--swarm S K`, optional): a local swarm of one data node and S
stages x K relays (separate processes on this machine) trains `--iterations`
iterations; then each node's peers (status.json) are counted and compared
with what the rule gives for the same swarm.

    python scripts/bench_fanout.py [--swarm 5 3 --iterations 3] [--json]

`--json` prints one object per swarm size with `nodes`, `relay_mean`,
`relay_max`, `data_max`, `full_mesh`, `ratio_full_to_relay_mean`, and, for
the measured swarm, an object with `kind: "measured"` and `per_node`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gwtf_node.protocol import fanout  # noqa: E402

STAGES, DATA, RELAYS = 6, 3, 15  # Table VI


def table_vi(scale: int, stages: int = STAGES, relays: int = RELAYS) -> list[tuple[str, str, int]]:
    nodes = [(f"d{i}", "data", -1) for i in range(DATA * scale)]
    nodes += [(f"r{i:04d}", "relay", i % stages) for i in range(relays * scale)]
    return nodes + [("candidate", "relay", fanout.UNPLACED)]


def summary(nodes: list[tuple[str, str, int]], deg: dict[str, int]) -> dict:
    relays = [deg[n] for n, role, stage in nodes if role == "relay" and stage >= 0]
    data = [deg[n] for n, role, _ in nodes if role == "data"]
    cand = [deg[n] for n, role, stage in nodes if role == "relay" and stage < 0]
    full = len(nodes) - 1
    return {"nodes": len(nodes), "relay_mean": round(statistics.mean(relays), 2), "relay_max": max(relays),
            "data_max": max(data), "candidate": cand[0] if cand else None, "full_mesh": full,
            "ratio_full_to_relay_mean": round(full / statistics.mean(relays), 2)}


def measured(stages: int, per_stage: int, iterations: int) -> dict:
    from gwtf_node.model.manifest import default_manifest, save_manifest
    from gwtf_node.runtime.local.swarm import LocalSwarm

    with tempfile.TemporaryDirectory(prefix="gwtf-fanout-") as tmp:
        work = Path(tmp)
        man = default_manifest(stages=stages, seq_len=16, microbatch_size=2, microbatches_per_iteration=per_stage)
        run = work / "run.json"
        save_manifest(man, run)
        swarm = LocalSwarm(work, run, data_nodes=1, stages=stages, relays_per_stage=per_stage,
                           iterations=iterations + 100, startup_timeout_s=300, iteration_timeout_s=300)
        try:
            swarm.start()
            for rec in swarm.iterations_done():  # (the peers are counted while the swarm trains, not as it stops)
                print(f"  iteration {rec['iteration']} loss {rec['loss']:.4f}", file=sys.stderr)
                if rec["iteration"] + 1 >= iterations:
                    break
            time.sleep(2.0)  # every status.json written after the last iteration (once a second)
            statuses = {n: json.loads((work / n / "status.json").read_text()) for n in swarm.names()}
        finally:
            swarm.stop()
    nodes = [(n, st["role"], st["stage"] if st["role"] == "relay" else -1) for n, st in sorted(statuses.items())]
    rule = fanout.degrees(nodes)
    per_node = {n: {"measured": len(st["peers"]), "rule": rule[n]} for n, st in sorted(statuses.items())}
    out = summary(nodes, {n: v["measured"] for n, v in per_node.items()})
    out.update(kind="measured", matches_rule=sum(v["measured"] == v["rule"] for v in per_node.values()),
               per_node=per_node)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swarm", nargs=2, type=int, metavar=("STAGES", "PER_STAGE"),
                    help="also run a local swarm of 1 data node and STAGES x PER_STAGE relays and count its peers")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for scale in (1, 2, 4, 8):
        nodes = table_vi(scale)
        rows.append({"scale": f"{scale}x", "kind": "rule", **summary(nodes, fanout.degrees(nodes))})
    for stages in (12, 24, 48):  # deeper pipelines, 5 relays a stage as in the 2x swarm
        nodes = table_vi(1, stages, 5 * stages)
        rows.append({"scale": f"{stages} stages x 5", "kind": "rule", **summary(nodes, fanout.degrees(nodes))})
    if a.swarm:
        rows.append({"scale": f"1 + {a.swarm[0]}x{a.swarm[1]}", **measured(a.swarm[0], a.swarm[1], a.iterations)})
    print("| swarm | kind | nodes | relay connections (mean / max) | data node | candidate | full mesh | "
          "full mesh / relay mean |", file=sys.stderr)
    print("|---|---|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['scale']} | {r['kind']} | {r['nodes']} | {r['relay_mean']} / {r['relay_max']} | "
              f"{r['data_max']} | {r['candidate'] if r['candidate'] is not None else '-'} | {r['full_mesh']} | "
              f"{r['ratio_full_to_relay_mean']}x |", file=sys.stderr)
        if r["kind"] == "measured":
            print(f"measured: {r['matches_rule']} of {r['nodes']} nodes have exactly the rule's connections",
                  file=sys.stderr)
    if a.json:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

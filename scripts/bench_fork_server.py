#!/usr/bin/env python3
"""The fork server of local swarms against a process per node: CPU and wall time of the same swarm, side by side.

    python scripts/bench_fork_server.py [--iterations 3] [--repeats 1]

Runs a 4-node swarm (1 data node, 2 stages x 1 relay, the default llama
manifest at seq_len 16) for `--iterations` with `LocalSwarm(fork_server=True)`
(every node forked from one process that imported torch, the model classes
and libp2p: runtime/local/zygote.py) and with `fork_server=False` (each node its own
`python -m gwtf_node.cli` process), alternating, each in a child process of
its own so that its CPU is counted alone (the swarm's processes and the fork
server are its descendants).  Prints each run's wall time and CPU time and
the ratios; the losses of both must be equal (exit 1 if not).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ONE = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm
fork, iterations = sys.argv[1] == "1", int(sys.argv[2])
with tempfile.TemporaryDirectory() as d:
    d = Path(d); run = d / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    t0 = time.monotonic()
    sw = LocalSwarm(d / "w", run, 1, 2, 1, iterations, fork_server=fork)
    try:
        sw.start()
        recs = list(sw.iterations_done())
    finally:
        sw.stop()
    wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "losses": [r["loss"] for r in recs]}))
"""


def one(fork: bool, iterations: int) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE, "1" if fork else "0", str(iterations)], check=True,
                         capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    rows = {True: [], False: []}
    for _ in range(a.repeats):
        for fork in (True, False):
            r = one(fork, a.iterations)
            rows[fork].append(r)
            print(f"fork_server={fork!s:5}  wall {r['wall_s']:6.1f} s  CPU {r['cpu_s']:6.1f} s", flush=True)
    mean = {k: {m: sum(r[m] for r in v) / len(v) for m in ("wall_s", "cpu_s")} for k, v in rows.items()}
    print(f"fork server / process per node: CPU {mean[True]['cpu_s'] / mean[False]['cpu_s']:.2f}x, "
          f"wall {mean[True]['wall_s'] / mean[False]['wall_s']:.2f}x")
    same = all(r["losses"] == rows[False][0]["losses"] for v in rows.values() for r in v)
    print("losses equal:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

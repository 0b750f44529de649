#!/usr/bin/env python3
"""Golden check of `sim train`: the sha256 of the JSON of a fixed matrix of runs.

The matrix: both Table II settings x both policies x churn 0 and 0.1 x seeds
0-1, 6 iterations each (`gwtf_node.sim.train.run_train`, every field of its
report, keys sorted).  A refactoring of the simulator or of the machines it
drives (recovery, flow, phases, leader) that must not change behaviour leaves
the hash identical:

    python scripts/golden_train.py --check scripts/golden_train.sha256   # exit 1 on a difference
    python scripts/golden_train.py --write scripts/golden_train.sha256   # after a change made on purpose
    python scripts/golden_train.py --json out.json                       # the runs themselves, to diff them
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from gwtf_node.sim.train import run_train

SETTINGS = ("table2-homogeneous", "table2-heterogeneous")
POLICIES = ("gwtf", "swarm")
CHURNS = (0.0, 0.1)
SEEDS = (0, 1)
ITERATIONS = 6


def runs() -> str:
    out = [run_train(s, p, c, ITERATIONS, seed) for s in SETTINGS for p in POLICIES for c in CHURNS for seed in SEEDS]
    return json.dumps(out, sort_keys=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="FILE", help="write the hash to FILE")
    ap.add_argument("--check", metavar="FILE", help="compare with the hash in FILE; exit 1 on a difference")
    ap.add_argument("--json", metavar="FILE", help="also write the runs' JSON to FILE")
    args = ap.parse_args(argv)
    text = runs()
    digest = hashlib.sha256(text.encode()).hexdigest()
    print(f"{digest}  sim-train-matrix")
    if args.json:
        Path(args.json).write_text(text)
    if args.write:
        Path(args.write).write_text(f"{digest}  sim-train-matrix\n")
    if args.check:
        want = Path(args.check).read_text().split()[0]
        if want != digest:
            print(f"differs from {args.check} ({want})", file=sys.stderr)
            return 1
        print("identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())

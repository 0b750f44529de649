"""`scripts/bench_compression.py --centralized`: the chain with each method's Top-K at the ratios the swarm's senders
choose, under both gradient rules, one JSON object per run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_centralized_mode_runs_each_rule_at_equation_7_ratios() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_compression.py"), "--centralized", "--iterations", "2",
         "--hidden", "32", "--seq-len", "16", "--microbatch-size", "2", "--methods", "adatopk",
         "--gradients", "aligned,topk", "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["method"], r["gradients"]) for r in rows] == [("none", None), ("adatopk", "aligned"),
                                                             ("adatopk", "topk")]
    # d0 Australia -> r0_0 Belgium (the slowest link: c * r = 20), Belgium -> r1_0 Germany (fast: dense),
    # Germany -> Australia (89.9 against 84.4 Mbit/s: 20 * 84.41 / 89.86)
    ratios = rows[1]["link_ratios"]
    assert ratios["crossing 0"] == [20.0, 20.0] and ratios["crossing 1"] == [1.0, 1.0]
    assert abs(ratios["crossing 2"][0] - 20 * 84.41 / 89.86) < 0.01
    assert rows[0]["losses"][0] != rows[1]["losses"][0]  # the forward pass goes through the Top-K
    assert rows[1]["losses"][0] == rows[2]["losses"][0]  # the same forward pass before the first step ...
    assert rows[1]["losses"][1] != rows[2]["losses"][1]  # ... and the two gradient rules train differently
    assert all(len(r["losses"]) == 2 and r["seconds_per_iteration"] is None for r in rows)
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_compression.py"), "--gradients", "dense"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode != 0 and "--gradients aligned,topk" in bad.stderr

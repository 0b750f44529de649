"""status.json's `resources`: the process's peak resident memory, its resident memory now and its CPU seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, time
from gwtf_node.runtime.node.status import resources
before = resources()
# 200 MiB above the high-water mark so far (importing torch can peak above what stays resident), written: resident
extra = int(before["peak_rss_mb"] - before["rss_mb"]) + 200
block = b"\\x01" * (extra << 20)
during = resources()
del block
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
after = resources()
print(json.dumps([before, during, after]))
"""


def test_resources_follow_peak_memory_and_cpu() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    before, during, after = json.loads(out.stdout)
    assert set(before) == {"peak_rss_mb", "rss_mb", "cpu_s", "torch_peak_mb"}
    assert before["torch_peak_mb"] is None  # a CPU process
    assert 0 < before["rss_mb"] <= before["peak_rss_mb"] + 5  # two counters, sampled apart
    assert during["rss_mb"] - before["rss_mb"] > 180
    assert during["peak_rss_mb"] - before["peak_rss_mb"] > 150
    assert after["rss_mb"] < during["rss_mb"] - 150  # freed: resident again as before ...
    assert after["peak_rss_mb"] >= during["peak_rss_mb"]  # ... while the high-water mark stays
    assert after["cpu_s"] >= before["cpu_s"] + 0.25

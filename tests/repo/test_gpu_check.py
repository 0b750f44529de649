"""scripts/gpu_check.py: skips in one line without CUDA, and its check runs (on the CPU here, on CUDA where present)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script does not skip there")
def test_without_cuda_it_skips_in_one_line() -> None:
    out = _run()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        "gpu_check: skipped: torch sees no CUDA device here (--device cpu runs the check on the CPU)"]


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
])
def test_the_chain_matches_the_reference(device: str) -> None:
    out = _run("--device", device, "--no-swarm", "--iterations", "2", "--hidden", "32", "--layers", "2",
               "--seq-len", "16", "--microbatch-size", "2", "--microbatches", "2", "--memory-preset", "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("== part 1:") == 2 and "gpu_check: ok" in out.stdout
    assert "tokens/s on" in out.stdout

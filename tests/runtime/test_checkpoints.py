"""Checkpoints in a state directory: atomic files, the newest N kept, clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gwtf_node.model.manifest import default_manifest
from gwtf_node.model.stages import build_stage
from gwtf_node.runtime.node import checkpoints
from gwtf_node.runtime.node.checkpoints import CheckpointError


def _stage():
    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, hidden=32)
    return man, build_stage(man, "relay", 1)


def _write(d: Path, man, model, steps: int, keep: int = 3) -> Path:
    return checkpoints.write(d, run_id=man.run_id, role="relay", stage=1, steps=steps, state=model.state_bytes(),
                             params_sha256=model.state_hash(), params=model.param_vector(), keep=keep)


def test_write_keeps_newest_and_links_latest(tmp_path: Path) -> None:
    man, model = _stage()
    for steps in (1, 2, 3, 4, 5):
        _write(tmp_path, man, model, steps, keep=2)
    names = [p.name for p in checkpoints.listing(tmp_path)]
    assert names == ["step-00000005.pt", "step-00000004.pt"]
    assert not list((tmp_path / checkpoints.DIR).glob("*.tmp")) and not list(tmp_path.glob(".*tmp"))
    latest = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert latest["steps"] == 5 and latest["stage"] == 1 and latest["role"] == "relay"
    ck = checkpoints.newest(tmp_path, run_id=man.run_id)
    assert ck is not None and ck.steps == 5 and ck.stage == 1
    assert ck.params_sha256 == model.state_hash()
    other = build_stage(man, "relay", 1)
    other.load_state_bytes(ck.state)
    assert other.state_hash() == model.state_hash()


def test_bad_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    man, model = _stage()
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        checkpoints.load(tmp_path / "nope.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        checkpoints.load(junk)
    torch.save({"format": "something else"}, junk)
    with pytest.raises(CheckpointError, match="not a gwtf-node checkpoint"):
        checkpoints.load(junk)
    path = _write(tmp_path, man, model, 7)
    with pytest.raises(CheckpointError, match="checkpoint of run"):
        checkpoints.load(path, run_id="another-run")
    rec = torch.load(path, weights_only=True)
    rec["state"][-1] ^= 1  # one bit of the state flipped
    torch.save(rec, path)
    with pytest.raises(CheckpointError, match="sha256"):
        checkpoints.load(path)


def test_newest_skips_a_damaged_file(tmp_path: Path) -> None:
    man, model = _stage()
    _write(tmp_path, man, model, 3)
    newest = _write(tmp_path, man, model, 4)
    newest.write_bytes(b"\0" * 10)  # damaged after it was written
    ck = checkpoints.newest(tmp_path)
    assert ck is not None and ck.steps == 3
    assert checkpoints.newest(tmp_path / "empty") is None

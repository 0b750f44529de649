"""A node that cannot write its checkpoints says so at start-up in one line; one whose disk fills while it runs
logs a WARNING and trains on (runtime/ops/statedir.py check_writable, runtime/node/checkpointer.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.ops.statedir import StateDirUnwritable, check_writable


def _join(tmp_path: Path, state: Path) -> subprocess.CompletedProcess:
    run = tmp_path / "run.json"
    save_manifest(default_manifest(), run)
    return subprocess.run([sys.executable, "-m", "gwtf_node", "join", "--run", str(run), "--role", "relay",
                           "--stage", "0", "--state-dir", str(state), "--insecure-unsigned"],
                          capture_output=True, text=True, timeout=120)


def test_a_checkpoints_file_where_the_directory_goes_is_one_line_at_start(tmp_path: Path) -> None:
    state = tmp_path / "r0"
    state.mkdir()
    (state / "checkpoints").write_text("not a directory")
    proc = _join(tmp_path, state)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {state / 'checkpoints'} is a file, where the node keeps a "
                                                "directory: move it away"]


def test_room_for_a_checkpoint_is_checked(tmp_path: Path) -> None:
    check_writable(tmp_path, 1)
    with pytest.raises(StateDirUnwritable, match="MiB free, a checkpoint"):
        check_writable(tmp_path, 2 ** 62)


def test_a_failed_checkpoint_write_mid_run_is_a_warning(tmp_path: Path, caplog) -> None:
    from gwtf_node.runtime.node.checkpointer import Checkpointer
    from gwtf_node.runtime.node.stage import LocalStage

    man = default_manifest()
    stage = LocalStage(man, "relay", "cpu", 0, 1)
    stage.build(0)
    holder = Checkpointer(stage, tmp_path, lambda: 0, every=1, keep=3)
    holder.write_now()  # a good write first
    good = sorted(os.listdir(tmp_path / "checkpoints"))
    assert len(good) == 1
    os.rename(tmp_path / "checkpoints", tmp_path / "kept")
    (tmp_path / "checkpoints").write_text("the directory is gone")  # as a full or broken disk would fail it
    stage.applied_steps += 1
    with caplog.at_level(logging.WARNING):
        holder.write_now()  # no exception: the node trains on
    assert any("could not write a checkpoint" in r.getMessage() for r in caplog.records)
    assert sorted(os.listdir(tmp_path / "kept")) == good  # the last good checkpoint is untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root")
def test_a_full_disk_leaves_no_partial_checkpoint(tmp_path: Path) -> None:
    import torch

    from gwtf_node.runtime.node import checkpoints

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(OSError, match="no space left on device"):
            checkpoints.write(mnt / "sd", run_id="r", role="relay", stage=0, steps=1, state=b"x" * 200_000,
                              params_sha256="h", params=torch.zeros(1000))
        assert os.listdir(mnt / "sd" / "checkpoints") == []
    finally:
        subprocess.run(["umount", str(mnt)])

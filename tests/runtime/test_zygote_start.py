"""A fork server that does not answer in time (a machine too busy to import torch) is stopped, and the local
launcher says so in one line instead of a traceback (runtime/local/zygote.py, runtime/local/swarm.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local import swarm as swarm_mod
from gwtf_node.runtime.local import zygote as zygote_mod
from gwtf_node.runtime.local.swarm import LocalError, LocalSwarm

SILENT = [sys.executable, "-c", "import time; time.sleep(600)"]  # a fork server that never says it is ready


def test_a_silent_fork_server_is_stopped_and_named(monkeypatch) -> None:
    started = []
    real_popen = zygote_mod.subprocess.Popen

    def popen(*a, **kw):
        started.append(real_popen(*a, **kw))
        return started[-1]

    monkeypatch.setattr(zygote_mod, "READY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(zygote_mod.subprocess, "Popen", popen)
    with pytest.raises(zygote_mod.ZygoteError, match="no answer from the fork server within 1 s"):
        zygote_mod.Zygote(SILENT)
    assert started and started[0].wait(timeout=30) is not None  # not left running


def test_the_launcher_turns_it_into_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(zygote_mod, "READY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(swarm_mod, "FORK_SERVER_COMMAND", SILENT)
    run = tmp_path / "run.json"
    save_manifest(default_manifest(), run)
    swarm = LocalSwarm(tmp_path / "w", run, data_nodes=1, stages=2, relays_per_stage=1, iterations=1)
    try:
        with pytest.raises(LocalError, match=r"could not start d0: no answer from the fork server within 1 s .*"
                                             r"try again when it is less loaded"):
            swarm.start()
    finally:
        swarm.stop()

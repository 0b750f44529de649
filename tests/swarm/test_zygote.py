"""The fork server of local swarms (runtime/local/zygote.py): children, their exit statuses, signals, its end.

Every child here is a real `gwtf-node` command forked from one zygote
process; every wait is bounded, and the zygote is closed (its children
killed) also when a test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import FORK_SERVER_COMMAND
from gwtf_node.runtime.local.zygote import Zygote

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def zygote():
    z = Zygote(FORK_SERVER_COMMAND)
    try:
        yield z
    finally:
        z.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _node(tmp_path: Path, zygote: Zygote, name: str, nice: int = 0):
    run = tmp_path / "run.json"
    if not run.exists():
        save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    sd = tmp_path / name
    sd.mkdir()
    argv = ["join", "--run", str(run), "--state-dir", str(sd), "--role", "relay", "--stage", "0",
            "--insecure-unsigned", "--name", name]
    child = zygote.spawn(argv, dict(os.environ), sd / "node.log", tmp_path / f"{name}.exit", nice=nice)
    deadline = time.monotonic() + 60
    while not (sd / "addr").exists():
        assert child.poll() is None, (sd / "node.log").read_text()
        assert time.monotonic() < deadline, "the node did not listen within 60 s"
        time.sleep(0.05)
    return child, sd


def test_a_command_runs_with_its_arguments_environment_and_log(zygote, tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    env = {**os.environ, "GWTF_ROLE": "relay", "GWTF_STAGE": "0"}  # (the settings a node takes from its environment)
    child = zygote.spawn(["join", "--run", str(tmp_path / "missing.json"), "--state-dir", str(tmp_path / "sd")], env,
                         log, tmp_path / "a.exit")
    assert child.wait(timeout=60) == 2  # the CLI's usage error: the flag names a file that does not exist
    assert "missing.json" in log.read_text(), log.read_text()
    assert child.returncode == 2 and child.poll() == 2
    ok = zygote.spawn(["--help"], dict(os.environ), tmp_path / "help.log", tmp_path / "b.exit")
    assert ok.wait(timeout=60) == 0
    assert "usage: gwtf-node" in (tmp_path / "help.log").read_text()


def test_a_node_is_its_own_session_and_its_signals_give_the_popen_statuses(zygote, tmp_path: Path) -> None:
    child, sd = _node(tmp_path, zygote, "a")
    assert os.getpgid(child.pid) == child.pid == os.getsid(child.pid)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    other, _ = _node(tmp_path, zygote, "b")
    other.terminate()  # a graceful stop: the daemon's own SIGTERM handling
    assert other.wait(timeout=60) == 0, (tmp_path / "b" / "node.log").read_text()[-2000:]


def test_a_node_runs_at_the_niceness_asked_in_every_thread(zygote, tmp_path: Path) -> None:
    """`gwtf-node local --relay-nice` (LocalSwarm.relay_nice): the relays run at a higher niceness than the data
    nodes, every thread of them (set in the forked child before it starts any)."""
    child, _ = _node(tmp_path, zygote, "n", nice=5)
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        nices = [int(Path(f"/proc/{child.pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[16])
                 for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(nices) > 1 and set(nices) == {min(19, base + 5)}, nices
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)


def test_closing_the_zygote_kills_what_it_started(tmp_path: Path) -> None:
    z = Zygote(FORK_SERVER_COMMAND)
    try:
        child, _ = _node(tmp_path, z, "c")
    finally:
        z.close()
    deadline = time.monotonic() + 30
    while _alive(child.pid):
        assert time.monotonic() < deadline, "a node outlived its zygote"
        time.sleep(0.05)
    assert child.poll() == -signal.SIGKILL

"""`gwtf-node local`: what it says while the swarm starts, where its workdir is, what it leaves there.

Most tests drive the command's front end (`cli/local.py`) with a scripted stand-in for the swarm, so that
phases, Ctrl-C and errors are checked without processes; one test runs a real two-node swarm.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf_node.cli.common import CliError
from gwtf_node.cli.local import EXIT_INTERRUPTED, run_swarm
from gwtf_node.model.manifest import default_manifest
from gwtf_node.runtime.local import swarm as launcher

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(i: int) -> dict:
    return {"iteration": i, "loss": 5.0 - i, "microbatches": 4, "samples": 16, "seconds": 0.5}


class ScriptedSwarm:
    """Stands in for runtime.local.swarm.LocalSwarm: phases, then records, then maybe an interruption or error."""

    def __init__(self, workdir: Path, iterations: int, fail: BaseException | None = None) -> None:
        self.workdir, self.iterations, self.fail = workdir, iterations, fail
        self.on_phase = None
        self.procs = {"d0": None, "r0_0": None}
        self.kills: list = []
        self.stopped = False

    def _say(self, text: str) -> None:
        self.on_phase(text)

    def start(self) -> None:
        for name in self.procs:
            (self.workdir / name).mkdir(parents=True)
            (self.workdir / name / "node.log").write_text("log\n")
        self._say("starting 2 nodes")
        self._say("waiting for flows to form: 0/4 microbatch slots of d0 routed")

    def iterations_done(self):
        self._say("training: iteration 0")
        for i in range(self.iterations):
            yield _record(i)
        if self.fail is not None:
            raise self.fail

    def stop(self) -> None:
        self.stopped = True

    def remove_state_dirs(self) -> None:
        launcher.LocalSwarm.remove_state_dirs(self)

    def state_dir(self, name: str) -> Path:
        return self.workdir / name


def _args(**kw) -> argparse.Namespace:
    base = dict(data_nodes=1, relays_per_stage=1, iterations=3, json=True, keep=False, churn=0.0)
    return argparse.Namespace(**{**base, **kw})


def test_json_run_names_its_workdir_and_phases_on_stderr_and_leaves_the_plot(tmp_path: Path, capsys) -> None:
    swarm = ScriptedSwarm(tmp_path / "w", 3)
    assert run_swarm(swarm, default_manifest(), _args()) == 0
    out, err = capsys.readouterr()
    assert [json.loads(ln)["iteration"] for ln in out.splitlines()] == [0, 1, 2]  # stdout: records only
    lines = err.splitlines()
    assert lines[0].startswith(f"gwtf-node local: workdir {swarm.workdir}: 1 data node(s)")
    assert "gwtf-node local: starting 2 nodes" in lines
    assert "gwtf-node local: waiting for flows to form: 0/4 microbatch slots of d0 routed" in lines
    assert lines[-1] == (f"workdir {swarm.workdir}: iterations.jsonl, loss.png (the nodes' state directories are "
                         "removed; --keep keeps them)")
    assert swarm.stopped
    assert sorted(p.name for p in swarm.workdir.iterdir()) == ["iterations.jsonl", "loss.png"]
    assert (swarm.workdir / "loss.png").read_bytes().startswith(PNG_MAGIC)
    assert [json.loads(ln) for ln in (swarm.workdir / "iterations.jsonl").read_text().splitlines()] == \
           [_record(i) for i in range(3)]


def test_keep_keeps_the_state_directories(tmp_path: Path, capsys) -> None:
    swarm = ScriptedSwarm(tmp_path / "w", 2)
    assert run_swarm(swarm, default_manifest(), _args(iterations=2, keep=True)) == 0
    assert (swarm.workdir / "d0" / "node.log").is_file() and (swarm.workdir / "loss.png").is_file()
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"workdir {swarm.workdir}: kept whole")


def test_ctrl_c_says_where_the_workdir_is(tmp_path: Path, capsys) -> None:
    swarm = ScriptedSwarm(tmp_path / "w", 1, fail=KeyboardInterrupt())
    assert run_swarm(swarm, default_manifest(), _args(iterations=5)) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert f"interrupted after 1 iteration(s); workdir {swarm.workdir}" in err
    assert swarm.stopped and (swarm.workdir / "loss.png").is_file() and not (swarm.workdir / "d0").exists()


def test_an_error_keeps_everything_and_says_where(tmp_path: Path) -> None:
    swarm = ScriptedSwarm(tmp_path / "w", 1, fail=launcher.LocalError("node r0_0 exited with status 1"))
    with pytest.raises(CliError, match=f"the workdir {swarm.workdir} is kept"):
        run_swarm(swarm, default_manifest(), _args(iterations=5))
    assert (swarm.workdir / "r0_0" / "node.log").is_file()


def test_the_progress_bar_counts_training_only(tmp_path: Path, capsys) -> None:
    swarm = ScriptedSwarm(tmp_path / "w", 3)
    assert run_swarm(swarm, default_manifest(), _args(json=False)) == 0
    err = capsys.readouterr().err
    assert "done: loss 5.0000 -> 3.0000 over 3 iterations, 1.5 s of training (0.50 s per iteration)" in err


def test_startup_phases_come_from_the_first_data_node_status(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text(default_manifest(microbatches_per_iteration=4).to_json())
    said: list[str] = []
    swarm = launcher.LocalSwarm(tmp_path, run, 1, 2, 1, 3, on_phase=said.append)
    swarm._demand = 4
    (tmp_path / "d0").mkdir()
    status = tmp_path / "d0" / "status.json"
    for peers, routed in ((1, 0), (2, 0), (2, 3), (2, 4)):
        status.write_text(json.dumps({"peer_id": "me", "peers": {f"p{i}": {} for i in range(peers)},
                                      "flows": {"me": {"p0": routed}}}))
        swarm._startup_phase()
    assert said == ["waiting for the nodes to meet: 2/3 known to d0",
                    "waiting for flows to form: 0/4 microbatch slots of d0 routed",
                    "waiting for flows to form: 3/4 microbatch slots of d0 routed",
                    "training: iteration 0"]


@pytest.mark.multiprocess
def test_a_real_local_swarm(tmp_path: Path) -> None:
    """Two iterations of 1 data node and 1 stage x 1 relay, with --json and --keep."""
    work = tmp_path / "w"
    out = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "local", "--stages", "1", "--relays-per-stage", "1",
                          "--iterations", "2", "--microbatches", "2", "--json", "--keep", "--workdir", str(work)],
                         capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [json.loads(ln)["iteration"] for ln in out.stdout.splitlines()] == [0, 1]
    err = out.stderr.splitlines()
    assert err[0].startswith(f"gwtf-node local: workdir {work}: 1 data node(s), 1 stages x 1 relays")
    assert "gwtf-node local: starting 2 nodes" in err and "gwtf-node local: stopping the swarm" in err
    assert any(ln.startswith("gwtf-node local: training") for ln in err)
    assert (work / "loss.png").read_bytes().startswith(PNG_MAGIC)
    for name in ("d0", "r0_0"):
        log = (work / name / "node.log").read_text()
        assert "INFO gwtf.node:" in log
        for chatter in ("new dials", "AUTO_CONNECTOR_STATE", "Failed to open TCP stream", "Traceback"):
            assert chatter not in log, (name, chatter)
        assert not (work / name / "node.log.1").exists()

"""What a volunteer types wrong gets one line that says what to fix (cli/common.py, cli/status.py,
runtime/node/checkpoints.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gwtf_node.cli import main


@pytest.mark.parametrize(("argv", "hint"), [
    (["join", "--run", "x", "--role", "relay", "--stagee", "1"], "did you mean --stage?"),
    (["join", "--run", "x", "--role", "relay", "--bootstap", "/ip4/1.2.3.4/tcp/1"], "did you mean --bootstrap?"),
    (["local", "--relay-per-stage", "3"], "did you mean --relays-per-stage?"),
    (["sim", "train", "--iteratons", "3"], "did you mean --iterations?"),
])
def test_a_mistyped_flag_gets_a_suggestion(capsys, argv: list[str], hint: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(hint) and len(err.strip().splitlines()) == 1, err


def test_a_flag_like_nothing_gets_no_suggestion(capsys) -> None:
    assert main(["local", "--zzzzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_status_takes_state_dir_twice(tmp_path: Path, capsys) -> None:
    """`--state-dir a --state-dir b` names both (as `--state-dir a b` does), not only the last."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert main(["status", "--state-dir", str(a), "--state-dir", str(b), "--once"]) == 1
    said = capsys.readouterr()
    assert f"{a}, {b}" in said.out + said.err, said


def test_a_checkpoint_holding_code_is_refused_without_torchs_advice(tmp_path: Path) -> None:
    import torch

    from gwtf_node.runtime.node.checkpoints import CheckpointError, load

    path = tmp_path / "ckpt.pt"
    torch.save({"format": "x", "what": Path("/")}, path)  # a pickled object, not a tensor or plain value
    with pytest.raises(CheckpointError) as e:
        load(path)
    assert "weights_only" not in str(e.value) and "could run code" in str(e.value)
    assert len(str(e.value).splitlines()) == 1


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("role", "stage", "words"), [
    ("data", None, "d0: stopping (a data node stops now and says Goodbye to its peers"),
    ("relay", None, "d0: stopping (a relay not placed in a stage yet"),
    ("relay", 1, "d0: leaving (finishing its microbatches and aggregation)"),
])
def test_leave_says_one_true_thing_by_signal(tmp_path: Path, capsys, role: str, stage, words: str) -> None:
    """No control socket: `leave` signals the pid of status.json, and says what that signal does to that node."""
    sd = tmp_path / "d0"
    sd.mkdir()
    proc = _sleeper()
    try:
        (sd / "status.json").write_text(json.dumps({"pid": proc.pid, "name": "d0", "role": role, "stage": stage}))
        assert main(["leave", "--state-dir", str(sd), "--timeout", "20"]) == 0
    finally:
        proc.kill()
        proc.wait(timeout=10)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith(words) and out[1] == "left", out


@pytest.mark.parametrize(("graceful", "role", "words"), [
    (False, "data", "d0: stopping (a data node stops now"),
    (True, "relay", "d0: leaving (finishing"),
])
def test_leave_says_one_true_thing_over_the_socket(tmp_path: Path, capsys, graceful: bool, role: str,
                                                   words: str) -> None:
    """The node's control socket answers the leave op (runtime/ops/control.py): one line for what the node does."""
    import threading

    import trio

    from gwtf_node.runtime.ops import control

    sd = tmp_path / "d0"
    sd.mkdir()
    proc = _sleeper()
    ready, stop = threading.Event(), threading.Event()

    def leave() -> dict:
        proc.terminate()
        return {"graceful": graceful, "pid": proc.pid, "role": role}

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(control.serve, sd, lambda: {}, leave)
            ready.set()
            while not stop.is_set():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    server = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    server.start()
    try:
        assert ready.wait(20)
        assert main(["leave", "--state-dir", str(sd), "--timeout", "20"]) == 0
    finally:
        stop.set()
        server.join(20)
        proc.kill()
        proc.wait(timeout=10)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith(words) and out[1] == "left", out


def test_install_service_with_a_relative_unit_path_prints_commands_for_that_unit(tmp_path: Path, capsys,
                                                                                 monkeypatch) -> None:
    """`install-service --unit-path x.service`: `systemctl link` takes only an absolute path, and the unit's own
    comment names x, not gwtf-node."""
    from gwtf_node.model.manifest import default_manifest, save_manifest

    save_manifest(default_manifest(), tmp_path / "run.json")
    monkeypatch.chdir(tmp_path)
    argv = ["install-service", "--unit-path", "x.service", "--service-state-dir", str(tmp_path / "state"),
            "--run", "run.json", "--role", "relay", "--insecure-unsigned"]
    (tmp_path / "state").mkdir()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"systemctl link {tmp_path / 'x.service'} && systemctl daemon-reload && systemctl enable --now " \
           "x.service" in out, out
    assert "journalctl -fu x " in out and "gwtf-node.service" not in out
    unit = (tmp_path / "x.service").read_text()
    assert "journalctl -u x;" in unit and "systemctl stop x" in unit and "systemctl stop gwtf-node" not in unit
    assert main([*argv[:2], "x.unit", *argv[3:]]) == 2  # systemd would not take it as a service
    err = capsys.readouterr().err
    assert "--unit-path x.unit" in err and ".service" in err and len(err.strip().splitlines()) == 1

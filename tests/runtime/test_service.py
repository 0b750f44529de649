"""`gwtf-node install-service` (cli/service.py): the unit it writes, checked by systemd itself.

`systemd-analyze verify` parses the unit as systemd would and checks that
ExecStart's executable exists; a unit it objects to (an unknown key, a
missing executable) is shown to fail, so the check can fail.  The `join`
flags are checked by the `join` parser at install time, the manifest path
and state directory are the service's own, and writing needs root.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gwtf_node.cli import main
from gwtf_node.cli import service
from gwtf_node.model.manifest import default_manifest, save_manifest

BOOTSTRAP = "/ip4/192.0.2.7/tcp/4001/p2p/12D3KooWRBy97UB99e3J6hiPesre1MZeuNQvfan4gBziswrRJsNK"

needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed")


@pytest.fixture
def run_json(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    save_manifest(default_manifest(), path)
    return path


def _unit(capsys, *argv: str) -> str:
    assert main(["install-service", "--print", *argv]) == 0
    return capsys.readouterr().out


def _verify(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "gwtf-node.service"  # verify wants the unit's own name
    path.write_text(text)
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)


def _exec_start(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


@needs_systemd_analyze
def test_systemd_analyze_verify_passes_on_the_unit(tmp_path: Path, run_json: Path, capsys) -> None:
    text = _unit(capsys, "--run", str(run_json), "--role", "relay", "--bootstrap", BOOTSTRAP, "--host", "0.0.0.0",
                 "--port", "4001", "--name", "home gpu 50%")
    done = _verify(tmp_path, text)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr
    argv = _exec_start(text)
    assert Path(argv[0]).is_absolute() and Path(argv[0]).exists()


@needs_systemd_analyze
@pytest.mark.parametrize("spoil", [
    lambda t: t.replace("Type=notify", "Type=notify\nNoSuchKey=yes"),
    lambda t: "\n".join(f"ExecStart=/nonexistent/gwtf-node join" if x.startswith("ExecStart=") else x
                        for x in t.splitlines()) + "\n",
])
def test_verify_rejects_a_spoiled_unit(tmp_path: Path, run_json: Path, capsys, spoil) -> None:
    """The check above can fail: systemd-analyze objects to an unknown key and to a missing executable."""
    text = spoil(_unit(capsys, "--run", str(run_json), "--role", "relay"))
    done = _verify(tmp_path, text)
    assert done.returncode != 0 or done.stderr != ""


def test_the_unit_runs_join_with_the_flags_given(run_json: Path, capsys) -> None:
    text = _unit(capsys, "--run", str(run_json), "--role", "relay", "--state-dir", "/home/me/gwtf",
                 "--bootstrap", BOOTSTRAP, "--name", "home gpu 50%", "--device", "cuda")
    argv = _exec_start(text)
    join = argv[argv.index("join"):]
    # the manifest and the state directory are the service's; the rest as given, in order
    assert join == ["join", "--run", str(run_json), "--state-dir", "/var/lib/gwtf-node", "--role", "relay",
                    "--bootstrap", BOOTSTRAP, "--name", "home gpu 50%%", "--device", "cuda"]  # % is systemd's
    for line in ("Type=notify", "Restart=on-failure", "RestartPreventExitStatus=2", "DynamicUser=yes",
                 "StateDirectory=gwtf-node", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "PrivateTmp=yes", "DevicePolicy=closed", "DeviceAllow=char-nvidia-frontend rw"):
        assert line in text.splitlines(), line
    assert any(x.startswith("WatchdogSec=") for x in text.splitlines())
    # homes hidden, or an empty tmpfs over them with this installation bound (test_service_sandbox.py)
    assert "ProtectHome=yes" in text.splitlines() or "BindReadOnlyPaths=" in text


def test_a_cpu_node_gets_no_device(run_json: Path, capsys) -> None:
    text = _unit(capsys, "--run", str(run_json), "--role", "relay", "--device", "cpu")
    assert "DevicePolicy=closed" in text and "DeviceAllow=" not in text


@pytest.mark.parametrize(("argv", "needle"), [
    ([], "needs the flags of `gwtf-node join`"),
    (["--role", "relay"], "--run"),
    (["--run", "RUN", "--role", "relay", "--port", "99999"], "--port"),
    (["--run", "RUN", "--role", "relay", "--frobnicate"], "--frobnicate"),
    (["--run", "/nonexistent/run.json", "--role", "relay"], "no such file"),
    (["--run", "RUN", "--role", "relay", "--exec", "gwtf-node"], "absolute path"),
])
def test_bad_join_flags_are_refused_at_install(run_json: Path, capsys, argv: list[str], needle: str) -> None:
    argv = [str(run_json) if a == "RUN" else a for a in argv]
    assert main(["install-service", "--print", *argv]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


def test_install_writes_the_unit_and_refuses_without_root(tmp_path: Path, run_json: Path, capsys,
                                                         monkeypatch) -> None:
    out = tmp_path / "systemd" / "gwtf-node.service"
    out.parent.mkdir()
    argv = ["install-service", "--unit-path", str(out), "--run", str(run_json), "--role", "relay"]
    monkeypatch.setattr(service.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(service.os, "access", lambda path, mode: False)  # as for a user in /etc/systemd/system
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs root" in err and "--print" in err and not out.exists()
    monkeypatch.undo()
    assert main(argv) == 0
    assert "systemctl daemon-reload && systemctl enable --now gwtf-node" in capsys.readouterr().out
    assert out.read_text().startswith("# Written by `gwtf-node install-service`")

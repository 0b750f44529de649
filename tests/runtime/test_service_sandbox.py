"""`install-service` makes a unit that can start: what its sandbox hides is bound, admission is checked first.

The unit's `ProtectHome=` and `PrivateTmp=yes` hide the home directories and
/tmp from the service (cli/sandbox.py).  `visible` below reads a unit as
systemd would for those three settings, so the tests check what the service
can see, not which lines the installer wrote.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gwtf_node.cli import main
from gwtf_node.cli.sandbox import binds, hidden_by, unreadable
from gwtf_node.cli.service import systemctl_hint
from gwtf_node.model.certificates import issue_certificate
from gwtf_node.model.manifest import default_manifest, save_manifest, sign_manifest


def visible(unit: str, path: str) -> bool:
    """Whether the service of `unit` sees `path`: not under a hidden tree, or under a BindReadOnlyPaths= one."""
    lines = unit.splitlines()
    protect_home = next(x.split("=", 1)[1] for x in lines if x.startswith("ProtectHome="))
    private_tmp = "PrivateTmp=yes" in lines
    bound = [shlex.split(x.split("=", 1)[1])[0] for x in lines if x.startswith("BindReadOnlyPaths=")]
    p = os.path.abspath(path)
    if any(p == b or p.startswith(b.rstrip("/") + "/") for b in bound):
        return True
    if protect_home in ("yes", "tmpfs", "read-only") and p.startswith(("/home/", "/root/", "/run/user/")):
        return protect_home == "read-only"
    if private_tmp and p.startswith(("/tmp/", "/var/tmp/")):
        return False
    return True


def _installation(parent: str) -> Path:
    """A stand-in installation: bin/gwtf-node, world-readable, under `parent`."""
    root = Path(tempfile.mkdtemp(prefix="gwtf-venv-", dir=parent))
    os.chmod(root, 0o755)
    (root / "bin").mkdir(mode=0o755)
    script = root / "bin" / "gwtf-node"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o755)
    return root


@pytest.fixture
def tmp_run() -> Path:
    """A manifest under /tmp, world-readable, as a volunteer downloads it."""
    d = Path(tempfile.mkdtemp(prefix="gwtf-run-", dir="/tmp"))
    os.chmod(d, 0o755)
    path = d / "run.json"
    save_manifest(default_manifest(), path)
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(d, ignore_errors=True)


def _print_unit(capsys, *argv: str) -> str:
    assert main(["install-service", "--print", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_manifest_under_tmp_and_an_installation_there_are_bound(tmp_run: Path, capsys) -> None:
    inst = _installation("/tmp")
    try:
        unit = _print_unit(capsys, "--exec", str(inst / "bin" / "gwtf-node"), "--run", str(tmp_run), "--role", "relay")
        assert visible(unit, str(inst / "bin" / "gwtf-node")) and visible(unit, str(tmp_run))
        assert "PrivateTmp=yes" in unit.splitlines()
        assert f"BindReadOnlyPaths={tmp_run}" in unit.splitlines()
        # the check can fail: without the bind lines the service would not see them
        bare = "\n".join(x for x in unit.splitlines() if not x.startswith("BindReadOnlyPaths="))
        assert not visible(bare, str(tmp_run)) and not visible(bare, str(inst / "bin" / "gwtf-node"))
        if shutil.which("systemd-analyze"):
            f = Path(tempfile.mkdtemp()) / "gwtf-node.service"
            f.write_text(unit)
            done = subprocess.run(["systemd-analyze", "verify", str(f)], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0 and done.stderr == "", done.stderr
            shutil.rmtree(f.parent)
    finally:
        shutil.rmtree(inst, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/root"), reason="needs root to make a venv under /root")
def test_a_venv_under_a_home_directory_is_bound_on_a_tmpfs(tmp_run: Path, capsys) -> None:
    inst = _installation("/root")
    try:
        unit = _print_unit(capsys, "--exec", str(inst / "bin" / "gwtf-node"), "--run", str(tmp_run), "--role", "relay")
        assert "ProtectHome=tmpfs" in unit.splitlines()
        assert visible(unit, str(inst / "bin" / "gwtf-node")) and not visible(unit, "/root/.bashrc")
    finally:
        shutil.rmtree(inst, ignore_errors=True)


def test_this_installation_is_visible_to_its_unit(tmp_run: Path, capsys) -> None:
    """The default executable: this venv, its base interpreter (pyenv's under /root here) and the package."""
    import sys

    import gwtf_node

    unit = _print_unit(capsys, "--run", str(tmp_run), "--role", "relay")
    for p in (sys.prefix, os.path.realpath(sys.executable), gwtf_node.__file__):
        assert visible(unit, p), p


def test_what_the_dynamic_user_cannot_read_is_refused(tmp_run: Path, capsys) -> None:
    os.chmod(tmp_run, 0o600)
    assert main(["install-service", "--print", "--run", str(tmp_run), "--role", "relay"]) == 2
    err = capsys.readouterr().err
    assert f"chmod o+r {tmp_run}" in err and len(err.strip().splitlines()) == 1
    assert unreadable(tmp_run, binds([tmp_run])) is not None
    os.chmod(tmp_run, 0o644)
    assert unreadable(tmp_run, binds([tmp_run])) is None


def test_hidden_by() -> None:
    assert hidden_by("/root/.venv") == hidden_by("/home/me/x") == "ProtectHome"
    assert hidden_by("/tmp/run.json") == hidden_by("/var/tmp/x") == "PrivateTmp"
    assert hidden_by("/opt/gwtf/bin/gwtf-node") is None and hidden_by("/tmpfoo") is None
    assert binds([Path("/tmp/a/b"), Path("/tmp/a"), Path("/opt/x")]) == [Path("/tmp/a")]


@pytest.fixture
def signed_run(tmp_run: Path) -> tuple[Path, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    save_manifest(sign_manifest(default_manifest(), key), tmp_run)
    return tmp_run, key


def test_a_relay_of_a_signed_run_needs_its_certificate_first(signed_run, tmp_path: Path, capsys) -> None:
    run, key = signed_run
    state = tmp_path / "service-state"
    unit_path = tmp_path / "units" / "gwtf-node.service"
    unit_path.parent.mkdir()
    base = ["install-service", "--service-state-dir", str(state), "--unit-path", str(unit_path), "--run", str(run),
            "--role", "relay"]
    # --print cannot check a certificate against an identity that does not exist yet
    assert main([*base, "--print"]) == 2
    assert "no identity key yet" in capsys.readouterr().err
    # installing creates the service's identity and says the owner's command; no unit that would exit 2
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "gwtf-node admit --run" in err and "--peer-id 12D3KooW" in err and len(err.strip().splitlines()) == 1
    assert (state / "identity.key").exists() and not unit_path.exists()
    pid = err.split("--peer-id ")[1].split()[0]
    from gwtf_node.model.manifest import load_manifest

    run_id = load_manifest(run, check_files=False).run_id
    wrong = tmp_path / "wrong.json"
    wrong.write_text(issue_certificate(key, run_id, pid, "data", 0).to_json())
    assert main([*base, "--certificate", str(wrong)]) == 2
    assert "role" in capsys.readouterr().err and not unit_path.exists()
    cert = tmp_path / "certificate.json"
    cert.write_text(issue_certificate(key, run_id, pid, "relay", 0).to_json())
    assert main([*base, "--certificate", str(cert)]) == 0
    out = capsys.readouterr().out
    assert (state / "certificate.json").read_text() == cert.read_text()
    assert "--certificate" not in unit_path.read_text()  # the state directory's certificate.json is the default
    assert f"systemctl link {unit_path}" in out
    # once stored, a reinstall needs no --certificate
    assert main(base) == 0


def test_systemctl_hint_fits_where_the_unit_is() -> None:
    assert "systemctl link" not in systemctl_hint(Path("/etc/systemd/system/gwtf-node.service"))
    assert systemctl_hint(Path("/srv/units/gwtf-b.service")).startswith(
        "start it now and at every boot:  systemctl link /srv/units/gwtf-b.service && systemctl daemon-reload && "
        "systemctl enable --now gwtf-b.service")

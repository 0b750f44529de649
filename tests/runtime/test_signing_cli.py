"""The owner's workflow on the command line: init-run signs, admit, revoke, and what join refuses up front."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

from gwtf_node.cli import main
from gwtf_node.model.certificates import check_certificate, check_revocations, load_owner_key, public_key_hex
from gwtf_node.model.manifest import default_manifest, load_manifest, save_manifest, verify_manifest


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def _peer_id(capsys, state_dir: Path) -> str:
    assert main(["peer-id", "--state-dir", str(state_dir)]) == 0
    return capsys.readouterr().out.strip()


def test_init_run_creates_the_owner_key_beside_the_run_and_signs(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run.json"
    assert main(["init-run", "--out", str(run), "--stages", "1"]) == 0
    assert "new: keep it private" in capsys.readouterr().out
    key_file = tmp_path / "owner.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    man = load_manifest(run)
    verify_manifest(man)
    key = load_owner_key(key_file)
    assert man.owner_public_key == public_key_hex(key)
    assert key_file.read_bytes()[-32:].hex() not in run.read_text()  # the private key never enters the manifest
    other = tmp_path / "b" / "run.json"
    other.parent.mkdir()
    assert main(["init-run", "--out", str(other), "--owner-key", str(key_file), "--open-relays"]) == 0
    m2 = load_manifest(other)
    assert m2.owner_public_key == man.owner_public_key and m2.open_relays and not man.open_relays
    assert not (other.parent / "owner.key").exists()


def test_admit_and_revoke(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run.json"
    assert main(["init-run", "--out", str(run), "--stages", "1"]) == 0
    capsys.readouterr()
    man = load_manifest(run)
    pid = _peer_id(capsys, tmp_path / "node")
    assert pid == _peer_id(capsys, tmp_path / "node")  # the identity is kept
    cert = tmp_path / "node" / "certificate.json"
    assert main(["admit", "--run", str(run), "--peer-id", pid, "--role", "data", "--expires", "30d",
                 "--out", str(cert)]) == 0
    capsys.readouterr()
    c = check_certificate(cert.read_bytes(), owner_public_key=man.owner_public_key, run_id=man.run_id,
                          peer_id=pid, role="data", now=time.time())
    assert 29 * 86400 < c.expires - time.time() <= 30 * 86400
    assert "not a libp2p peer id" in _one_line_error(
        capsys, ["admit", "--run", str(run), "--peer-id", "nope", "--role", "data", "--out", str(tmp_path / "x")])
    (tmp_path / "other").mkdir()
    assert main(["init-run", "--out", str(tmp_path / "other" / "run.json")]) == 0
    capsys.readouterr()
    assert "is not the owner key of" in _one_line_error(
        capsys, ["admit", "--run", str(run), "--peer-id", pid, "--role", "data",
                 "--owner-key", str(tmp_path / "other" / "owner.key")])
    assert main(["revoke", "--run", str(run), "--peer-id", pid]) == 0
    capsys.readouterr()
    other = _peer_id(capsys, tmp_path / "n2")
    assert main(["revoke", "--run", str(run), "--peer-id", other]) == 0
    rl = check_revocations((tmp_path / "revoked.json").read_bytes(), owner_public_key=man.owner_public_key,
                           run_id=man.run_id)
    assert set(rl.peer_ids) == {pid, other}  # the list grows


def test_join_refuses_an_unsigned_or_altered_run_and_a_node_without_admission(tmp_path: Path, capsys) -> None:
    unsigned = tmp_path / "unsigned.json"
    save_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8), unsigned)
    sd = str(tmp_path / "sd")
    assert "not signed by a run owner" in _one_line_error(
        capsys, ["join", "--run", str(unsigned), "--role", "relay", "--stage", "0", "--state-dir", sd])

    run = tmp_path / "run.json"
    assert main(["init-run", "--out", str(run), "--stages", "1"]) == 0
    capsys.readouterr()
    altered = tmp_path / "altered.json"
    altered.write_text(run.read_text().replace('"lr": 0.003', '"lr": 0.004'))
    assert "signature does not match" in _one_line_error(
        capsys, ["join", "--run", str(altered), "--role", "relay", "--stage", "0", "--state-dir", sd])

    err = _one_line_error(capsys, ["join", "--run", str(run), "--role", "data", "--state-dir", sd])
    pid = _peer_id(capsys, Path(sd))
    assert "no certificate at" in err and f"gwtf-node admit --run {run} --peer-id {pid} --role data" in err

    cert = tmp_path / "c.json"  # admitted as a relay, joins as a data node
    assert main(["admit", "--run", str(run), "--peer-id", pid, "--role", "relay", "--out", str(cert)]) == 0
    capsys.readouterr()
    assert "admits a relay node, not a data node" in _one_line_error(
        capsys, ["join", "--run", str(run), "--role", "data", "--state-dir", sd, "--certificate", str(cert)])

    expired = tmp_path / "expired.json"
    past = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 60))
    assert main(["admit", "--run", str(run), "--peer-id", pid, "--role", "data", "--expires", past,
                 "--out", str(expired)]) == 0
    capsys.readouterr()
    assert "certificate expired at" in _one_line_error(
        capsys, ["join", "--run", str(run), "--role", "data", "--state-dir", sd, "--certificate", str(expired)])

    bad = tmp_path / "revoked.json"
    bad.write_text(json.dumps({"kind": "gwtf-revocations-v1", "run_id": "x", "peer_ids": [], "issued": 1,
                               "signature": "00"}))
    assert "--revocations" in _one_line_error(
        capsys, ["join", "--run", str(run), "--role", "data", "--state-dir", sd, "--certificate", str(cert),
                 "--revocations", str(bad)])

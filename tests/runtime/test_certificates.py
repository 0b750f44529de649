"""Owner key, admission certificates, revocation lists and the manifest's signature (model/certificates.py).

Every refusal is asserted by its `Problem` and by its one-line message: the
person who reads it learns what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gwtf_node.model.certificates import (
    AdmissionError, Certificate, Problem, check_certificate, check_revocations, issue_certificate,
    load_or_create_owner_key, load_owner_key, parse_expiry, public_key_hex, sign_revocations,
)
from gwtf_node.model.manifest import (
    ManifestError, RunManifest, default_manifest, load_manifest, require_signed, save_manifest, sign_manifest,
)

NOW = 1_800_000_000.0
PEER = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"
OTHER = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


@pytest.fixture
def owner() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _check(raw, owner, **kw):
    args = dict(owner_public_key=public_key_hex(owner), run_id="run1", peer_id=PEER, role="data", now=NOW) | kw
    return check_certificate(raw, **args)


def _one_line(e: AdmissionError | ManifestError) -> str:
    text = str(e)
    assert "\n" not in text and text
    return text


def test_a_certificate_admits_its_peer_for_its_role_and_run(owner) -> None:
    cert = issue_certificate(owner, "run1", PEER, "data", int(NOW) + 60)
    assert _check(cert.to_json(), owner) == cert
    assert _check(cert.to_bytes(), owner) == cert  # compact or indented: the same certificate
    assert Certificate.from_json(cert.to_json()) == cert


@pytest.mark.parametrize("change, problem, says", [
    (dict(peer_id=OTHER), Problem.WRONG_PEER, "not for"),
    (dict(run_id="run2"), Problem.WRONG_RUN, "this run is 'run2'"),
    (dict(role="relay"), Problem.WRONG_ROLE, "admits a data node, not a relay"),
    (dict(now=NOW + 61), Problem.EXPIRED, "expired at"),
])
def test_a_certificate_is_refused_for_another_peer_run_role_or_time(owner, change, problem, says) -> None:
    cert = issue_certificate(owner, "run1", PEER, "data", int(NOW) + 60)
    with pytest.raises(AdmissionError) as e:
        _check(cert.to_json(), owner, **change)
    assert e.value.problem is problem and says in _one_line(e.value)


def test_a_forged_or_altered_certificate_is_refused(owner) -> None:
    cert = issue_certificate(owner, "run1", PEER, "relay")
    forged = issue_certificate(Ed25519PrivateKey.generate(), "run1", PEER, "data")  # someone else's key
    promoted = dataclasses.replace(cert, role="data")  # a relay that makes itself a data node
    for raw in (forged.to_json(), promoted.to_json()):
        with pytest.raises(AdmissionError) as e:
            _check(raw, owner)
        assert e.value.problem is Problem.BAD_SIGNATURE and "not signed by this run's owner" in _one_line(e.value)
    for raw in (b"", b"[]", b"{not json", json.dumps({"kind": "gwtf-certificate-v1"}).encode(), b"x" * 5000):
        with pytest.raises(AdmissionError) as e:
            _check(raw, owner)
        assert e.value.problem is Problem.MALFORMED, raw[:40]
        _one_line(e.value)


def test_one_flipped_byte_anywhere_in_a_certificate_refuses_it(owner) -> None:
    raw = bytearray(issue_certificate(owner, "run1", PEER, "data", int(NOW) + 60).to_bytes())
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        try:
            _check(bytes(bad), owner)
        except AdmissionError as e:
            _one_line(e)
            continue
        pytest.fail(f"a certificate with byte {i} flipped ({bytes(bad)[max(0, i - 10):i + 10]!r}) was accepted")


def test_revocation_lists_are_the_owners_and_the_newest_stands(owner) -> None:
    rl = sign_revocations(owner, "run1", [OTHER, PEER, PEER], issued=5)
    assert rl.peer_ids == tuple(sorted({PEER, OTHER}))
    got = check_revocations(rl.to_bytes(), owner_public_key=public_key_hex(owner), run_id="run1")
    assert got == rl
    with pytest.raises(AdmissionError) as e:
        check_revocations(rl.to_bytes(), owner_public_key=public_key_hex(owner), run_id="run2")
    assert e.value.problem is Problem.WRONG_RUN
    fake = sign_revocations(Ed25519PrivateKey.generate(), "run1", [PEER], issued=6)
    with pytest.raises(AdmissionError) as e:  # a member cannot revoke the others
        check_revocations(fake.to_bytes(), owner_public_key=public_key_hex(owner), run_id="run1")
    assert e.value.problem is Problem.BAD_SIGNATURE


def test_the_owner_key_file_is_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "owner.key"
    key, created = load_or_create_owner_key(path)
    assert created and stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created = load_or_create_owner_key(path)
    assert not created and public_key_hex(again) == public_key_hex(key)
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a gwtf-node owner key"):
        load_owner_key(path)


def test_expiry_is_a_duration_or_an_iso_time() -> None:
    assert parse_expiry("90m", NOW) == int(NOW) + 5400
    assert parse_expiry("30d", NOW) == int(NOW) + 30 * 86400
    assert parse_expiry("2027-01-31T12:00:00+00:00", NOW) == 1801396800
    assert parse_expiry("2027-01-31T12:00:00", NOW) == 1801396800  # no zone: UTC
    with pytest.raises(ValueError, match="neither a duration"):
        parse_expiry("tomorrow", NOW)


def test_a_manifest_with_one_flipped_byte_is_refused_with_one_line(tmp_path: Path, owner) -> None:
    """Every byte of a signed run.json matters: flipping any one of them is refused (bad JSON, a field out of its
    rules, or a signature that no longer matches), never accepted as another run."""
    run = tmp_path / "run.json"
    signed = sign_manifest(default_manifest(stages=1, layers=1, hidden=16, seq_len=8), owner)
    save_manifest(signed, run)
    require_signed(load_manifest(run))
    raw = run.read_bytes()
    step = max(1, len(raw) // 400)  # ~400 positions spread over the file (every byte: several seconds)
    for i in range(0, len(raw), step):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        if bytes(bad).isspace() or chr(bad[i]).isspace() and chr(raw[i]).isspace():
            continue  # whitespace for whitespace outside strings: the same JSON
        run.write_bytes(bytes(bad))
        try:
            m = load_manifest(run)
            require_signed(m)
        except ManifestError as e:
            _one_line(e)
            continue
        assert m == RunManifest.from_json(raw.decode()), f"byte {i} flipped gave another run that passed"
    with pytest.raises(ManifestError, match="not signed by a run owner.*--insecure-unsigned"):
        require_signed(default_manifest(stages=1, layers=1, hidden=16, seq_len=8))
    require_signed(default_manifest(stages=1, layers=1, hidden=16, seq_len=8), insecure_unsigned=True)

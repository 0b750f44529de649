"""Run ownership: the owner's key, admission certificates and the revocation list.

Theory of operation
-------------------
The owner of a run holds an Ed25519 key (`owner.key`, mode 0600, never inside
the manifest); the manifest carries its public key and the owner's signature
(manifest.py), so the run id, which hashes the signed bytes, names the owner
too.  The owner admits nodes one by one: a *certificate* says "peer id P may
take part in run R as a data node (or a relay) until time T", signed by the
owner key.  A node presents its certificate in every Hello; a peer checks it
against the owner key of the manifest it joined with, the run id, the peer id
that Noise authenticated, the role the Hello claims, and the clock.  A data
node is always named by certificate; a relay is too unless the manifest says
the run is open to any relay (`open_relays`).

The owner takes admissions back with a signed *revocation list* (the run id,
the revoked peer ids, and when it was issued: a newer list replaces an older
one).  Nodes read it from a file (`--revocations`) and from the DHT record
`run/<run id>/revoked`; a revoked peer is dropped and its frames refused.

Every signed object is canonical JSON (sorted keys, no whitespace) of its
fields plus a `kind` naming the object and its format, so a signature over
one kind can never be replayed as another.  The checks here are pure
functions of their inputs (the time is handed in); failures raise
`AdmissionError` with a `Problem` and one line for a person.
"""

from __future__ import annotations

import enum
import json
import os
import re
import stat
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

OWNER_KEY_FILE = "owner.key"  # default name, next to run.json
CERTIFICATE_FILE = "certificate.json"  # default place of a node's certificate: its state directory
CERT_KIND = "gwtf-certificate-v1"
REVOCATIONS_KIND = "gwtf-revocations-v1"
_KEY_MAGIC = b"gwtf-owner-ed25519-v1\n"  # header of the owner key file: format and version
_SEED_BYTES = 32
ROLES = ("data", "relay")
MAX_CERTIFICATE_BYTES = 4096  # a certificate is ~300 bytes; a bound on what a Hello makes us parse


class Problem(enum.Enum):
    """What is wrong with a certificate or a revocation list."""

    MALFORMED = "malformed"  # not the JSON of a certificate
    BAD_SIGNATURE = "bad signature"  # not signed by the run owner's key
    WRONG_RUN = "wrong run"  # signed for another run
    WRONG_PEER = "wrong peer"  # issued to another peer id
    WRONG_ROLE = "wrong role"  # admits another role than the one claimed
    EXPIRED = "expired"  # past its expiry
    REVOKED = "revoked"  # its peer is on the owner's revocation list


class AdmissionError(ValueError):
    """A certificate or revocation list that does not hold; `problem` says which check failed."""

    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


# ---- the owner's key ----------------------------------------------------------


def public_key_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def load_owner_key(path: Path) -> Ed25519PrivateKey:
    """The owner key stored at `path`; a file that is not one raises ValueError with what to do."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the owner key {path}: {e.strerror} (init-run writes it; give --owner-key)") from None
    if len(data) != len(_KEY_MAGIC) + _SEED_BYTES or not data.startswith(_KEY_MAGIC):
        raise ValueError(f"{path} is not a gwtf-node owner key ({len(data)} bytes, expected "
                         f"{len(_KEY_MAGIC) + _SEED_BYTES} starting with {_KEY_MAGIC!r})")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, 0o600)  # the key must stay private
    return Ed25519PrivateKey.from_private_bytes(data[len(_KEY_MAGIC):])


def load_or_create_owner_key(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The owner key at `path`, created (mode 0600, written atomically) if absent; and whether it was created."""
    path = Path(path)
    if path.exists():
        return load_owner_key(path), False
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    write_private_file(path, _KEY_MAGIC + seed)
    return key, True


def write_private_file(path: Path, data: bytes) -> None:
    """Write a secret (a private key) to `path` atomically, readable by its owner only (mode 0600)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)  # in case the umask or an old tmp file left other bits
    os.replace(tmp, path)


# ---- canonical signed objects ------------------------------------------------------


def _canonical(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _verify(owner_public_key: str, signature: str, message: bytes, what: str) -> None:
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(owner_public_key))
        key.verify(bytes.fromhex(signature), message)
    except (ValueError, InvalidSignature):
        raise AdmissionError(Problem.BAD_SIGNATURE,
                             f"{what} is not signed by this run's owner key {owner_public_key[:16]}...: it was "
                             "altered, or issued for another run") from None


def _loads(raw: bytes | str, what: str, limit: int) -> dict:
    if len(raw) > limit:
        raise AdmissionError(Problem.MALFORMED, f"{what} of {len(raw)} bytes exceeds {limit} bytes")
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise AdmissionError(Problem.MALFORMED, f"{what} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise AdmissionError(Problem.MALFORMED, f"{what} is not a JSON object")
    return d


@dataclass(frozen=True)
class Certificate:
    """The owner admits `peer_id` to run `run_id` as `role` until `expires` (unix seconds; 0: no expiry)."""

    run_id: str
    peer_id: str
    role: str
    expires: int
    signature: str = ""

    def signed_bytes(self) -> bytes:
        d = asdict(self)
        del d["signature"]
        return _canonical(d | {"kind": CERT_KIND})

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"kind": CERT_KIND}, sort_keys=True, indent=1)

    def to_bytes(self) -> bytes:
        return _canonical(asdict(self) | {"kind": CERT_KIND})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Certificate":
        d = _loads(raw, "certificate", MAX_CERTIFICATE_BYTES)
        try:
            if d.pop("kind") != CERT_KIND:
                raise KeyError("kind")
            c = cls(run_id=d.pop("run_id"), peer_id=d.pop("peer_id"), role=d.pop("role"),
                    expires=d.pop("expires"), signature=d.pop("signature"))
        except KeyError as e:
            raise AdmissionError(Problem.MALFORMED, f"certificate lacks {e.args[0]!r} (or it is not "
                                                   f"a {CERT_KIND})") from None
        if d or not all(isinstance(v, str) for v in (c.run_id, c.peer_id, c.role, c.signature)) \
                or type(c.expires) is not int or c.expires < 0:
            raise AdmissionError(Problem.MALFORMED, "certificate has unknown fields or fields of the wrong type")
        return c


def issue_certificate(key: Ed25519PrivateKey, run_id: str, peer_id: str, role: str, expires: int = 0) -> Certificate:
    """A certificate for `peer_id` as `role` in `run_id`, signed by the owner `key`."""
    if role not in ROLES:
        raise ValueError(f"role is {role!r}; a node is admitted as one of {', '.join(ROLES)}")
    c = Certificate(run_id, peer_id, role, int(expires))
    return Certificate(run_id, peer_id, role, int(expires), key.sign(c.signed_bytes()).hex())


def check_certificate(raw: bytes | str, *, owner_public_key: str, run_id: str, peer_id: str, role: str,
                      now: float) -> Certificate:
    """The certificate in `raw` if it admits `peer_id` as `role` to `run_id` at time `now`; else AdmissionError."""
    c = Certificate.from_json(raw)
    _verify(owner_public_key, c.signature, c.signed_bytes(), "certificate")
    if c.run_id != run_id:
        raise AdmissionError(Problem.WRONG_RUN, f"certificate is for run {c.run_id!r}, this run is {run_id!r}")
    if c.peer_id != peer_id:
        raise AdmissionError(Problem.WRONG_PEER,
                             f"certificate is for peer {c.peer_id[:16]}..., not for {peer_id[:16]}...")
    if c.role != role:
        raise AdmissionError(Problem.WRONG_ROLE, f"certificate admits a {c.role} node, not a {role} node")
    if c.expires and now >= c.expires:
        raise AdmissionError(Problem.EXPIRED, f"certificate expired at {_iso(c.expires)}: ask the run owner "
                                              "for a new one (gwtf-node admit)")
    return c


# ---- revocation ---------------------------------------------------------------------


@dataclass(frozen=True)
class RevocationList:
    """The owner's list of peers no longer admitted to `run_id`; of two lists the later `issued` stands."""

    run_id: str
    peer_ids: tuple[str, ...]
    issued: int  # unix seconds (ns precision is not needed: the owner issues lists by hand)
    signature: str = ""

    def _fields(self) -> dict:
        return {"run_id": self.run_id, "peer_ids": sorted(self.peer_ids), "issued": self.issued,
                "kind": REVOCATIONS_KIND}

    def signed_bytes(self) -> bytes:
        return _canonical(self._fields())

    def to_bytes(self) -> bytes:
        return _canonical(self._fields() | {"signature": self.signature})

    @classmethod
    def from_json(cls, raw: bytes | str) -> "RevocationList":
        d = _loads(raw, "revocation list", 1 << 20)
        try:
            if d.pop("kind") != REVOCATIONS_KIND:
                raise KeyError("kind")
            r = cls(d.pop("run_id"), tuple(d.pop("peer_ids")), d.pop("issued"), d.pop("signature"))
        except (KeyError, TypeError) as e:
            raise AdmissionError(Problem.MALFORMED, f"revocation list lacks {e.args[0]!r}") from None
        if d or not all(isinstance(p, str) for p in r.peer_ids) or type(r.issued) is not int:
            raise AdmissionError(Problem.MALFORMED, "revocation list has unknown fields or fields of the wrong type")
        return r


def sign_revocations(key: Ed25519PrivateKey, run_id: str, peer_ids, issued: int) -> RevocationList:
    r = RevocationList(run_id, tuple(sorted(set(peer_ids))), int(issued))
    return RevocationList(r.run_id, r.peer_ids, r.issued, key.sign(r.signed_bytes()).hex())


def check_revocations(raw: bytes | str, *, owner_public_key: str, run_id: str) -> RevocationList:
    """The revocation list in `raw` if the run owner signed it for `run_id`; else AdmissionError."""
    r = RevocationList.from_json(raw)
    _verify(owner_public_key, r.signature, r.signed_bytes(), "revocation list")
    if r.run_id != run_id:
        raise AdmissionError(Problem.WRONG_RUN, f"revocation list is for run {r.run_id!r}, this run is {run_id!r}")
    return r


# ---- expiry -----------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_expiry(text: str, now: float) -> int:
    """Unix seconds of `--expires`: a duration from now (`90m`, `12h`, `30d`, `2w`) or an ISO 8601 time."""
    m = _DURATION.match(text.strip())
    if m:
        return int(now) + int(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--expires {text!r} is neither a duration (90m, 12h, 30d, 2w) nor an ISO 8601 time "
                         "(2027-01-31T12:00:00+00:00)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp())


def _iso(unix_s: int) -> str:
    return datetime.fromtimestamp(unix_s, timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "AdmissionError", "CERTIFICATE_FILE", "Certificate", "OWNER_KEY_FILE", "Problem", "ROLES", "RevocationList",
    "check_certificate", "check_revocations", "issue_certificate", "load_or_create_owner_key", "load_owner_key",
    "parse_expiry", "public_key_hex", "sign_revocations",
]

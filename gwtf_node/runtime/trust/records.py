"""Signed DHT records: every record our nodes write is signed by its writer and checked on read.

Theory of operation
-------------------
The DHT is open: any peer that speaks Kademlia can store any value under any
key, and the holders keep the highest version (host.py).  So a record proves
nothing by being there; it is believed only when it carries the signature of
a peer that may write its key.

A record is canonical JSON (sorted keys, no whitespace) of
`{kind, key, version, value, writer, public_key}` plus `signature`, the
writer's Ed25519 signature (its libp2p identity key, identity.py) over the
same object without the signature.  The key and the version are inside the
signed bytes, so a record cannot be moved to another key, and an old record
cannot be replayed under a higher version to pin it (host.py stores the
version in front of the value: `open_record` refuses a record whose outer
version differs from the signed one).  The writer is the peer id derived from
`public_key`, so a record names its writer truthfully or fails.

Who may write what (`check_writer`):

==========================  ==================================================
`node/<peer id>`            that peer only
`run/<run id>/leader`       a data node naming itself as the leader, with its
                            term; in an owned run its data-node certificate
                            (certificates.py) rides in the record and must be
                            the owner's for that peer id
`run/<run id>`              anyone: the value is the manifest, which carries
                            the owner's signature and must hash to the run id
`run/<run id>/revoked`      anyone: the value is the owner-signed revocation
                            list, checked by the reader (certificates.py)
==========================  ==================================================

Holders check too: a node's DHT validator (`SignedRecordValidator`) refuses
to store a record that does not pass these checks, and a reader filters the
records it is handed before comparing versions (`get_signed`), so a forged
record of a higher version neither replaces nor hides the genuine one.

Provider records (`provide` / `find_providers`) are py-libp2p's own: an
honest holder keeps a provider only from that provider itself, but any
holder can answer a lookup with made-up ones (peer ids of its choice, at
addresses of its choice).  So a provider is believed on read only with its
signed node record (`checked_provider`): `node/<its peer id>`, signed by that
peer, naming this run and not saying it left; the addresses dialled are the
ones it signed, never the holder's.  A provider without one is refused (and
counted as BAD_RECORD, like any refused record).  Whoever answers the dial is
then authenticated by Noise and admitted by the certificate in its Hello.

Everything here is a pure function of its arguments (the time is handed in),
tested without a network (tests/runtime/test_records.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from libp2p.crypto.ed25519 import Ed25519PublicKey as Libp2pEd25519PublicKey
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from ...model.certificates import AdmissionError, check_certificate
from ..net.host import DHT_NAMESPACE, VersionedValidator, unpack_record

log = logging.getLogger("gwtf.node")

RECORD_KIND = "gwtf-record-v1"
MAX_PROVIDERS_CHECKED = 16  # node records looked up per provider lookup: bounds what made-up providers cost us
MAX_RECORD_BYTES = 1 << 20  # the manifest record is the largest (a few KiB); bounds what a lookup makes us parse
MAX_WARNED = 256  # distinct refusal reasons remembered, so each is a WARNING once


class RecordError(ValueError):
    """A DHT record that is not to be believed; the text says why, in one line."""


class RecordLeft(RecordError):
    """A provider's node record says it left the run: a node gone on purpose, not a forgery."""


class RecordExpired(RecordError):
    """A node record past its `expires` time: its writer stopped refreshing it (gone for a while), not a forgery."""


@dataclass(frozen=True)
class SignedRecord:
    key: str
    version: int
    value: Any  # JSON value
    writer: str  # peer id of the signer


def _canonical(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal(key_pair: KeyPair, key: str, version: int, value: Any) -> bytes:
    """The record of `value` under `key` and `version`, signed by `key_pair` (the writer's libp2p identity)."""
    public = key_pair.public_key.to_bytes()
    body = {"kind": RECORD_KIND, "key": key, "version": int(version), "value": value,
            "writer": ID.from_pubkey(key_pair.public_key).to_base58(), "public_key": public.hex()}
    signature = key_pair.private_key.sign(_canonical(body))
    return _canonical(body | {"signature": signature.hex()})


def open_record(key: str, version: int, data: bytes) -> SignedRecord:
    """The signed record in `data` read under `key` at `version`; RecordError unless its writer signed it so."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"record under {key} has {len(data)} bytes, over {MAX_RECORD_BYTES}")
    try:
        d = json.loads(data)
        if not isinstance(d, dict) or d.get("kind") != RECORD_KIND:
            raise ValueError("not a signed record")
        signature = bytes.fromhex(d.pop("signature"))
        public = bytes.fromhex(d["public_key"])
        writer = d["writer"]
        signed_key, signed_version = d["key"], d["version"]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise RecordError(f"record under {key} is not a signed gwtf record (unsigned, or malformed)") from None
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, _canonical(d))
        derived = ID.from_pubkey(Libp2pEd25519PublicKey.from_bytes(public)).to_base58()
    except (ValueError, InvalidSignature):
        raise RecordError(f"record under {key} has a signature that does not match its writer's key") from None
    if derived != writer:
        raise RecordError(f"record under {key} names writer {str(writer)[:16]}, its key belongs to {derived[:16]}")
    if signed_key != key:
        raise RecordError(f"record found under {key} was signed for {signed_key!r}: moved to another key")
    if signed_version != version:
        raise RecordError(f"record under {key} has version {version}, its writer signed version {signed_version}: "
                          "replayed")
    return SignedRecord(key, version, d["value"], writer)


def check_writer(rec: SignedRecord, *, run_id: str, owner_public_key: str, now: float) -> None:
    """RecordError unless `rec.writer` may write `rec.key` (the table in the module docstring)."""
    key, value, writer = rec.key, rec.value, rec.writer
    if key.startswith("node/"):
        if key != f"node/{writer}":
            raise RecordError(f"{key} written by {writer[:16]}: only that peer writes its own record")
        return
    if key == f"run/{run_id}/leader":
        if not isinstance(value, dict) or value.get("peer_id") != writer:
            raise RecordError(f"{key} written by {writer[:16]} names another peer: a leader names itself")
        if type(value.get("term")) is not int or value["term"] < 0:
            raise RecordError(f"{key} written by {writer[:16]} carries no term")
        if owner_public_key:
            if not value.get("certificate"):
                raise RecordError(f"{key} written by {writer[:16]} carries no data-node certificate: only an "
                                  "admitted data node leads")
            try:
                check_certificate(str(value.get("certificate", "")), owner_public_key=owner_public_key,
                                  run_id=run_id, peer_id=writer, role="data", now=now)
            except AdmissionError as e:
                raise RecordError(f"{key} written by {writer[:16]}, which is not an admitted data node: {e}") from None
        return
    if key in (f"run/{run_id}", f"run/{run_id}/revoked"):
        return  # the value carries the owner's signature; the reader checks it
    raise RecordError(f"{key}: not a record of run {run_id}")


def read_record(key: str, version: int, data: bytes, *, run_id: str, owner_public_key: str,
                now: float) -> SignedRecord:
    """`open_record` and `check_writer` in one: the record to believe, or RecordError."""
    rec = open_record(key, version, data)
    check_writer(rec, run_id=run_id, owner_public_key=owner_public_key, now=now)
    return rec


def checked_provider(peer: str, rec: SignedRecord | None, *, run_id: str, now: float | None = None) -> list[str]:
    """The addresses to dial provider `peer` at: those of its own signed node record (read and checked by
    `read_record`), which must name run `run_id`, not say it left, and not be past its `expires` (unix time, by
    `now`; a record without one does not expire); RecordError (RecordExpired) otherwise."""
    if rec is None:
        raise RecordError(f"provider {peer[:16]} of run {run_id} has no signed node record: not dialled")
    if rec.key != f"node/{peer}" or rec.writer != peer:
        raise RecordError(f"provider {peer[:16]} comes with the record of {rec.writer[:16]} under {rec.key}")
    value = rec.value
    if not isinstance(value, dict) or value.get("run_id") != run_id:
        raise RecordError(f"provider {peer[:16]}: its node record names another run than {run_id}")
    if value.get("left"):
        raise RecordLeft(f"provider {peer[:16]}: its node record says it left the run")
    expires = value.get("expires")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) \
            and expires < (time.time() if now is None else now):
        raise RecordExpired(f"provider {peer[:16]}: its node record expired (not refreshed since)")
    addrs = value.get("addrs")
    if not isinstance(addrs, list) or not addrs or not all(isinstance(a, str) for a in addrs):
        raise RecordError(f"provider {peer[:16]}: its node record has no addresses")
    return [a if "/p2p/" in a else f"{a}/p2p/{peer}" for a in addrs]


# ---- the DHT side: what the components call ---------------------------------------------------


def key_pair_of(host: Any) -> KeyPair:
    """The libp2p identity key pair of a running host (host.py): the key that signs this node's records."""
    lp = host.libp2p
    return KeyPair(lp.get_private_key(), lp.get_public_key())


async def put_signed(host: Any, key: str, value: Any) -> int:
    """Sign `value` under `key` with the host's identity and store it in the DHT; the version written."""
    version = time.time_ns()
    await host.dht_put(key, seal(key_pair_of(host), key, version, value), version=version)
    return version


async def get_signed(host: Any, key: str, *, run_id: str, owner_public_key: str,
                     on_refused: Callable[[str], None], local_only: bool = False) -> SignedRecord | None:
    """The newest record under `key` whose writer may write it; each refused one is reported to `on_refused`.

    Forged records are filtered out before the versions are compared, so a
    forged record of a higher version does not hide the genuine one."""
    seen: dict[bytes, SignedRecord | None] = {}

    def accept(version: int, data: bytes) -> bool:
        if data not in seen:
            try:
                seen[data] = read_record(key, version, data, run_id=run_id, owner_public_key=owner_public_key,
                                         now=time.time())
            except RecordError as e:
                seen[data] = None
                on_refused(str(e))
        return seen[data] is not None

    found = await (host.dht_get_record(key, accept=accept, local_only=True) if local_only
                   else host.dht_get_record(key, accept=accept))
    if found is None:
        return None
    return seen.get(found[1]) or read_record(key, found[0], found[1], run_id=run_id,
                                             owner_public_key=owner_public_key, now=time.time())


class SignedRecordValidator(VersionedValidator):
    """The DHT's validator (host.py) for a node of run `run_id`: a record this node stores for others, or reads,
    is refused unless `read_record` believes it, so an honest holder never keeps a forged record."""

    def __init__(self, run_id: str, owner_public_key: str) -> None:
        self.run_id = run_id
        self.owner_public_key = owner_public_key

    def validate(self, key: str, value: bytes) -> None:
        super().validate(key, value)
        prefix = f"/{DHT_NAMESPACE}/"
        name = key[len(prefix):] if key.startswith(prefix) else key
        version, data = unpack_record(value)
        try:
            read_record(name, version, data, run_id=self.run_id, owner_public_key=self.owner_public_key,
                        now=time.time())
        except RecordError as e:
            raise ValueError(str(e)) from None


class RunRecords:
    """The signed records of one run, as a component uses them: `put` signs and stores, `get` reads and checks.

    A refused record is logged and reported to `on_refused` (the node counts it, status.json "refused")."""

    def __init__(self, host: Any, run_id: str, owner_public_key: str, on_refused: Callable[[str], None]) -> None:
        self.host = host
        self.run_id = run_id
        self.owner_public_key = owner_public_key
        self.on_refused = on_refused
        self._warned: set[str] = set()  # reasons already logged as a WARNING

    async def put(self, key: str, value: Any) -> int:
        return await put_signed(self.host, key, value)

    async def get(self, key: str, *, local_only: bool = False) -> SignedRecord | None:
        """The newest signed record under `key`, from the network's closest peers (`local_only`: from this
        host's own copy)."""
        return await get_signed(self.host, key, run_id=self.run_id, owner_public_key=self.owner_public_key,
                                on_refused=self._refused, local_only=local_only)

    async def providers(self, key: str, wanted: Callable[[str], bool] = lambda peer: True,
                        limit: int = MAX_PROVIDERS_CHECKED) -> list[tuple[str, list[str], str, int | None]]:
        """The providers of `key` that `wanted` picks (at most `limit` a call), each with the addresses, role and
        stage of its own signed node record (`checked_provider`); a provider without one is refused and
        reported."""
        out: list[tuple[str, list[str], str, int | None]] = []
        seen: set[str] = set()
        for peer, _addrs in await self.host.find_providers(key):  # (the holder's addresses are not used)
            if peer in seen or not wanted(peer) or len(seen) >= limit:
                continue
            seen.add(peer)
            try:
                rec = await self.get(f"node/{peer}")
                addrs = checked_provider(peer, rec, run_id=self.run_id)
                stage = rec.value.get("stage")
                out.append((peer, addrs, str(rec.value.get("role", "?")),
                            stage if isinstance(stage, int) and not isinstance(stage, bool) else None))
            except (RecordExpired, RecordLeft) as e:  # (a node gone for a while or on purpose, not a forgery:
                log.debug("%s", e)  # not counted as refused)
            except RecordError as e:
                self._refused(str(e))
        return out

    def _refused(self, why: str) -> None:
        """Counted every time; logged as a WARNING the first time for each reason (the same record is met again on
        every lookup), at DEBUG after that."""
        if why not in self._warned:
            if len(self._warned) < MAX_WARNED:
                self._warned.add(why)
            log.warning("DHT record refused: %s", why)
        else:
            log.debug("DHT record refused (again): %s", why)
        self.on_refused(why)


__all__ = ["MAX_RECORD_BYTES", "RECORD_KIND", "RecordError", "RecordExpired", "RecordLeft", "SignedRecord", "check_writer", "checked_provider",
           "get_signed",
           "key_pair_of", "open_record", "put_signed", "read_record", "RunRecords", "seal", "SignedRecordValidator"]

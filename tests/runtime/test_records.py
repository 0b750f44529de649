"""Signed DHT records (runtime/trust/records.py): sealed by the writer's libp2p key, checked on read."""

from __future__ import annotations

import json

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.crypto.ed25519 import create_new_key_pair

from gwtf_node.model.certificates import issue_certificate, public_key_hex
from gwtf_node.runtime.net.identity import peer_id_of
from gwtf_node.runtime.trust.records import RecordError, get_signed, open_record, read_record, seal

RUN = "run1"
NOW = 1_800_000_000.0


@pytest.fixture
def owner() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _kp(n: int):
    return create_new_key_pair(bytes([n]) * 32)


def _read(key, version, data, owner):
    return read_record(key, version, data, run_id=RUN, owner_public_key=public_key_hex(owner), now=NOW)


def test_a_record_names_its_writer_and_survives_the_round_trip(owner) -> None:
    kp = _kp(1)
    me = peer_id_of(kp)
    data = seal(kp, f"node/{me}", 7, {"name": "r0", "stage": 0})
    rec = _read(f"node/{me}", 7, data, owner)
    assert rec.writer == me and rec.value == {"name": "r0", "stage": 0} and rec.version == 7


def test_a_record_moved_replayed_or_altered_is_refused(owner) -> None:
    kp = _kp(1)
    me = peer_id_of(kp)
    data = seal(kp, f"node/{me}", 7, {"stage": 0})
    with pytest.raises(RecordError, match="moved to another key"):
        open_record(f"node/{me}x", 7, data)
    with pytest.raises(RecordError, match="replayed"):
        open_record(f"node/{me}", 8, data)  # an old record pinned under a higher version
    d = json.loads(data)
    d["value"]["stage"] = 1
    with pytest.raises(RecordError, match="signature that does not match"):
        open_record(f"node/{me}", 7, json.dumps(d).encode())
    d = json.loads(data)
    d["writer"] = peer_id_of(_kp(2))  # claims another writer with its own key
    with pytest.raises(RecordError, match="signature that does not match|its key belongs to"):
        open_record(f"node/{me}", 7, json.dumps(d).encode())
    for junk in (b"", b"{}", b"\x00" * 10, json.dumps({"kind": "gwtf-record-v1"}).encode()):
        with pytest.raises(RecordError, match="not a signed gwtf record"):
            open_record(f"node/{me}", 7, junk)


def test_only_a_peer_writes_its_own_node_record(owner) -> None:
    victim, mallory = peer_id_of(_kp(1)), _kp(2)
    data = seal(mallory, f"node/{victim}", 1, {"addrs": ["/ip4/6.6.6.6/tcp/1"]})
    with pytest.raises(RecordError, match="only that peer writes its own record"):
        _read(f"node/{victim}", 1, data, owner)


def test_the_leader_record_is_a_data_node_naming_itself_with_its_term(owner) -> None:
    key = f"run/{RUN}/leader"
    data_kp, relay_kp = _kp(1), _kp(2)
    d_id, r_id = peer_id_of(data_kp), peer_id_of(relay_kp)
    d_cert = issue_certificate(owner, RUN, d_id, "data").to_json()
    r_cert = issue_certificate(owner, RUN, r_id, "relay").to_json()
    good = seal(data_kp, key, 3, {"peer_id": d_id, "term": 4, "certificate": d_cert})
    assert _read(key, 3, good, owner).value["term"] == 4
    cases = [
        (relay_kp, {"peer_id": r_id, "term": 99, "certificate": r_cert}, "not an admitted data node"),
        (relay_kp, {"peer_id": r_id, "term": 99, "certificate": d_cert}, "not an admitted data node"),  # stolen
        (relay_kp, {"peer_id": r_id, "term": 99}, "carries no data-node certificate"),
        (relay_kp, {"peer_id": d_id, "term": 99, "certificate": d_cert}, "names another peer"),
        (data_kp, {"peer_id": d_id, "certificate": d_cert}, "carries no term"),
    ]
    for kp, value, says in cases:
        with pytest.raises(RecordError, match=says):
            _read(key, 5, seal(kp, key, 5, value), owner)
    # a run open for testing has no owner to admit data nodes: the leader names itself, with a term
    assert read_record(key, 5, seal(relay_kp, key, 5, {"peer_id": r_id, "term": 1}), run_id=RUN,
                       owner_public_key="", now=NOW).writer == r_id


class _Dht:
    """The `dht_get_record(key, accept=...)` of host.py over a fixed list of stored values."""

    def __init__(self, values: list[tuple[int, bytes]]) -> None:
        self.values = values

    async def dht_get_record(self, key, *, accept=None):
        found = [v for v in self.values if accept is None or accept(*v)]
        return max(found, key=lambda v: v[0]) if found else None


def test_a_forged_record_of_a_higher_version_hides_no_genuine_one(owner) -> None:
    key = f"run/{RUN}/leader"
    data_kp, relay_kp = _kp(1), _kp(2)
    d_id, r_id = peer_id_of(data_kp), peer_id_of(relay_kp)
    genuine = seal(data_kp, key, 10, {"peer_id": d_id, "term": 1,
                                      "certificate": issue_certificate(owner, RUN, d_id, "data").to_json()})
    forged = seal(relay_kp, key, 10**18, {"peer_id": r_id, "term": 10**6})
    refused: list[str] = []

    async def main():
        return await get_signed(_Dht([(10, genuine), (10**18, forged)]), key, run_id=RUN,
                                owner_public_key=public_key_hex(owner), on_refused=refused.append)

    rec = trio.run(main)
    assert rec is not None and rec.writer == d_id and rec.version == 10
    assert len(refused) == 1 and "carries no data-node certificate" in refused[0]


def test_a_provider_is_believed_only_with_its_own_signed_node_record(owner) -> None:
    from gwtf_node.runtime.trust.records import RunRecords, checked_provider

    kp, other = _kp(1), _kp(2)
    me, them = peer_id_of(kp), peer_id_of(other)
    addr = "/ip4/127.0.0.1/tcp/4001"

    def node_record(writer, peer, value):
        return _read(f"node/{peer}", 1, seal(writer, f"node/{peer}", 1, value), owner)

    good = node_record(kp, me, {"run_id": RUN, "addrs": [addr], "role": "relay"})
    assert checked_provider(me, good, run_id=RUN) == [f"{addr}/p2p/{me}"]
    cases = [
        (None, "no signed node record"),
        (node_record(other, them, {"run_id": RUN, "addrs": [addr]}), "comes with the record of"),
        (node_record(kp, me, {"run_id": "another", "addrs": [addr]}), "names another run"),
        (node_record(kp, me, {"run_id": RUN, "addrs": [addr], "left": True}), "says it left"),
        (node_record(kp, me, {"run_id": RUN, "addrs": []}), "no addresses"),
    ]
    for rec, says in cases:
        with pytest.raises(RecordError, match=says):
            checked_provider(me, rec, run_id=RUN)
    # a record carries its expiry: one its writer stopped refreshing is not dialled (and is no forgery)
    from gwtf_node.runtime.trust.records import RecordExpired

    dated = node_record(kp, me, {"run_id": RUN, "addrs": [addr], "expires": 1000})
    assert checked_provider(me, dated, run_id=RUN, now=999.0) == [f"{addr}/p2p/{me}"]
    with pytest.raises(RecordExpired, match="expired"):
        checked_provider(me, dated, run_id=RUN, now=1001.0)

    # over a DHT whose holder answers with made-up providers: only the one with its own record is dialled, at
    # the addresses it signed (not the holder's)
    class Dht:
        records = {f"node/{me}": (1, seal(kp, f"node/{me}", 1, {"run_id": RUN, "addrs": [addr]})),
                   f"node/{them}": (1, seal(kp, f"node/{them}", 1, {"run_id": RUN, "addrs": [addr]}))}

        async def find_providers(self, key):
            return [(me, ["/ip4/6.6.6.6/tcp/1"]), (them, ["/ip4/6.6.6.6/tcp/2"]), (me, []),
                    (peer_id_of(_kp(3)), ["/ip4/6.6.6.6/tcp/3"])]

        async def dht_get_record(self, key, *, accept=None):
            v = self.records.get(key)
            return v if v is not None and (accept is None or accept(*v)) else None

    refused: list[str] = []
    records = RunRecords(Dht(), RUN, public_key_hex(owner), refused.append)
    found = trio.run(records.providers, f"run/{RUN}")
    assert found == [(me, [f"{addr}/p2p/{me}"], "?", None)]  # (role and stage: none in this record)
    assert len(refused) == 3 and any("only that peer writes its own record" in r for r in refused)
    assert trio.run(records.providers, f"run/{RUN}", lambda p: p != me) == []  # already known: not looked up

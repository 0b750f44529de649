"""The owner's revocation list passed on between nodes (trust/spread.py): a newer list goes to every other peer
once, a peer that says Hello gets the list held, the same bytes cost no check, a forged list is refused and
counted toward a ban, and a run without an owner key drops the message."""

from __future__ import annotations

from types import SimpleNamespace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gwtf_node.model.certificates import public_key_hex, sign_revocations
from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.trust.authorize import Authorizer
from gwtf_node.runtime.trust.spread import RevocationSpread

OWNER = Ed25519PrivateKey.generate()


class _Wire:
    def __init__(self) -> None:
        self.me = "ME"
        self.posted: list[tuple[str, m.Message]] = []
        self.refused: list[tuple[str, m.RefusalCode]] = []

    def post(self, peer: str, msg: m.Message) -> None:
        self.posted.append((peer, codec.decode(codec.encode(self.me, msg))[1]))  # as it travels

    def refuse(self, peer: str, why: str, code: m.RefusalCode = m.RefusalCode.INVALID) -> None:
        self.refused.append((peer, code))


def _node(peers=("A", "B", "C", "R"), owner=OWNER):
    a = Authorizer(run_id="run1", owner_public_key=public_key_hex(owner), open_relays=True)
    known = list(peers)
    a.on_revoked = known.remove  # (the node drops a revoked peer: node.py `_drop_peer`)
    wire = _Wire()
    spread = RevocationSpread(a, wire, SimpleNamespace(ids_known=lambda: list(known), who=lambda p: p))
    return a, wire, spread


def _list(peer_ids, issued: int, key=OWNER) -> bytes:
    return sign_revocations(key, "run1", peer_ids, issued).to_bytes()


def test_a_newer_list_from_a_peer_goes_to_every_other_peer_once() -> None:
    a, wire, spread = _node()
    raw = _list(["R"], 10)
    spread.on_revocations("A", m.Revocations(raw))
    assert a.revoked == {"R"}
    # to B and C; not back to A, not to the revoked R, not to itself
    assert sorted(p for p, _ in wire.posted) == ["B", "C"]
    assert all(msg == m.Revocations(raw) for _, msg in wire.posted)
    wire.posted.clear()
    checks = []
    take = a.take_revocations
    a.take_revocations = lambda *args, **kw: checks.append(args) or take(*args, **kw)
    spread.on_revocations("B", m.Revocations(raw))  # the same list, from a peer it was sent to: not even checked
    assert checks == []
    spread.on_peer_hello("A")  # A sent it: it has it
    spread.on_peer_hello("B")
    assert wire.posted == []
    spread.on_peer_hello("D")  # a newcomer gets the list held, once
    spread.on_peer_hello("D")
    assert wire.posted == [("D", m.Revocations(raw))]
    spread.peer_forgotten("D")  # gone; back (perhaps restarted without it): told again
    spread.on_peer_hello("D")
    assert [p for p, _ in wire.posted] == ["D", "D"]


def test_an_older_list_changes_nothing_and_goes_nowhere() -> None:
    a, wire, spread = _node()
    spread.on_revocations("A", m.Revocations(_list(["R"], 10)))
    wire.posted.clear()
    spread.on_revocations("B", m.Revocations(_list([], 9)))
    assert a.revoked == {"R"} and a.revocations_issued == 10 and wire.posted == [] and wire.refused == []


def test_a_list_adopted_from_the_dht_or_a_file_is_passed_on_too() -> None:
    a, wire, spread = _node()
    a.take_revocations(_list(["C"], 3), "the DHT")
    assert sorted(p for p, _ in wire.posted) == ["A", "B", "R"]


def test_a_forged_list_is_refused_and_goes_nowhere() -> None:
    a, wire, spread = _node()
    spread.on_revocations("A", m.Revocations(_list(["B"], 10, key=Ed25519PrivateKey.generate())))
    spread.on_revocations("A", m.Revocations(b"{not json"))
    other_run = sign_revocations(OWNER, "run2", ["B"], 11).to_bytes()
    spread.on_revocations("A", m.Revocations(other_run))
    assert a.revoked == frozenset() and wire.posted == []
    assert wire.refused == [("A", m.RefusalCode.BAD_RECORD)] * 3


def test_a_run_without_an_owner_key_drops_the_list() -> None:
    a = Authorizer(run_id="run1", owner_public_key="", open_relays=True)
    wire = _Wire()
    spread = RevocationSpread(a, wire, SimpleNamespace(ids_known=lambda: ["A", "B"], who=lambda p: p))
    spread.on_revocations("A", m.Revocations(_list(["B"], 10)))
    spread.on_peer_hello("B")
    assert a.revoked == frozenset() and wire.posted == [] and wire.refused == []

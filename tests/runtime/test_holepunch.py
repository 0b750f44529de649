"""Hole punching without a lab: the connection kinds (conninfo.py) and moving streams to a new connection.

The hole punch itself needs two NAT routers: tests/lab/test_holepunch_lab.py.
"""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from gwtf_node.runtime.net import conninfo
from gwtf_node.runtime.net.holepunch import RETIRE_WAIT_S
from gwtf_node.runtime.net.host import open_host


class _Muxed:
    def __init__(self, initiator: bool) -> None:
        self.is_initiator_value = initiator


class _Conn:
    """What conninfo reads of a py-libp2p connection: its transport addresses and which side dialled."""

    def __init__(self, addr: str, initiator: bool = True) -> None:
        self.addr, self.muxed_conn = addr, _Muxed(initiator)

    def get_transport_addresses(self):
        return [self.addr]


RELAYED = "/ip4/198.18.0.10/tcp/4001/p2p/QmRelay/p2p-circuit/p2p/QmPeer"


def test_kind_of_each_connection() -> None:
    punched = _Conn("/ip4/198.18.0.12/tcp/4001", initiator=False)
    assert conninfo.kind_of(_Conn("/ip4/198.18.0.12/tcp/4001")) == "direct"
    assert conninfo.kind_of(_Conn("/ip4/198.18.0.12/tcp/4001", initiator=False)) == "inbound"
    assert conninfo.kind_of(_Conn(RELAYED)) == "relayed"
    assert conninfo.kind_of(punched, lambda c: c is punched) == "hole-punched"
    assert conninfo.kind_of(_Conn(RELAYED), lambda c: True) == "relayed"  # a relayed one is never "punched"


def test_best_kind_prefers_a_hole_punched_connection_to_the_relayed_one() -> None:
    assert conninfo.best_kind(["relayed", "hole-punched"]) == "hole-punched"
    assert conninfo.best_kind(["inbound", "hole-punched"]) == "hole-punched"
    assert conninfo.best_kind(["hole-punched", "direct"]) == "direct"
    assert conninfo.best_kind(["relayed"]) == "relayed"
    assert conninfo.best_kind([]) is None


@pytest.mark.trio
async def test_rehome_streams_keeps_frames_in_order(tmp_path):
    """Frames sent before, during and after `rehome_streams` arrive once each, in order per kind; the peer
    closes its end of a retired stream at once (no wait for `RETIRE_WAIT_S`)."""
    got: list[bytes] = []
    done = trio.Event()
    n = 60

    async def handler(peer, envelope, payload):
        got.append(envelope)
        if len(got) == 2 * n:
            done.set()

    with socket.socket() as held, trio.fail_after(60):
        held.bind(("127.0.0.1", 0))  # a tensor address that refuses: payloads go over libp2p streams too
        async with open_host(tmp_path / "b", dht=False) as b, \
                open_host(tmp_path / "a", dht=False, bootstrap=b.addrs) as a:
            b.set_handler(handler)
            b.tensor_addr = f"127.0.0.1:{held.getsockname()[1]}"

            async def sender(kind: bytes, payload: bytes) -> None:
                for i in range(n):
                    await a.send(b.peer_id, b"%s%03d" % (kind, i), payload)
                    await trio.sleep(0.002)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender, b"c", b"")
                nursery.start_soon(sender, b"p", b"x" * 4096)
                for _ in range(3):
                    await trio.sleep(0.03)
                    t0 = trio.current_time()
                    await a.rehome_streams(b.peer_id)
                    assert trio.current_time() - t0 < RETIRE_WAIT_S - 1
            await done.wait()
            assert a.payload_path(b.peer_id) == "libp2p"
    for kind in (b"c", b"p"):
        assert [e for e in got if e.startswith(kind)] == [b"%s%03d" % (kind, i) for i in range(n)]


@pytest.mark.trio
async def test_only_the_end_with_the_smaller_peer_id_starts_a_hole_punch(tmp_path):
    """Both ends run DCUtR's loop; a punch started from both at once collides, so the larger id only answers."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from gwtf_node.runtime.net.holepunch import HolePunching

    with trio.fail_after(120):  # (a bound, not a speed: 2 s alone, over 30 s on a loaded machine)
        async with open_host(tmp_path / "a", dht=False) as a:
            punch = HolePunching(a.libp2p, lambda peer: trio.sleep(0))
            me = a.libp2p.get_id().to_bytes()
            smaller = larger = None
            while smaller is None or larger is None:
                pid = ID.from_pubkey(create_new_key_pair().public_key)
                if pid.to_bytes() < me:
                    smaller = pid
                else:
                    larger = pid
            assert await punch.service.initiate_hole_punch(smaller) is False  # left to it: nothing tried
            assert punch.service._hole_punch_attempts.get(smaller) is None
            assert await punch.service.initiate_hole_punch(larger) is False  # tried (and failed: not connected)
            assert punch.service._hole_punch_attempts.get(larger) == 1


def test_a_peer_whose_punches_were_spent_gets_another_round_later() -> None:
    """The library punches a peer 3 times until it reconnects; `HolePunching._retry_loop` clears its count
    RETRY_FIRST_S after the third failure, then at twice the interval each time (virtual clock)."""
    from types import SimpleNamespace
    from unittest.mock import Mock

    from gwtf_node.runtime.net import holepunch

    hp = holepunch.HolePunching(Mock(), on_upgraded=None)
    spent = {"p": 3, "q": 1}  # (q: punches left, not touched)
    hp.service = SimpleNamespace(_hole_punch_attempts=spent, _in_progress=set())
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(hp._retry_loop)
            await trio.sleep(holepunch.RETRY_FIRST_S - holepunch.RETRY_CHECK_S)
            assert spent == {"p": 3, "q": 1}
            await trio.sleep(3 * holepunch.RETRY_CHECK_S)
            assert spent == {"q": 1} and hp.retries == 1  # cleared: the library's loop punches p again
            spent["p"] = 3  # ... and those 3 fail too
            await trio.sleep(2 * holepunch.RETRY_FIRST_S - holepunch.RETRY_CHECK_S)
            assert spent["p"] == 3
            await trio.sleep(3 * holepunch.RETRY_CHECK_S)
            assert "p" not in spent and hp.retries == 2
            n.cancel_scope.cancel()
    trio.run(main, clock=clock)

"""The Hello a node answers a peer's first Hello with is sent again when it could not be sent (discovery.py
`_answer`): a peer that never hears it refuses every frame of this node as from an unknown peer; and a node that
refuses a peer's frames for want of its Hello asks it for one (`ask_hello`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.discovery import HELLO_RETRY_S, Discovery
from gwtf_node.runtime.net.host import PeerUnreachable
from gwtf_node.runtime.net.peers import Peers, Place
from gwtf_node.runtime.net.wire import Wire


class _Host:
    """Fails the first `fail` frames to each peer, as a connection that broke under them; keeps the others."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.failed: dict[str, int] = {}
        self.got: list[tuple[str, str]] = []  # (peer, message type) delivered
        self.relaying = None
        self.tensor_addr = ""
        self.links = SimpleNamespace(set_link=lambda *a: None)

    async def send(self, peer: str, envelope: bytes, payload=b"") -> None:
        if self.failed.get(peer, 0) < self.fail:
            self.failed[peer] = self.failed.get(peer, 0) + 1
            raise PeerUnreachable(f"control frame to {peer} failed: SwarmException('No valid connections')")
        _sender, msg = codec.decode(envelope)
        self.got.append((peer, type(msg).__name__))

    def usable_addrs(self, peer: str, addrs):
        return list(addrs)

    def addrs_for(self, peer: str) -> list[str]:
        return ["/ip4/127.0.0.1/tcp/1/p2p/ME"]

    def peer_is_local(self, peer: str) -> bool:
        return True

    def note_addrs(self, peer: str, addrs) -> int:
        return 0


async def _answer_with(fail: int) -> tuple[_Host, Discovery]:
    host = _Host(fail)
    async with trio.open_nursery() as nursery:
        peers = Peers("ME", "r0", 2, Place("relay", 0, 4))
        wire = Wire("ME", host, nursery, peers)
        discovery = Discovery(wire, peers, host, SimpleNamespace(run_id="run"), {}, on_peer_hello=lambda info: None)
        discovery.on_hello("P", m.Hello("run", "relay", 1, "r1", 4, ("/ip4/127.0.0.1/tcp/2/p2p/P",)))
    return host, discovery


@pytest.mark.trio
async def test_an_answering_hello_that_failed_is_sent_again(autojump_clock: trio.testing.MockClock) -> None:
    host, discovery = await _answer_with(fail=2)  # the Hello fails, and its first retry too
    assert host.got == [("P", "Hello"), ("P", "PeerList")]  # sent at last, and in order
    assert "P" in discovery.hellos_sent


@pytest.mark.trio
async def test_an_answering_hello_never_sent_is_forgotten(autojump_clock: trio.testing.MockClock) -> None:
    host, discovery = await _answer_with(fail=1 + len(HELLO_RETRY_S))
    assert host.got == []  # (nothing sent after the Hello that never went: the peer would refuse it)
    assert "P" not in discovery.hellos_sent  # its next Hello is answered with ours


@pytest.mark.trio
async def test_a_node_asks_a_peer_whose_hello_it_never_got_for_one_and_the_peer_answers(
        autojump_clock: trio.testing.MockClock) -> None:
    host = _Host(fail=0)
    sent: list[m.Message] = []

    async def send(peer: str, envelope: bytes, payload=b"") -> None:
        sent.append(codec.decode(envelope)[1])
    host.send = send
    async with trio.open_nursery() as nursery:
        peers = Peers("ME", "r0", 2, Place("relay", 0, 4))
        discovery = Discovery(Wire("ME", host, nursery, peers), peers, host, SimpleNamespace(run_id="run"), {},
                              on_peer_hello=lambda info: None)
        discovery.ask_hello("P")  # P's frames are refused: it never said Hello here
        discovery.ask_hello("P")  # (its next frame, at once: asked once)
        await trio.sleep(1.0)
        assert [(type(x).__name__, x.forgot_you) for x in sent] == [("Hello", True)]
        await trio.sleep(10.0)
        discovery.ask_hello("P")  # still refused 10 s later: asked again
        await trio.sleep(1.0)
        assert len(sent) == 2

    # the peer, which knows this node (its Hello came), hears that this node does not know it: it starts over and
    # says Hello back
    host = _Host(fail=0)
    backs: list[str] = []
    async with trio.open_nursery() as nursery:
        peers = Peers("P", "r1", 2, Place("relay", 1, 4))
        discovery = Discovery(Wire("P", host, nursery, peers), peers, host, SimpleNamespace(run_id="run"), {},
                              on_peer_hello=lambda info: None,
                              on_peer_back=lambda info, arrival: backs.append(arrival.name) or peers.forget(
                                  info.peer_id) or True)  # (as the node does: it forgets the peer, node.py)
        hello = m.Hello("run", "relay", 0, "r0", 4, ("/ip4/127.0.0.1/tcp/2/p2p/ME",))
        discovery.on_hello("ME", hello)
        await trio.sleep(1.0)
        assert host.got == [("ME", "Hello"), ("ME", "PeerList")] and backs == []
        discovery.on_hello("ME", dataclasses.replace(hello, forgot_you=True))
        await trio.sleep(1.0)
    assert backs == ["FORGOT_US"] and host.got[2:3] == [("ME", "Hello")]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)

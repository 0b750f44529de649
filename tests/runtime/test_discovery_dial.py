"""A peer named to this node (a PeerList, a provider record) whose greeting fails is greeted again while it stays
unknown (discovery.py `dial`), and a Hello asked for that could not be sent is sent again (`ask_hello`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
import trio.testing

from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.discovery import DIAL_RETRY_S, HELLO_RETRY_S, Discovery
from gwtf_node.runtime.net.host import PeerUnreachable
from gwtf_node.runtime.net.peers import Peers, Place
from gwtf_node.runtime.net.wire import Wire

import test_hello_answer as hello_answer

ADDR = "/ip4/127.0.0.1/tcp/2/p2p/P"


class _Host(hello_answer._Host):
    """The Hello tests' host (the first `fail` frames fail), which connects, and notes when each frame went."""

    def __init__(self, fail: int) -> None:
        super().__init__(fail)
        self.tries = 0
        self.got: list[tuple[float, str, str, bool]] = []  # (when, peer, message type, forgot_you) delivered

    async def connect(self, addr: str, *more: str) -> str:
        return addr.rsplit("/p2p/", 1)[-1]

    async def send(self, peer: str, envelope: bytes, payload=b"") -> None:
        self.tries += 1
        if self.tries <= self.fail:
            raise PeerUnreachable(f"control frame to {peer} failed: SwarmException('No valid connections')")
        msg = codec.decode(envelope)[1]
        self.got.append((trio.current_time(), peer, type(msg).__name__, getattr(msg, "forgot_you", False)))


def _discovery(host: _Host, nursery: trio.Nursery) -> Discovery:
    peers = Peers("ME", "r0", 2, Place("relay", 0, 4))
    return Discovery(Wire("ME", host, nursery, peers), peers, host, SimpleNamespace(run_id="run"), {},
                     on_peer_hello=lambda info: None)


@pytest.mark.trio
async def test_a_greeting_that_failed_is_tried_again_until_it_goes(autojump_clock: trio.testing.MockClock) -> None:
    host = _Host(fail=3)
    async with trio.open_nursery() as nursery:
        discovery = _discovery(host, nursery)
        discovery.on_peer_list("D", m.PeerList((ADDR,)))
        discovery.on_peer_list("D", m.PeerList((ADDR,)))  # (named twice: one task retries)
    assert [(t, p, k) for t, p, k, _f in host.got] == [(DIAL_RETRY_S[0] + DIAL_RETRY_S[1], "P", "Hello")]
    assert host.tries == 4


@pytest.mark.trio
async def test_no_greeting_again_once_the_peer_is_known(autojump_clock: trio.testing.MockClock) -> None:
    host = _Host(fail=1)
    async with trio.open_nursery() as nursery:
        discovery = _discovery(host, nursery)
        discovery.on_peer_list("D", m.PeerList((ADDR,)))
        await trio.sleep(DIAL_RETRY_S[0] / 2)
        discovery.on_hello("P", m.Hello("run", "relay", 1, "r1", 4, (ADDR,)))  # it greeted this node meanwhile
    assert [k for _t, _p, k, _f in host.got] == ["Hello", "PeerList"]  # the answer to its Hello, no dial


@pytest.mark.trio
async def test_a_greeting_is_given_up_after_the_last_retry(autojump_clock: trio.testing.MockClock) -> None:
    host = _Host(fail=100)
    async with trio.open_nursery() as nursery:
        _discovery(host, nursery).on_peer_list("D", m.PeerList((ADDR,)))
    assert host.tries == 1 + len(DIAL_RETRY_S) and trio.current_time() == pytest.approx(sum(DIAL_RETRY_S))


@pytest.mark.trio
async def test_a_hello_asked_for_that_failed_is_sent_again(autojump_clock: trio.testing.MockClock) -> None:
    host = _Host(fail=2)
    async with trio.open_nursery() as nursery:
        _discovery(host, nursery).ask_hello("P")
    assert [(t, k, f) for t, _p, k, f in host.got] == [(HELLO_RETRY_S[0] + HELLO_RETRY_S[1], "Hello", True)]


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)

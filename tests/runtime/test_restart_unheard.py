"""A peer that restarted with its peer id, and whose new Hello never reached this node, still answers this node's
Pings: each Pong says its incarnation (liveness.py `other_incarnation`), one from another incarnation than the
Hello's is not heard, and the node asks the new process for its Hello (discovery.py `ask_restarted`), which it
takes in as a restart.  Two daemons' components on an in-memory wire (test_readmit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place
from gwtf_node.runtime.node.liveness import Liveness

from test_readmit import _node


def test_a_pong_says_the_incarnation_and_one_from_another_process_is_told_apart() -> None:
    peers = Peers("ME", "r0", 2, Place("relay", 0, 4))
    liveness = Liveness(None, peers, on_dead=lambda peer: None, incarnation=41)
    assert liveness.pong(7) == m.Pong(7, 0.0, 0.0, 41)
    assert not liveness.other_incarnation("P", m.Pong(1, incarnation=5))  # an unknown peer
    peers.upsert(_info("P", 5), 0.0)
    assert not liveness.other_incarnation("P", m.Pong(1, incarnation=5))
    assert not liveness.other_incarnation("P", m.Pong(1))  # (a process that does not say it)
    assert liveness.other_incarnation("P", m.Pong(1, incarnation=6))


def _info(peer: str, incarnation: int) -> PeerInfo:
    return PeerInfo(peer, "relay", 1, "r1", 4, (), None, incarnation=incarnation)


async def _met(tmp_path: Path, nursery: trio.Nursery, net: dict):
    """A relay and a data node that said Hello to each other; the relay's authorizer sees no leader yet."""
    run = tmp_path / "run.json"
    save_manifest(default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=2), run)
    relay = _node(tmp_path, run, "r0", "R0", "relay", 0, net, nursery)
    data = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery)
    await data.parts.discovery.dial(relay.parts.discovery.host.addrs[0])
    await trio.testing.wait_all_tasks_blocked()
    relay.parts.leadership.leader_of_term.return_value = (None, 0)
    assert relay.peers.get("D0").incarnation == data.incarnation
    relay.peers.heard("D0", 100.0)
    return run, relay, data


@pytest.mark.trio
async def test_a_restarted_peer_that_answers_pings_is_asked_for_its_hello_and_taken_back(tmp_path: Path) -> None:
    net: dict = {}
    async with trio.open_nursery() as nursery:
        run, relay, data = await _met(tmp_path, nursery, net)
        # the data node restarts with its peer id; its Hello to the relay is lost (it never dials the relay)
        del net["D0"]
        again = _node(tmp_path, run, "d0", "D0", "data", None, net, nursery)
        again.parts.leadership.leader_of_term.return_value = (None, 0)
        assert again.incarnation != data.incarnation and "R0" not in again.peers
        ping = m.Ping(relay.parts.liveness.new_nonce())
        assert await relay.parts.liveness.exchange("D0", ping, wait_s=0.5) is None  # (its Pong is not taken)
        await trio.testing.wait_all_tasks_blocked()
        relay.parts.microbatches.peer_gone.assert_called_once_with("D0")  # the old incarnation forgotten first
        assert relay.peers.get("D0").incarnation == again.incarnation and "R0" in again.peers
        assert relay.peers.last_heard["D0"] > 100.0  # (heard: its Hello)
        assert relay.parts.wire.refused == 0 and again.parts.wire.refused == 0
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_pong_from_another_process_is_not_heard_while_its_hello_cannot_be_had(tmp_path: Path) -> None:
    net: dict = {}
    async with trio.open_nursery() as nursery:
        _run, relay, data = await _met(tmp_path, nursery, net)
        asked: list[str] = []
        relay.parts.discovery.ask_restarted = asked.append
        await relay._on_frame("D0", _encoded(m.Pong(3, incarnation=data.incarnation + 2)), b"")
        assert relay.peers.last_heard["D0"] == 100.0 and asked == ["D0"]  # not heard: asked for its Hello
        await relay._on_frame("D0", _encoded(m.Pong(4, incarnation=data.incarnation)), b"")
        assert relay.peers.last_heard["D0"] > 100.0 and asked == ["D0"]  # the process it knows: heard
        nursery.cancel_scope.cancel()


def _encoded(msg: m.Message) -> bytes:
    return codec.encode("", msg)

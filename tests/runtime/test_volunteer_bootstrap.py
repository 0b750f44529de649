"""A bootstrap address whose /p2p/ part is not the peer id of the node listening there (runtime/net/bootstrap.py).

Two real libp2p hosts in the test's process: the node dials the other's address with a third key's peer id.  The
Noise handshake fails; the node says once, at ERROR, that the node there has another peer id and what to give
instead, keeps its retries (the node the address names may come back there), and gives up with NO_BOOTSTRAP
(`join` exits 3) naming the /p2p/ part.  libp2p's own "handshake failed" line is routine (runtime/ops/logs.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from gwtf_node.runtime.net.bootstrap import Bootstrap, BootstrapState, wrong_peer_id
from gwtf_node.runtime.net.host import open_host
from gwtf_node.runtime.net.identity import load_or_create_identity, peer_id_of
from gwtf_node.runtime.ops.logs import LibraryFilter
from gwtf_node.runtime.net.peers import Peers, Place
from gwtf_node.runtime.ops.startup import ExitKind




@pytest.mark.trio
async def test_a_bootstrap_address_with_another_peer_id_is_said_once_with_the_fix(tmp_path: Path, caplog) -> None:
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    named = peer_id_of(load_or_create_identity(tmp_path / "c"))  # a key nobody listens with
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(60):
        async with open_host(tmp_path / "a", dht=False) as a, open_host(tmp_path / "b", dht=False) as b:
            addr = b.addrs[0].rsplit("/p2p/", 1)[0] + "/p2p/" + named
            exits: list = []
            discovery = SimpleNamespace(greet=a.connect, hellos_sent=set())
            boot = Bootstrap(SimpleNamespace(spawn=lambda *x: None), Peers(a.peer_id, "r", 1, Place("relay", 0, 1)),
                             discovery, SimpleNamespace(dht=None, addrs=a.addrs), [addr], timeout_s=3.5,
                             on_exit=exits.append)
            await boot.run()
    assert boot.state is BootstrapState.GAVE_UP and boot.attempts >= 2
    (exit_,) = exits
    assert exit_.kind is ExitKind.NO_BOOTSTRAP
    assert f"the node there has peer id {b.peer_id}, not the {named} of the address" in exit_.reason
    assert "check the /p2p/ part of --bootstrap" in exit_.reason
    ours = [r for r in caplog.records if r.name.startswith("gwtf") and r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in ours if "has peer id" in r.getMessage()]
    assert len(said) == 2 and said[1].startswith("no bootstrap peer answered"), said  # once, then the give-up
    assert said[0].startswith(f"bootstrap {addr}: the node at that address has peer id {b.peer_id}, not {named}")
    assert said[0].endswith(f"if it is the node you mean: {addr.replace(named, b.peer_id)}")
    assert not [r for r in ours if "unreachable" in r.getMessage()]  # no per-attempt repeat of it
    libp2p = [r for r in caplog.records if r.getMessage().startswith("failed to upgrade security")]
    assert libp2p and not any(LibraryFilter(logging.INFO).filter(r) for r in libp2p)  # routine: DEBUG only


def test_only_a_peer_id_mismatch_is_called_one() -> None:
    assert wrong_peer_id(ConnectionRefusedError(111, "refused")) is None
    inner = type("PeerIDMismatchesPubkey", (Exception,), {})(
        "peer id does not correspond to the received pubkey: remote_peer=12D3KooWAAA, "
        "remote_peer_id_from_pubkey=12D3KooWBBB")
    outer = RuntimeError("handshake failed when upgrading to secure connection")
    outer.__cause__ = inner
    assert wrong_peer_id(outer) == ("12D3KooWAAA", "12D3KooWBBB")

"""Who a node dials is the daemon's choice: py-libp2p's connection manager dials and prunes nothing (hostlisten.py)."""

from __future__ import annotations

import pytest
import trio
from libp2p import new_host
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from gwtf_node.runtime.net.host import open_host
from gwtf_node.runtime.net.hostlisten import MAX_CONNECTIONS, connection_config


async def _knows_only(lp, other) -> ID:
    """Put `other`'s address into `lp`'s peerstore without connecting (what a PeerList or a DHT walk leaves)."""
    info = info_from_p2p_addr(Multiaddr(other.addrs[0]))
    lp.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
    return info.peer_id


@pytest.mark.trio
async def test_py_libp2p_alone_dials_a_peer_it_only_knows_of(tmp_path):
    """What `own_connections` turns off: a plain py-libp2p host's AutoConnector dials a peer of its peerstore."""
    with trio.fail_after(30):
        async with open_host(tmp_path / "b", dht=False) as b:
            lp = new_host()
            async with lp.run(listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                pid = await _knows_only(lp, b)
                await lp.get_network().auto_connector.maybe_connect()
                with trio.move_on_after(10):
                    while not lp.get_network().get_connections(pid):
                        await trio.sleep(0.05)
                assert lp.get_network().get_connections(pid), "py-libp2p no longer dials on its own: see hostlisten.py"


@pytest.mark.trio
async def test_a_node_dials_no_peer_of_its_own_and_prunes_none(tmp_path):
    with trio.fail_after(30):
        async with open_host(tmp_path / "b", dht=False) as b, open_host(tmp_path / "a", dht=False) as a:
            pid = await _knows_only(a.libp2p, b)
            await a.libp2p.get_network().auto_connector.maybe_connect()
            await trio.sleep(1.0)
            assert not a.libp2p.get_network().get_connections(pid)
            cfg = a.libp2p.get_network().connection_config
            assert (cfg.low_watermark, cfg.min_connections, cfg.high_watermark) == (0, 0, MAX_CONNECTIONS)
            assert connection_config().max_connections == MAX_CONNECTIONS

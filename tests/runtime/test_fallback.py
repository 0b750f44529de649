"""Payload frames to a peer whose tensor channel cannot be dialled go over the libp2p connection (host.py).

On loopback, with a tensor address that refuses connections; behind a real
NAT router in tests/lab/test_reach_lab.py.
"""

from __future__ import annotations

import socket

import pytest
import trio

from gwtf_node.runtime.net.host import open_host


@pytest.mark.trio
async def test_payloads_fall_back_to_libp2p_when_the_tensor_channel_cannot_be_dialled(tmp_path):
    """On loopback: a peer whose tensor address refuses connections still gets its payloads, in order."""
    got: list[tuple[bytes, bytes]] = []
    done = trio.Event()

    async def handler(peer, envelope, payload):
        got.append((envelope, bytes(payload)))
        if len(got) == 4:
            done.set()

    # a port bound but not listening, held for the whole test (closed, another listener of this test or of a
    # parallel one could be given it): the dial is refused at once
    with socket.socket() as held, trio.fail_after(30):
        held.bind(("127.0.0.1", 0))
        dead_port = held.getsockname()[1]
        async with open_host(tmp_path / "b", dht=False) as b, \
                open_host(tmp_path / "a", dht=False, bootstrap=b.addrs) as a:
            b.set_handler(handler)
            b.tensor_addr = f"127.0.0.1:{dead_port}"
            for i in range(3):
                await a.send(b.peer_id, b"p%d" % i, bytes([i]) * (3 << 20))
            await a.send(b.peer_id, b"ctrl")
            await done.wait()
            assert a.payload_path(b.peer_id) == "libp2p"
            assert (a.connection_kind(b.peer_id), b.connection_kind(a.peer_id)) == ("direct", "inbound")
    # intact and in order (FIFO per kind; the control frame may overtake them)
    assert [x for x in got if x[0] != b"ctrl"] == [(b"p%d" % i, bytes([i]) * (3 << 20)) for i in range(3)]


@pytest.mark.trio
async def test_ipv6_and_ipv4_listen_addresses_carry_frames(tmp_path):
    """A host listening on IPv6 and IPv4 loopback (`--listen` twice) is dialled over IPv6, tensor channel included."""
    got: list[bytes] = []
    done = trio.Event()

    async def handler(peer, envelope, payload):
        got.append(bytes(payload))
        done.set()

    with trio.fail_after(30):
        async with open_host(tmp_path / "b", listen=["[::1]:0", "127.0.0.1:0"], dht=False) as b:
            assert sorted(a.split("/")[1] for a in b.addrs) == ["ip4", "ip6"]
            six = [x for x in b.addrs if x.startswith("/ip6/::1/")]
            async with open_host(tmp_path / "a", listen=["[::1]:0"], dht=False, bootstrap=six) as a:
                b.set_handler(handler)
                await a.send(b.peer_id, b"t", b"x" * 100_000)
                await done.wait()
                assert a.payload_path(b.peer_id) == "channel", a.payload_path(b.peer_id)
                assert b.remote_host(a.peer_id) == "::1", b.remote_host(a.peer_id)
    assert got == [b"x" * 100_000]

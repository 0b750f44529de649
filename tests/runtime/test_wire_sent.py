"""`Wire.sent`: the frames and bytes a node sent, per lane and message type (status.json "sent")."""

from __future__ import annotations

import pytest
import trio

from gwtf_node.protocol import codec
from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net.host import PeerUnreachable
from gwtf_node.runtime.net.peers import Peers, Place
from gwtf_node.runtime.net.wire import Wire


class _Host:
    """Takes frames; a send to "DOWN" fails as the real host's does."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, bytes, bytes]] = []

    async def send(self, peer: str, envelope: bytes, payload=b"") -> None:
        if peer == "DOWN":
            raise PeerUnreachable("control frame to DOWN failed")
        self.frames.append((peer, envelope, bytes(payload)))


@pytest.mark.trio
async def test_sent_counts_frames_and_bytes_per_lane_and_type() -> None:
    host = _Host()
    async with trio.open_nursery() as nursery:
        peers = Peers("ME", "me", 2, Place("data", -1, 4))
        wire = Wire("ME", host, nursery, peers)
        assert await wire.send("P", m.Ping(1)) and await wire.send("Q", m.Ping(2))
        assert await wire.send("P", m.LinkProbe(3), b"\x00" * 1000)
        assert not await wire.send("DOWN", m.Ping(4))  # failed: not counted
        peers.forget("GONE")
        assert not await wire.send("GONE", m.Ping(5))  # not sent to a peer that is gone: not counted
    ping = len(codec.encode("", m.Ping(1)))  # (the sender is left out: the connection authenticates it)
    assert ping <= 16 and codec.decode(host.frames[0][1]) == ("", m.Ping(1))
    host.dht_ops = {"get": 2}  # (hostdht.py counts the DHT operations it started)
    assert wire.sent_totals() == {"ctrl": {"Ping": [2, len(host.frames[0][1]) + len(host.frames[1][1])]},
                                  "payload": {"LinkProbe": [1, len(host.frames[2][1]) + 1000]}, "dht": {"get": 2}}
    assert wire.sent["ctrl"]["Ping"][1] == 2 * ping
    totals = wire.sent_totals()
    totals["ctrl"]["Ping"][0] = 99  # a copy: the status file's readers cannot change the counters
    assert wire.sent["ctrl"]["Ping"][0] == 2


def test_the_host_counts_the_dht_operations_it_starts() -> None:
    from gwtf_node.runtime.net.hostdht import HostDht

    host = HostDht()
    host.dht = None  # (a host opened without a DHT: the operation fails, and was started)
    for op in (host.dht_get, host.find_providers, host.find_providers):
        with pytest.raises(RuntimeError):
            trio.run(op, "k")
    assert host.dht_ops == {"get": 1, "find_providers": 2}

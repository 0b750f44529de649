"""The tensor channel's reads wake the event loop once per large piece, not once per TCP segment.

A token-bucket link (a home router, `tc tbf`) hands the receiver one segment at a time; `RawConn.recv_into_exactly`
of a large record sets SO_RCVLOWAT to the bytes still missing, so the kernel signals readiness once they are in.
Here a sender trickles a 1-MiB record over loopback in 8-kB writes 1 ms apart, and the receiver counts its
`recv_into` calls.  Every wait is bounded by a deadline.
"""

from __future__ import annotations

import socket
import sys

import pytest
import trio

from gwtf_node.runtime.net import channel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_RCVLOWAT wake-ups are Linux's")

RECORD = 1 << 20
PIECE = 8 * 1024


class CountingSocket:
    """A trio socket whose `recv_into` calls are counted."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self.recvs = 0
        self.type = sock.type

    async def recv_into(self, *args):
        self.recvs += 1
        return await self._sock.recv_into(*args)

    def setsockopt(self, *args):
        return self._sock.setsockopt(*args)

    def getsockopt(self, *args):
        return self._sock.getsockopt(*args)


async def _trickled(lowat: bool) -> tuple[int, bytes, bytes, int]:
    """(recv calls, bytes sent, bytes read, SO_RCVLOWAT after) for one record trickled over TCP, and 4 bytes read
    from the socket itself after it."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    payload = bytes(range(256)) * (RECORD // 256)
    got = bytearray(RECORD)
    with trio.fail_after(30):
        sender = trio.socket.socket()
        await sender.connect(("127.0.0.1", port))
        accepted, _ = await listener.accept()
        counting = CountingSocket(accepted)
        conn = channel.RawConn(counting)
        conn._lowat_ok = conn._lowat_ok and lowat

        async def trickle() -> None:
            for off in range(0, RECORD, PIECE):
                await sender.send(payload[off:off + PIECE])
                await trio.sleep(0.001)
            await trio.sleep(0.2)  # the next frame comes later: the reader waits for it
            await sender.send(b"tail")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            await conn.recv_into_exactly(memoryview(got), "a record")
            recvs = counting.recvs
            tail = bytearray(4)
            with trio.fail_after(5):  # the socket read as the wait for the next frame reads it: a byte wakes it
                k = await accepted.recv_into(tail, 4)
            assert k == 4 and tail == b"tail"
        after = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
    for s in (sender, accepted, listener):
        s.close()
    return recvs, payload, bytes(got), after


@pytest.mark.trio
async def test_a_large_record_wakes_the_reader_a_few_times_not_once_per_segment():
    plain, sent, got, _ = await _trickled(lowat=False)
    assert got == sent
    assert plain >= 64  # one wake-up per piece or so: 128 pieces

    recvs, sent, got, after = await _trickled(lowat=True)
    assert got == sent  # the bytes are those sent, none lost or reordered by the waiting
    assert recvs <= 16, f"{recvs} recv calls for a 1-MiB record (without SO_RCVLOWAT: {plain})"
    assert after == 1  # the default is back: a later small read is not held for bytes that will not come

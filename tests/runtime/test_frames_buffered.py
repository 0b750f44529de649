"""frames.py `Buffered`: frames read from chunks of a stream, exactly as from the stream itself."""

from __future__ import annotations

import pytest

from gwtf_node.runtime.net import frames
from gwtf_node.runtime.net.frames import Buffered, FrameError, encode_header, read_frame


class _Stream:
    """A stream that returns at most `cap` bytes per read and counts the reads."""

    def __init__(self, data: bytes, cap: int) -> None:
        self.data, self.cap, self.reads = data, cap, 0

    async def read(self, n: int) -> bytes:
        self.reads += 1
        out, self.data = self.data[:min(n, self.cap)], self.data[min(n, self.cap):]
        return out


def _frame(envelope: bytes, payload: bytes = b"") -> bytes:
    return bytes(encode_header(len(envelope), len(payload))) + envelope + payload


@pytest.mark.trio
@pytest.mark.parametrize("cap", [1, 7, 100, 1 << 20])
async def test_frames_come_out_whole_and_in_order(cap):
    sent = [(b"e%d" % i, b"p" * (i * 37)) for i in range(30)]
    stream = _Stream(b"".join(_frame(e, p) for e, p in sent), cap)
    reader = Buffered(stream.read)
    got = []
    while (frame := await read_frame(reader)) is not None:
        got.append((frame[0], bytes(frame[1])))
    assert got == sent
    if cap >= 1 << 20:
        assert stream.reads == 2  # every frame out of one read of the stream (and the end of the stream)


@pytest.mark.trio
async def test_a_large_payload_is_read_in_reads_of_its_own_size(monkeypatch):
    monkeypatch.setattr(frames, "READ_CHUNK_BYTES", 16)
    stream = _Stream(_frame(b"big", b"x" * 5000), 1 << 20)
    envelope, payload = await read_frame(Buffered(stream.read))
    assert envelope == b"big" and payload == b"x" * 5000 and stream.reads <= 3


@pytest.mark.trio
async def test_a_truncated_frame_is_still_refused():
    stream = _Stream(_frame(b"env", b"abcdef")[:-2], 1 << 20)
    with pytest.raises(FrameError, match="truncated"):
        await read_frame(Buffered(stream.read))

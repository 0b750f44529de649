"""Length-prefixed frames: one envelope plus the raw tensor bytes that follow it.

Wire layout of one frame (all integers big-endian)::

    +----------------+----------------+-------------------+------------------+
    | envelope len   | payload len    | envelope          | payload          |
    | 4 bytes (u32)  | 8 bytes (u64)  | (protobuf bytes)  | (raw tensor)     |
    +----------------+----------------+-------------------+------------------+

The envelope is one `gwtf.v1.Envelope` (see `protocol/codec.py`); the payload
is empty for control messages and holds the `TensorHeader.nbytes` raw bytes
of a tensor otherwise.  Keeping the payload outside protobuf avoids parsing
and copying tens of megabytes through protobuf.

Frames come from peers we do not trust, so the two lengths are checked
*before* anything is read or allocated: the envelope against
`codec.MAX_FRAME_BYTES` (1 MiB) and the payload against a per-host limit
(`DEFAULT_MAX_PAYLOAD_BYTES`, 512 MiB).  A violation is a `FrameError`; the
caller logs it and resets the stream.

py-libp2p (0.8.1) reports a peer killed in the middle of a frame as a clean
end of stream, so only the length prefix tells a
truncated frame from a complete one: end of stream exactly at a frame
boundary is a clean close (`read_frame` returns None), anywhere else it is a
`FrameError`.  Waiting for the *first* byte of a frame is not bounded (an
idle peer is fine; liveness is the protocol's business), but once a frame
has started the rest must arrive within `frame_deadline_s(frame_timeout,
payload bytes)`: `frame_timeout` seconds plus the payload at
`MIN_PAYLOAD_BYTES_PER_S` (1 Mbit/s), or the frame is refused: a hung sender
cannot pin a reader forever, and a stage's state or all-reduce part of
hundreds of MB still crosses a home uplink (at 20 Mbit/s, 340 MB take 136 s).

`Buffered` reads a stream in chunks of up to `READ_CHUNK_BYTES` and hands
out what a frame asks for from them: a control frame (header, envelope) is
one read of the stream, not two or three, and over yamux each read of a
stream sends the peer a window update (hostlisten.py).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable

import trio

from ...protocol.codec import MAX_FRAME_BYTES

HEADER = struct.Struct(">IQ")  # envelope length, payload length
HEADER_BYTES = HEADER.size  # 12
DEFAULT_MAX_PAYLOAD_BYTES = 512 << 20  # largest tensor a peer may send us in one frame
DEFAULT_FRAME_TIMEOUT_S = 60.0  # a started frame must be complete within this, plus its payload's time at ...
MIN_PAYLOAD_BYTES_PER_S = 125_000  # ... 1 Mbit/s (`frame_deadline_s`): the slowest link a frame is waited for


def frame_deadline_s(timeout_s: float, payload_bytes: int) -> float:
    """How long one frame of `payload_bytes` may take to send or to arrive: `timeout_s`, plus its payload at
    MIN_PAYLOAD_BYTES_PER_S (module doc)."""
    return timeout_s + payload_bytes / MIN_PAYLOAD_BYTES_PER_S


class FrameError(Exception):
    """A peer sent bytes that are not a valid frame (the text says what and how big)."""


# Reads up to n bytes; b"" means end of stream.
ReadSome = Callable[[int], Awaitable[bytes]]


READ_CHUNK_BYTES = 64 << 10  # `Buffered` reads the stream in chunks of up to this


class Buffered:
    """A `ReadSome` over `read_some` that reads up to `READ_CHUNK_BYTES` at a time and keeps the rest."""

    def __init__(self, read_some: ReadSome) -> None:
        self._read_some = read_some
        self._buf = b""
        self._at = 0

    async def __call__(self, n: int) -> bytes:
        if self._at >= len(self._buf):
            self._buf, self._at = await self._read_some(max(n, READ_CHUNK_BYTES)), 0
            if not self._buf:
                return b""
        chunk = self._buf[self._at:self._at + n]
        self._at += len(chunk)
        return chunk


def check_lengths(envelope_len: int, payload_len: int, max_payload: int) -> None:
    if envelope_len == 0:
        raise FrameError("frame has an empty envelope")
    if envelope_len > MAX_FRAME_BYTES:
        raise FrameError(f"envelope length {envelope_len} exceeds the {MAX_FRAME_BYTES}-byte limit")
    if payload_len > max_payload:
        raise FrameError(f"payload length {payload_len} exceeds this node's {max_payload}-byte limit")


def encode_header(envelope_len: int, payload_len: int, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """The 12-byte prefix of a frame; raises ValueError for a frame our peers would refuse."""
    try:
        check_lengths(envelope_len, payload_len, max_payload)
    except FrameError as e:
        raise ValueError(f"cannot send this frame: {e}") from None
    return HEADER.pack(envelope_len, payload_len)


def encode_frame(envelope: bytes, payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """The pieces of one frame, in order (header, envelope, payload); nothing is copied."""
    parts: list[bytes | memoryview] = [encode_header(len(envelope), len(payload)), envelope]
    if len(payload):
        parts.append(payload)
    return parts


def parse_header(header: bytes, max_payload: int) -> tuple[int, int]:
    envelope_len, payload_len = HEADER.unpack(header)
    check_lengths(envelope_len, payload_len, max_payload)
    return envelope_len, payload_len


async def read_exactly(read_some: ReadSome, n: int, what: str, moved: Callable[[], None] | None = None) -> bytearray:
    """Exactly n bytes; a short read (end of stream) is a FrameError naming `what`; `moved()` after each read."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = await read_some(n - got)
        if not chunk:
            raise FrameError(f"stream ended after {got} of {n} bytes of {what}: truncated frame")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
        if moved is not None:
            moved()
    return buf


async def read_frame(
    read_some: ReadSome,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT_S,
    moved: Callable[[], None] | None = None,
) -> tuple[bytes, bytearray] | None:
    """The next (envelope, payload) from a stream, or None at a clean end of stream; `moved()` as payload bytes come.

    Raises FrameError for a bad length, a truncated frame, or a frame whose
    bytes do not all arrive within `frame_deadline_s(frame_timeout, payload
    bytes)` of its first byte.
    """
    first = await read_some(HEADER_BYTES)
    if not first:
        return None
    limit = frame_timeout
    try:
        with trio.fail_after(frame_timeout) as scope:
            if len(first) < HEADER_BYTES:
                first = bytes(first) + bytes(await read_exactly(read_some, HEADER_BYTES - len(first), "the header"))
            envelope_len, payload_len = parse_header(first, max_payload)
            limit = frame_deadline_s(frame_timeout, payload_len)
            scope.deadline += limit - frame_timeout
            envelope = bytes(await read_exactly(read_some, envelope_len, "the envelope"))
            payload = await read_exactly(read_some, payload_len, "the payload", moved) if payload_len else bytearray()
    except trio.TooSlowError:
        raise FrameError(f"frame not complete within {limit:.0f} s of its first byte") from None
    return envelope, payload

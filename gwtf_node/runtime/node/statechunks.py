"""A stage's state crosses in chunks, and a download broken off resumes where it stopped.

A part's state (weights and optimizer state, `StageModel.state_bytes()`) is
12 bytes a parameter with AdamW: 3 GB for a stage of a 1B model, 40 minutes
on a 10 Mbit/s home uplink.  Sent as one frame, a connection that breaks at
2.9 GB starts it over.  So the source sends it as `StageState` chunks of
`STATE_CHUNK_BYTES` (`offset`, `total`, the SHA-256 of the whole state in
each), one after the other, and the newcomer copies each into the state's
buffer (`Download`); when it asks again (no payload byte for a frame
timeout, joining.py), it names the state it holds part of and how much
(`StageStateRequest.offset`, `sha256`), and a source that sends that state
sends only the rest.

The source (`StateServer`) keeps the state it sends (`Served`) while it
sends it, and `SERVED_KEEP_S` after a send that broke off, so that the
newcomer's resumption gets the same bytes; a state whose steps are still
the stage's is sent again from the same bytes to the next newcomer.  Another
member asked in its place (the source is gone) resumes too when its state
is the same bytes: members at the same steps hold identical parameters and
optimizer state (the all-reduce sums identically on every member), and
`torch.save` writes them identically.  Any other answer starts at offset 0
with its own hash, and the newcomer starts over.  One stream per newcomer:
a new request cancels the stream still going to it.

Chunks that do not continue the state being assembled (a stream cancelled
for a newer request, whose last chunk was already on its way) are dropped
quietly.  The whole is checked against its SHA-256 once the last chunk is
in (`handover.received_state`, in the stage's worker thread); a state that
fits in one chunk is checked in the payload itself, with no buffer.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import trio

from ...protocol import messages as m
from .handover import received_state

log = logging.getLogger("gwtf.node")

STATE_CHUNK_BYTES = 64 << 20  # a state's bytes per StageState frame (5 s at 100 Mbit/s)
SERVED_KEEP_S = 180.0  # a source keeps a state whose send broke off this long, for the newcomer to resume


@dataclass
class Served:
    """A state a source sends: its steps, bytes and SHA-256, the round records that go with it."""
    steps: int
    blob: bytes
    digest: str
    rounds: tuple = ()
    streams: int = 0  # sends of it under way
    last_sent: float = field(default_factory=trio.current_time)


class StateServer:
    """The source's side: a newcomer's `StageStateRequest` answered with its state in chunks (module doc)."""

    def __init__(self, stage: Any, wire: Any, round_records: Callable[[int], tuple]) -> None:
        self.stage, self.wire, self.round_records = stage, wire, round_records
        self.served: Served | None = None
        self._streams: dict[str, trio.CancelScope] = {}  # newcomer -> the send under way to it
        self.chunk_bytes = STATE_CHUNK_BYTES
        self.keep_s = SERVED_KEEP_S

    async def answer(self, peer: str, msg: m.StageStateRequest, stage: int, who: str, wait_s: float) -> None:
        """Send `peer` the state once the stage holds `msg.after` steps (at most `wait_s` from now), from
        `msg.offset` if it resumes the state this node sends, else whole; a newer request from `peer` cancels
        this one (also while it waits for the steps)."""
        old = self._streams.pop(peer, None)
        if old is not None:
            old.cancel()
        with trio.CancelScope() as scope:
            self._streams[peer] = scope
            try:
                await self.stage.wait_steps(msg.after, wait_s)
                await self._stream(peer, msg, stage, await self._state(), who)
            finally:
                if self._streams.get(peer) is scope:
                    del self._streams[peer]

    async def _stream(self, peer: str, msg: m.StageStateRequest, stage: int, served: Served, who: str) -> None:
        served.streams += 1
        complete = False
        try:
            complete = await self._send(peer, msg, stage, served, who)
        finally:
            served.streams -= 1
            served.last_sent = trio.current_time()
            if served.streams == 0 and self.served is served:
                if complete:
                    self.served = None  # (the newcomer holds it all: nothing to resume)
                else:
                    self.wire.spawn(self._forget_later, served)

    async def _send(self, peer: str, msg: m.StageStateRequest, stage: int, served: Served, who: str) -> bool:
        total = len(served.blob)
        offset = msg.offset if msg.sha256 == served.digest and 0 < msg.offset < total else 0
        log.info("sending stage %d state (%d steps, %.1f MB%s) to %s", stage, served.steps, total / 1e6,
                 f", from {offset / 1e6:.1f} MB on" if offset else "", who)
        view = memoryview(served.blob)
        while offset < total:
            n = min(self.chunk_bytes, total - offset)
            header = m.TensorHeader(dtype="uint8", shape=(n,), nbytes=n)
            chunk = m.StageState(stage, served.steps, served.digest, header, rounds=served.rounds, offset=offset,
                                 total=total)
            if not await self.wire.send(peer, chunk, view[offset:offset + n]):
                return False
            served.last_sent = trio.current_time()
            offset += n
        return True

    async def _state(self) -> Served:
        """The state to send: the one kept if the stage has not stepped since, else a fresh one."""
        s = self.served
        if s is not None and s.steps == self.stage.applied_steps:
            return s
        steps, blob = await self.stage.run(self.stage.snapshot)
        digest = await self.stage.run(_sha256, blob)
        if self.served is not None and self.served.steps == steps:  # (taken meanwhile by another request)
            return self.served
        self.served = Served(steps, blob, digest, tuple(self.round_records(steps)))
        return self.served

    async def _forget_later(self, served: Served) -> None:
        while self.served is served:
            wait = served.last_sent + self.keep_s - trio.current_time()
            if served.streams == 0 and wait <= 0:
                self.served = None
                return
            await trio.sleep(max(wait, 1.0))


def _sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _copy_into(buf: bytearray, offset: int, chunk) -> None:
    buf[offset:offset + chunk.numel()] = memoryview(chunk.numpy())


class Download:
    """The newcomer's side: the chunks of one state assembled in order (module doc).  `limit()`: the most bytes a
    state of this run may have (model/memory.py `largest_state_bytes`), asked once: the buffer a first chunk makes
    is that chunk's `total`, not its payload."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit, self.limit = limit, 0
        self.source: str | None = None
        self.digest = ""
        self.steps = 0
        self.total = 0
        self.held = 0
        self._buf: bytearray | None = None

    def resume(self) -> tuple[int, str]:
        """(offset, sha256) for a `StageStateRequest`: what is held of a state under way, else (0, "")."""
        if self._buf is not None and 0 < self.held < self.total:
            return self.held, self.digest
        return 0, ""

    def progress(self) -> dict | None:
        """status: the state under way (its source, steps and bytes held of its total), or None."""
        if self._buf is None:
            return None
        return {"source": self.source, "steps": self.steps, "bytes": self.held, "total": self.total}

    async def take(self, run, peer: str, msg: m.StageState, payload) -> memoryview | None:
        """The whole state once `msg` completes it (checked against its SHA-256), else None; a ValueError says
        what is wrong with a chunk.  `run`: the stage's worker thread (`LocalStage.run`)."""
        self.limit = self.limit or self._limit()
        n, max_bytes = msg.tensor.nbytes, self.limit
        total = msg.total or n
        if total > max_bytes:
            raise ValueError(f"StageState of {total} bytes, over the {max_bytes} bytes of this run's largest state")
        if msg.offset + n > total:
            raise ValueError(f"StageState chunk of {n} bytes at {msg.offset} ends past the state's {total} bytes")
        if msg.offset == 0 and n == total:  # the whole state in one frame: checked where it lies
            self._buf = None
            return await run(received_state, msg, payload, max_bytes)
        if msg.offset == 0:
            self.source, self.digest, self.steps, self.total, self.held = peer, msg.sha256, msg.iteration, total, 0
            self._buf = None
            self._buf = bytearray(total)
        elif self._buf is None or (msg.sha256, msg.offset, total) != (self.digest, self.held, self.total):
            log.debug("StageState chunk at %d of %s dropped: not the next of the state under way", msg.offset,
                      msg.sha256[:12])
            return None
        from ...model.tensors import TensorError, unpack

        try:
            chunk = unpack(msg.tensor, payload, expect_dtype="uint8", max_bytes=max_bytes)
        except TensorError as e:
            raise ValueError(f"StageState tensor refused: {e}") from None
        await run(_copy_into, self._buf, msg.offset, chunk)
        self.held += n
        if self.held < self.total:
            return None
        blob, self._buf = self._buf, None
        return await run(received_state, replace(msg, tensor=m.TensorHeader("uint8", (total,), total)), blob,
                         max_bytes)

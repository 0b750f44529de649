"""A stage's state crosses in chunks, and a download broken off resumes where it stopped (statechunks.py)."""

from __future__ import annotations

import hashlib
import os

import pytest
import trio

from gwtf_node.protocol import messages as m
from gwtf_node.runtime.net import channel
from gwtf_node.runtime.node.statechunks import Download

DEADLINE_S = 120.0


async def _inline(fn, *args):
    return fn(*args)


def _frames(blob: bytes, chunk: int, digest: str | None = None, steps: int = 3):
    digest = digest or hashlib.sha256(blob).hexdigest()
    for off in range(0, len(blob), chunk):
        n = min(chunk, len(blob) - off)
        yield (m.StageState(0, steps, digest, m.TensorHeader("uint8", (n,), n), offset=off, total=len(blob)),
               bytearray(blob[off:off + n]))


@pytest.mark.trio
async def test_chunks_assemble_the_state_and_a_stray_chunk_changes_nothing():
    blob = os.urandom(1 << 20)
    frames = list(_frames(blob, 300_000))
    d = Download(lambda: 1 << 30)
    assert d.resume() == (0, "") and d.progress() is None
    assert await d.take(_inline, "src", *frames[0]) is None
    assert d.resume() == (300_000, frames[0][0].sha256)
    assert d.progress() == {"source": "src", "steps": 3, "bytes": 300_000, "total": 1 << 20}
    # a chunk that does not continue the state (a cancelled stream's last one, or one of another state): dropped
    assert await d.take(_inline, "src", *frames[2]) is None
    stray = list(_frames(os.urandom(1 << 20), 300_000))[1]
    assert await d.take(_inline, "src", *stray) is None
    assert d.held == 300_000
    for msg, payload in frames[1:-1]:
        assert await d.take(_inline, "src", msg, payload) is None
    got = await d.take(_inline, "src", *frames[-1])
    assert bytes(got) == blob and d.progress() is None and d.resume() == (0, "")


@pytest.mark.trio
async def test_a_bad_state_in_chunks_is_refused_and_a_new_one_starts_over():
    blob = os.urandom(1 << 20)
    bad = list(_frames(blob, 400_000, digest="0" * 64))
    d = Download(lambda: 1 << 30)
    for msg, payload in bad[:-1]:
        await d.take(_inline, "src", msg, payload)
    with pytest.raises(ValueError, match="hash mismatch"):
        await d.take(_inline, "src", *bad[-1])
    good = list(_frames(blob, 400_000))
    await d.take(_inline, "src", *bad[0])
    for msg, payload in good:  # (offset 0 of another state: it starts over)
        got = await d.take(_inline, "src", msg, payload)
    assert bytes(got) == blob
    with pytest.raises(ValueError, match="over the 1000000 bytes of this run's largest state"):
        await Download(lambda: 1_000_000).take(_inline, "src", *good[0])
    msg, payload = good[0]
    assert await d.take(_inline, "src", msg, payload) is None
    with pytest.raises(ValueError, match="ends past"):  # (checked before anything is allocated for it)
        await d.take(_inline, "src", m.StageState(0, 3, msg.sha256, m.TensorHeader("uint8", (900_000,), 900_000),
                                                  offset=400_000, total=1 << 20), bytearray(900_000))


class _Stage:
    """A stage as StateServer sees it: its steps and snapshot (a state of random bytes), its worker thread."""

    def __init__(self, size: int) -> None:
        self.applied_steps, self.size, self.snapshots = 2, size, 0
        self.steps_changed = trio.Event()

    async def wait_steps(self, at_least: int, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            while self.applied_steps < at_least:
                await self.steps_changed.wait()

    def snapshot(self):
        self.snapshots += 1
        return self.applied_steps, os.urandom(self.size)

    async def run(self, fn, *args):
        return fn(*args)


class _Wire:
    def __init__(self) -> None:
        self.sent: list = []
        self.hold: trio.Event | None = None  # set: every send waits for it
        self.ok = True

    async def send(self, peer, msg, payload=b""):
        if self.hold is not None:
            await self.hold.wait()
        self.sent.append((peer, msg, bytes(payload)))
        return self.ok

    def spawn(self, fn, *args):
        self.nursery.start_soon(fn, *args)


@pytest.mark.trio
async def test_a_source_sends_the_rest_of_the_state_a_newcomer_resumes(autojump_clock):
    from gwtf_node.runtime.node.statechunks import StateServer

    stage, wire = _Stage(1_000_000), _Wire()
    async with trio.open_nursery() as nursery:
        wire.nursery = nursery
        server = StateServer(stage, wire, lambda steps: ())
        server.chunk_bytes = 300_000
        await server.answer("a", m.StageStateRequest(0), 0, "a", 1.0)
        offsets = [(msg.offset, msg.total, msg.tensor.nbytes) for _p, msg, _b in wire.sent]
        assert offsets == [(0, 10**6, 300_000), (300_000, 10**6, 300_000), (600_000, 10**6, 300_000),
                           (900_000, 10**6, 100_000)]
        blob = b"".join(b for _p, _m, b in wire.sent)
        digest = hashlib.sha256(blob).hexdigest()
        assert all(msg.sha256 == digest and msg.iteration == 2 for _p, msg, _b in wire.sent)
        assert server.served is None  # (sent whole: nothing kept)
        # a send that breaks off keeps the state for the newcomer's resumption, `keep_s`
        wire.sent.clear()
        wire.ok = False
        await server.answer("a", m.StageStateRequest(0), 0, "a", 1.0)
        digest = wire.sent[0][1].sha256
        assert server.served is not None and len(wire.sent) == 1
        wire.ok = True
        wire.sent.clear()
        await server.answer("a", m.StageStateRequest(0, offset=600_000, sha256=digest), 0, "a", 1.0)
        assert [msg.offset for _p, msg, _b in wire.sent] == [600_000, 900_000] and stage.snapshots == 2
        wire.sent.clear()
        await server.answer("b", m.StageStateRequest(0, offset=600_000, sha256="f" * 64), 0, "b", 1.0)
        assert [msg.offset for _p, msg, _b in wire.sent][0] == 0  # (another state: from the start)
        wire.ok = False
        await server.answer("c", m.StageStateRequest(0), 0, "c", 1.0)
        assert server.served is not None
        await trio.sleep(server.keep_s + 5)
        assert server.served is None
        # a newer request from the same newcomer cancels the send still going to it, and one still waiting for steps
        wire.ok, wire.hold = True, trio.Event()
        wire.sent.clear()
        nursery.start_soon(server.answer, "a", m.StageStateRequest(0), 0, "a", 1.0)
        await trio.sleep(1)
        nursery.start_soon(server.answer, "a", m.StageStateRequest(0, after=5), 0, "a", 100.0)
        await trio.sleep(1)
        wire.hold.set()
        await trio.sleep(1)
        assert wire.sent == []  # (the first was cancelled; the second waits for 5 steps)
        nursery.start_soon(server.answer, "a", m.StageStateRequest(0), 0, "a", 1.0)
        await trio.sleep(1)
        assert [msg.offset for _p, msg, _b in wire.sent] == [0, 300_000, 600_000, 900_000]


@pytest.mark.trio
@pytest.mark.parametrize("chunk_mib, stall_at", [(1, 8), (4, 2)])
async def test_a_download_broken_off_resumes_where_it_stopped(tmp_path, monkeypatch, chunk_mib, stall_at):
    """A 19.7-MB state in chunks of `chunk_mib`; the channel stops moving at its `stall_at`-th record: the joiner asks
    again 2 s after the last byte came (not STATE_WAIT_S after it asked: the answer had begun) with what it holds,
    again 2 s after that when nothing came, and the source sends the rest, not the whole (4-MiB chunks stalled at
    the second record: no chunk was in, the state comes from the start)."""
    from gwtf_node.runtime.node import joining, statechunks

    from support.helpers import start_source_and_joiner, until

    monkeypatch.setattr(statechunks, "STATE_CHUNK_BYTES", chunk_mib << 20)
    monkeypatch.setattr(joining, "DEFAULT_FRAME_TIMEOUT_S", 2.0)
    real = channel.RawConn.send_all
    records = [0]

    async def send_all(self, data):
        if len(data) > 64 << 10:
            records[0] += 1
            if records[0] == stall_at:  # (once: the connection hangs, the source's next stream is a new one)
                await trio.sleep_forever()
        await real(self, data)

    monkeypatch.setattr(channel.RawConn, "send_all", send_all)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            source, joiner = await start_source_and_joiner(nursery, tmp_path)
            src_id = source.parts.wire.me
            asked = []
            serve = source.parts.joining._answer_state_request

            async def counted(peer, msg):  # (the first request to resume goes unanswered: the joiner asks again)
                asked.append((trio.current_time(), msg))
                if len(asked) != 2:
                    await serve(peer, msg)

            source.parts.joining._answer_state_request = counted
            records[0] = 0
            nursery.start_soon(joiner.parts.joining.fetch_state, src_id, 0)
            if chunk_mib == 1:
                await until(lambda: joiner.parts.joining.download.held > 0, "the first chunks are in")
                wait, = joiner.parts.joining.waits(trio.current_time(), str)
                assert wait["what"] == "stage_state" and wait["bytes"] > 0 and wait["total"] > wait["bytes"], wait
            await until(lambda: joiner.parts.joining.state_loaded.is_set(), "the state is loaded", 60)
            state = len(source.stage.model.state_bytes())
            times, asked = [t for t, _ in asked], [a for _, a in asked]
            assert [a.offset for a in asked][0] == 0 and len(asked) == 3, asked
            # a frame timeout (2 s) after the last request, not at once (times of arrival: the two frames' trips differ)
            assert times[2] - times[1] >= 1.9, times
            frames, sent = source.parts.wire.sent["payload"]["StageState"]
            if chunk_mib == 4:
                assert asked[2].offset == 0 and state <= sent < state + 4096  # (the envelopes: ~100 bytes a frame)
            else:
                assert 0 < asked[2].offset == asked[1].offset < state and asked[2].sha256 == hashlib.sha256(
                    source.stage.model.state_bytes()).hexdigest()
                assert state <= sent < state + asked[2].offset, (state, sent, asked[2].offset)
            assert frames > state // (chunk_mib << 20)
            assert source.stage.model.state_hash() == joiner.stage.model.state_hash()
            for node in (source, joiner):
                node.stop()

"""Window updates of yamux per control frame: a frame is one read of the stream (frames.py `Buffered`), and yamux
sends an update after a read only when its window hysteresis asks (hostlisten.py `YAMUX_ENV`), about every other
frame; py-libp2p's default (an update after every read) stays the operator's to choose."""

from __future__ import annotations

import os

import pytest
import trio
from libp2p.stream_muxer.yamux.yamux import YamuxStream

from gwtf_node.runtime.net.host import open_host


async def _window_updates(tmp_path, frames: int, monkeypatch) -> int:
    updates = [0]
    original = YamuxStream.send_window_update

    async def counted(self, increment, skip_lock=False):
        updates[0] += 1
        return await original(self, increment, skip_lock=skip_lock)

    monkeypatch.setattr(YamuxStream, "send_window_update", counted)
    async with open_host(tmp_path / "a", dht=False) as a, \
            open_host(tmp_path / "b", dht=False, bootstrap=a.addrs) as b:
        got = [0]

        async def count(peer, envelope, payload):
            got[0] += 1

        b.set_handler(count)
        with trio.fail_after(60):
            await a.send(b.peer_id, b"first")
            while got[0] < 1:
                await trio.sleep(0.01)
            updates[0] = 0
            for _ in range(frames):
                await a.send(b.peer_id, b"x" * 64)
            while got[0] < frames + 1:
                await trio.sleep(0.01)
    return updates[0]


@pytest.mark.trio
async def test_small_frames_send_no_window_update_each(tmp_path, monkeypatch):
    monkeypatch.delenv("PY_YAMUX_RELEASE_ON_READ", raising=False)
    updates = await _window_updates(tmp_path, 200, monkeypatch)
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "0"
    assert updates <= 200 // 2 + 10, updates  # (unbuffered, py-libp2p's default: 400, two reads a frame)


@pytest.mark.trio
async def test_the_operators_setting_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("PY_YAMUX_RELEASE_ON_READ", "1")
    updates = await _window_updates(tmp_path, 200, monkeypatch)
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "1"
    assert 200 <= updates <= 210, updates  # py-libp2p's default: one after every read, one read a frame

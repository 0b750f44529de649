"""Yamux window updates as go-yamux sends them (yamuxwin.py): none until half the receive window was read, where
py-libp2p's rule sent one after about every other read of a control stream; py-libp2p's release on read (an
update after every read) stays the operator's to choose (`PY_YAMUX_RELEASE_ON_READ=1`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from libp2p.stream_muxer.yamux import yamux as Y

from gwtf_node.runtime.net import yamuxwin
from gwtf_node.runtime.net.host import open_host


class _Conn:
    def __init__(self) -> None:
        self.stream_buffers: dict[int, bytearray] = {}
        self.frames: list[bytes] = []  # the frames the stream wrote (window updates)

    def rtt(self) -> float:
        return 0.0

    async def _write_frame(self, header: bytes) -> None:
        self.frames.append(header)


async def _arrive_and_read(stream: Y.YamuxStream, n: int, rule) -> None:
    """`n` bytes arrive (the receive window shrinks, as Yamux.handle_incoming does) and the reader takes them."""
    stream.recv_window -= n
    await rule(stream, bytes_read=n)


@pytest.mark.trio
async def test_an_update_once_half_the_window_was_read_not_after_every_read(monkeypatch) -> None:
    monkeypatch.setenv("PY_YAMUX_RELEASE_ON_READ", "0")  # (hostlisten.py's setting)
    yamuxwin.install()
    conn = _Conn()
    s = Y.YamuxStream(1, conn, True)
    window = s.target_recv_window
    read = 0
    while read + 64 < window // 2:
        await _arrive_and_read(s, 64, yamuxwin._go_window_update)
        read += 64
    assert conn.frames == []  # a control stream's small frames: no update yet
    await _arrive_and_read(s, window // 2 - read, yamuxwin._go_window_update)
    assert len(conn.frames) == 1  # half the window read: the window given back (and grown by auto-tuning)
    assert s.recv_window >= window and s.target_recv_window >= window


@pytest.mark.trio
async def test_py_libp2p_0_8_1_alone_updates_after_every_small_read(monkeypatch) -> None:
    """What yamuxwin.py replaces: with PY_YAMUX_RELEASE_ON_READ=0 (hostlisten.py) py-libp2p's own rule still answers
    about every other small read with a window update (its "partial slack" branch)."""
    yamuxwin.install()
    own = yamuxwin._installed[0] if yamuxwin._installed else Y.YamuxStream._auto_tune_and_send_window_update
    monkeypatch.setenv("PY_YAMUX_RELEASE_ON_READ", "0")
    conn = _Conn()
    s = Y.YamuxStream(1, conn, True)
    for _ in range(50):
        await _arrive_and_read(s, 64, own)
    assert len(conn.frames) >= 20, f"py-libp2p sent {len(conn.frames)} updates for 50 reads: see yamuxwin.py"


async def _window_updates(tmp_path: Path, frames: int, monkeypatch) -> int:
    """Window updates sent while `frames` control frames of 100 bytes go from one host to another."""
    updates = [0]
    send = Y.YamuxStream.send_window_update

    async def counted(self, increment, skip_lock=False):
        updates[0] += 1
        return await send(self, increment, skip_lock=skip_lock)

    monkeypatch.setattr(Y.YamuxStream, "send_window_update", counted)
    with trio.fail_after(60):
        async with open_host(tmp_path / "a", dht=False) as a, \
                open_host(tmp_path / "b", dht=False, bootstrap=a.addrs) as b:
            got = trio.Semaphore(0)

            async def count(peer: str, envelope: bytes, payload) -> None:
                got.release()

            b.set_handler(count)
            await a.send(b.peer_id, b"x" * 64)
            await got.acquire()
            updates[0] = 0
            for _ in range(frames):
                await a.send(b.peer_id, b"y" * 100)
            for _ in range(frames):
                await got.acquire()
    return updates[0]


@pytest.mark.trio
async def test_control_frames_between_two_hosts_cost_no_window_updates(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PY_YAMUX_RELEASE_ON_READ", raising=False)
    updates = await _window_updates(tmp_path, 500, monkeypatch)
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "0"
    assert updates <= 2, updates  # 500 frames of 100 bytes: under half a 256-KiB window


@pytest.mark.trio
async def test_the_operators_setting_wins(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PY_YAMUX_RELEASE_ON_READ", "1")
    updates = await _window_updates(tmp_path, 200, monkeypatch)
    assert os.environ["PY_YAMUX_RELEASE_ON_READ"] == "1"
    # py-libp2p's release on read: one update after every read, a read a frame or, on a loaded machine, two frames
    # that arrived together (199 seen); with go-yamux's rule the same 200 frames cost at most 2 (above)
    assert 100 <= updates <= 210, updates

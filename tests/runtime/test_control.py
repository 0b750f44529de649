"""The control socket in one process: the line protocol, its permissions, a long state directory, a stale socket.

The server runs in a trio nursery as in a node (runtime/ops/control.py `serve`)
with plain functions for `status` and `leave`; the blocking client of the
command line talks to it from a worker thread.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest
import trio

from gwtf_node.runtime.ops import control

pytestmark = pytest.mark.trio


class FakeNode:
    def __init__(self) -> None:
        self.leaves = 0

    def status(self) -> dict:
        return {"node": {"name": "d0", "state": "training"}, "iteration": {"number": 7}}

    def leave(self) -> dict:
        self.leaves += 1
        return {"graceful": True, "pid": os.getpid()}


def _raw(path: Path, payload: bytes) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


async def test_status_and_leave_over_the_socket(tmp_path: Path) -> None:
    node = FakeNode()
    async with trio.open_nursery() as nursery:
        path = await nursery.start(control.serve, tmp_path, node.status, node.leave)
        assert path == tmp_path.absolute() / "control.sock"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_ISSOCK(path.stat().st_mode)

        def client() -> tuple[dict, dict, dict]:
            with control.Client(tmp_path) as c:  # one connection, several requests
                return c.ask("status"), c.ask("status"), c.ask("leave")

        first, second, left = await trio.to_thread.run_sync(client)
        assert first["status"]["iteration"]["number"] == 7 and second["ok"]
        assert left == {"ok": True, "op": "leave", "graceful": True, "pid": os.getpid()} and node.leaves == 1
        replies = await trio.to_thread.run_sync(_raw, path, b'{"op": "reboot"}\nnot json\n{"op": "status"}\n')
        assert [r["ok"] for r in replies] == [False, False, True]
        assert "unknown op 'reboot'" in replies[0]["error"] and "one JSON object per line" in replies[1]["error"]
        too_long = await trio.to_thread.run_sync(_raw, path, b"x" * (control.REQUEST_MAX_BYTES + 10))
        assert "longer than" in too_long[0]["error"]
        with pytest.raises(control.ControlError, match="unknown op"):
            await trio.to_thread.run_sync(lambda: control.ask(tmp_path, "nonsense"))
        nursery.cancel_scope.cancel()
    assert not path.exists()  # removed when the node stops
    with pytest.raises(control.NoDaemon, match="no node is running"):
        control.Client(tmp_path)


async def test_a_long_state_directory_gets_its_socket_elsewhere(tmp_path: Path, monkeypatch, request) -> None:
    # a short runtime directory, as XDG_RUNTIME_DIR is (/run/user/UID): tmp_path itself may be long already
    # (pytest-xdist's worker directories), too long for the socket's fallback path
    runtime = Path(tempfile.mkdtemp(prefix="xdg-"))  # (mode 0700)
    request.addfinalizer(lambda: shutil.rmtree(runtime, ignore_errors=True))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    node = FakeNode()
    async with trio.open_nursery() as nursery:
        path = await nursery.start(control.serve, deep, node.status, node.leave)
        assert path.parent == runtime / "gwtf-node" and len(str(path)) <= control.SUN_PATH_MAX
        assert (deep / control.POINTER_NAME).read_text().strip() == str(path)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        reply = await trio.to_thread.run_sync(lambda: control.ask(deep, "status"))
        assert reply["status"]["node"]["name"] == "d0"
        nursery.cancel_scope.cancel()
    assert not path.exists() and not (deep / control.POINTER_NAME).exists()


async def test_a_socket_left_by_a_killed_node_is_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "control.sock"))
    stale.close()
    with pytest.raises(control.NoDaemon, match="left from a node that stopped"):
        control.Client(tmp_path)
    node = FakeNode()
    async with trio.open_nursery() as nursery:
        await nursery.start(control.serve, tmp_path, node.status, node.leave)
        reply = await trio.to_thread.run_sync(lambda: control.ask(tmp_path, "status"))
        assert reply["ok"]
        nursery.cancel_scope.cancel()


async def test_a_failing_view_is_an_error_reply_not_a_dead_node(tmp_path: Path) -> None:
    def broken() -> dict:
        raise KeyError("stage")

    async with trio.open_nursery() as nursery:
        await nursery.start(control.serve, tmp_path, broken, FakeNode().leave)
        with pytest.raises(control.ControlError, match="could not build its status: KeyError"):
            await trio.to_thread.run_sync(lambda: control.ask(tmp_path, "status"))
        reply = await trio.to_thread.run_sync(lambda: control.ask(tmp_path, "leave"))  # still serving
        assert reply["graceful"]
        nursery.cancel_scope.cancel()

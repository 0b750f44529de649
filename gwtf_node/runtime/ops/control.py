"""The control socket: a running node answers `status` and `leave` on a unix socket in its state directory.

Protocol.  One JSON object per line each way, UTF-8, a request at most
`REQUEST_MAX_BYTES`: the client writes `{"op": "status"}` or
`{"op": "leave"}` and reads one reply line, `{"ok": true, "op": ..., ...}`
or `{"ok": false, "error": "..."}`.  A connection may carry many requests
(the live dashboard asks once a second on one connection); it is closed
after `IDLE_S` without a request.

* `status` replies with `"status"`: the node's view (status.py, `view`).
* `leave` does what SIGTERM does: a relay placed in a stage leaves
  gracefully (joining.py: it announces it, finishes the iteration in flight
  and its aggregation, says Goodbye and exits); any other node stops (a data
  node tells its peers first).  The reply says which (`"graceful"`) and the
  process id, so the client can wait for it to be gone.

Where the socket is.  `control.sock` in the state directory, mode 0600 (it
is bound under a temporary name, restricted, then renamed into place, so it
is never reachable with looser permissions), so only the node's user can
ask it to leave.  A unix socket path holds at most `SUN_PATH_MAX` bytes; a
deeper state directory gets its socket in a private directory of this user
(`$XDG_RUNTIME_DIR/gwtf-node` or `/tmp/gwtf-node-<uid>`, mode 0700), named
by a hash of the state directory, and `control.path` in the state directory
says where it is.  A socket left by a node that was killed is replaced at
the next start (the state directory's lock says no other node uses it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

import trio

from .startup import StartupError

log = logging.getLogger("gwtf.control")

SOCKET_NAME = "control.sock"
POINTER_NAME = "control.path"  # the socket's path when it cannot live in the state directory
SUN_PATH_MAX = 107  # bytes of a unix socket path on Linux (sun_path is 108 with the terminating NUL)
REQUEST_MAX_BYTES = 4096
IDLE_S = 60.0  # a connection with no request for this long is closed
BACKLOG = 16
OPS = ("status", "leave")


class ControlError(StartupError):
    """The control socket could not be used; the message says why and what to do."""


class NoDaemon(ControlError):
    """No node answers on this state directory."""


def _fits(path: Path) -> bool:
    return len(os.fsencode(str(path))) <= SUN_PATH_MAX


def _private_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "gwtf-node" if base and Path(base).is_dir() else \
        Path(tempfile.gettempdir()) / f"gwtf-node-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ControlError(f"{d} must be a directory of user {os.getuid()} with mode 0700 for the control socket "
                           "(the state directory's path is too long for one there); fix or remove it")
    return d


def socket_path(state_dir: Path) -> Path:
    """Where the node of `state_dir` binds its control socket (see the module doc)."""
    state_dir = Path(state_dir).absolute()
    inside = state_dir / SOCKET_NAME
    if _fits(inside):
        return inside
    digest = hashlib.sha256(os.fsencode(str(state_dir))).hexdigest()[:20]
    path = _private_dir() / f"{digest}.sock"
    if not _fits(path):
        raise ControlError(f"no short enough path for a control socket (unix sockets take at most "
                           f"{SUN_PATH_MAX} bytes): {path}; set XDG_RUNTIME_DIR to a short directory")
    return path


def find_socket(state_dir: Path) -> Path | None:
    """The control socket of the node of `state_dir`, if one was made (the node may be gone since)."""
    state_dir = Path(state_dir)
    inside = state_dir / SOCKET_NAME
    if inside.exists():
        return inside
    try:
        pointed = Path((state_dir / POINTER_NAME).read_text().strip())
    except OSError:
        return None
    return pointed if pointed.exists() else None


# ---------------------------------------------------------------------- the server (in the node's nursery)
async def serve(state_dir: Path, status: Callable[[], dict], leave: Callable[[], dict], *,
                task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the control socket of `state_dir` until cancelled; `started` with the socket's path."""
    state_dir = Path(state_dir).absolute()
    path = socket_path(state_dir)
    pointer = state_dir / POINTER_NAME
    tmp = path.with_name(f".ctl{os.getpid()}")
    tmp.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(str(tmp))
        os.chmod(tmp, 0o600)
        sock.listen(BACKLOG)
        os.replace(tmp, path)  # (a socket left by a killed node is replaced: the state directory is ours)
    except OSError as e:
        sock.close()
        tmp.unlink(missing_ok=True)
        raise ControlError(f"cannot make the control socket {path}: {e.strerror}") from None
    if path.parent != state_dir:
        pointer.write_text(f"{path}\n")
    else:
        pointer.unlink(missing_ok=True)
    ino = path.stat().st_ino
    handler = _Handler(status, leave)
    log.info("control socket %s", path)
    try:
        task_status.started(path)
        await trio.serve_listeners(handler.connection, [trio.SocketListener(sock)])
    finally:
        try:
            if path.stat().st_ino == ino:  # still ours (not replaced by a later node of this state directory)
                path.unlink()
        except OSError:
            pass
        if path.parent != state_dir:
            pointer.unlink(missing_ok=True)


class _Handler:
    def __init__(self, status: Callable[[], dict], leave: Callable[[], dict]) -> None:
        self.status = status
        self.leave = leave

    async def connection(self, stream: trio.SocketStream) -> None:
        buf = bytearray()
        try:
            async with stream:
                while True:
                    chunk = None
                    with trio.move_on_after(IDLE_S):
                        chunk = await stream.receive_some(REQUEST_MAX_BYTES)
                    if not chunk:  # closed by the client, or idle for IDLE_S (chunk is None)
                        return
                    buf += chunk
                    while b"\n" in buf:
                        line, _, rest = bytes(buf).partition(b"\n")
                        buf = bytearray(rest)
                        await stream.send_all(json.dumps(self.answer(line)).encode() + b"\n")
                    if len(buf) > REQUEST_MAX_BYTES:
                        await stream.send_all(json.dumps(_error(
                            f"request longer than {REQUEST_MAX_BYTES} bytes without a newline")).encode() + b"\n")
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client went away mid-reply

    def answer(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
        except ValueError:
            return _error('a request is one JSON object per line, e.g. {"op": "status"}')
        op = req.get("op") if isinstance(req, dict) else None
        if op == "status":
            try:
                return {"ok": True, "op": op, "status": self.status()}
            except Exception as e:  # noqa: BLE001 - a fault of the view must not stop a training node: logged, told
                log.exception("building the status view failed")
                return _error(f"the node could not build its status: {type(e).__name__}: {e} (see its log)")
        if op == "leave":
            return {"ok": True, "op": op, **self.leave()}
        return _error(f"unknown op {op!r}: the ops are {', '.join(OPS)}")


def leave(node: Any) -> dict:
    """The `leave` op on a node (node.py `Node`): what SIGTERM does (a placed relay leaves gracefully, any
    other node stops); a second request while it leaves changes nothing."""
    graceful = node.can_leave_gracefully()
    if graceful and not node.peers.place.leaving:
        node.parts.wire.spawn(node.leave)
    elif not graceful:
        node.stop()
    return {"graceful": graceful, "pid": os.getpid(), "role": node.peers.place.role}


def _error(text: str) -> dict:
    return {"ok": False, "error": text}


# ---------------------------------------------------------------------- the client (blocking; the command line)
class Client:
    """One connection to a node's control socket; `ask` sends a request and returns its reply."""

    def __init__(self, state_dir: Path, timeout_s: float = 5.0) -> None:
        self.state_dir = Path(state_dir)
        path = find_socket(self.state_dir)
        if path is None:
            raise NoDaemon(f"{self.state_dir}: no node is running here (no control socket; start one with "
                           f"gwtf-node join --state-dir {self.state_dir} ...)")
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            self.sock.close()
            raise NoDaemon(f"{self.state_dir}: no node is running here (its control socket {path} is left from "
                           "a node that stopped)") from None
        except PermissionError:
            self.sock.close()
            raise ControlError(f"{path}: permission denied: run as the user that started the node") from None
        except OSError as e:
            self.sock.close()
            raise ControlError(f"{path}: cannot connect ({e.strerror or e})") from None
        self.reader = self.sock.makefile("rb")

    def ask(self, op: str, **fields: Any) -> dict:
        try:
            self.sock.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
            line = self.reader.readline()
        except TimeoutError:
            raise ControlError(f"{self.path}: the node did not answer {op!r} in time") from None
        except OSError as e:
            raise NoDaemon(f"{self.state_dir}: the node went away ({e.strerror or e})") from None
        if not line:
            raise NoDaemon(f"{self.state_dir}: the node closed the control connection (it is stopping)")
        try:
            reply = json.loads(line)
        except ValueError:
            raise ControlError(f"{self.path}: not a control reply: {line[:80]!r}") from None
        if not reply.get("ok"):
            raise ControlError(f"{self.path}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ask(state_dir: Path, op: str, timeout_s: float = 5.0) -> dict:
    """One request to the node of `state_dir` on a connection of its own."""
    with Client(state_dir, timeout_s) as c:
        return c.ask(op)

"""The state directory belongs to one running node: an exclusive lock on `<state dir>/lock`.

Two nodes started on the same state directory would run under the same
identity key (the same peer id) and overwrite each other's `addr`,
`status.json` and checkpoints.  So a node takes an exclusive, non-blocking
`flock` on `<state dir>/lock` before it writes anything there, and writes its
pid into the file for the person who meets the lock.  A second node finds
the lock held and stops with `StateDirLocked`, naming the pid that holds it.

The lock lives as long as the open file: the kernel releases it when the
process exits, also on a crash or SIGKILL, so a node restarted right after
`kill -9` takes it at once.  The file itself stays behind (an unlocked file
with a stale pid means nothing).  The descriptor is not inherited by child
processes (Python opens files non-inheritable), so a program started by the
node cannot keep the lock alive after the node.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .startup import StartupError

LOCK_FILE_NAME = "lock"


class StateDirLocked(StartupError):
    """The state directory is held by another running node."""

    def __init__(self, state_dir: Path, holder_pid: int | None) -> None:
        self.state_dir, self.holder_pid = state_dir, holder_pid
        who = f"pid {holder_pid}" if holder_pid is not None else "another process (its pid is not written yet)"
        super().__init__(f"state directory {state_dir} is in use by a running node ({who}): stop that node "
                         "(gwtf-node leave --state-dir ...) or give this one another --state-dir")


class StateDirLock:
    """The held lock of a state directory; `release` (or leaving the `with` block) gives it up."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> "StateDirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StateDirUnwritable(StartupError):
    """The state directory (or a directory in it) cannot hold what the node writes."""


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Take the state directory's lock (creating the directory, 0700, if needed) or raise `StateDirLocked`."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / LOCK_FILE_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise StateDirLocked(state_dir, holder) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateDirLock(path, fd)


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


__all__ = ["LOCK_FILE_NAME", "StateDirLock", "StateDirLocked", "lock_state_dir"]


def check_writable(state_dir: Path, need_bytes: int, subdirs: tuple[str, ...] = ("checkpoints",)) -> None:
    """Every place the node writes (the state directory and `subdirs`) is a writable directory with room for
    `need_bytes` (a checkpoint); `StateDirUnwritable` says which and how to fix it.  Run at start-up, before the
    node joins, so that a bad directory is one line and not a crash at the first checkpoint."""
    import shutil

    state_dir = Path(state_dir)
    for d in (state_dir, *(state_dir / s for s in subdirs)):
        if d.exists() and not d.is_dir():
            raise StateDirUnwritable(f"{d} is a file, where the node keeps a directory: move it away")
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = d / f".write-probe.{os.getpid()}"
            with open(probe, "wb") as f:
                f.write(b"x")
            probe.unlink()
        except OSError as e:
            raise StateDirUnwritable(f"{d} is not writable ({e.strerror}): the node writes its checkpoints and "
                                     f"logs there; fix its permissions or give another --state-dir") from None
    free = shutil.disk_usage(state_dir).free
    if free < need_bytes:
        raise StateDirUnwritable(f"{state_dir} has {free / 2**20:.0f} MiB free, a checkpoint of this node's part "
                                 f"needs about {need_bytes / 2**20:.0f} MiB: free some space or give another "
                                 f"--state-dir")

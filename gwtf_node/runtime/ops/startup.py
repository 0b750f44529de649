"""Start-up checks: what stops a node at start, and the one line that says why.

A volunteer's first mistakes must end the node at once with one line naming
what is wrong and how to fix it, instead of a node that runs on and never
joins.  Two kinds of end:

* `StartupError`: raised before the node takes part in anything.
  - `PortInUse` (here): `check_port_free` binds the address with
    SO_REUSEADDR and without SO_REUSEPORT, then closes the socket.
    py-libp2p listens with SO_REUSEPORT (for TCP hole punching), so a second
    node given the port of a running one would listen beside it and the
    kernel would split incoming connections between the two; a program that
    listens without SO_REUSEPORT makes py-libp2p log the error and listen on
    nothing.  The probe fails with EADDRINUSE whenever any socket listens on
    the address, and succeeds while the connections of a node killed a moment
    ago sit in TIME_WAIT (SO_REUSEADDR), so a restarted node takes its old
    port back at once.  `open_host` also checks that py-libp2p listens on at
    least one address once started (a port taken between probe and bind).
  - `StateDirLocked` (statedir.py): another running node holds the state
    directory.
* `NodeExit`: a running node that stops by itself before it joined, because
  no bootstrap peer answered within the configured time or because a peer
  refused its Hello before any peer accepted it (bootstrap.py).  `run_node`
  returns it; the command line turns it into an exit status.
"""

from __future__ import annotations

import enum
import errno
import socket
from dataclasses import dataclass


class StartupError(Exception):
    """The node cannot start; the message is one line saying what to fix."""


class PortInUse(StartupError):
    def __init__(self, host: str, port: int, what: str = "port", fix: str = "choose another --port") -> None:
        self.host, self.port = host, port
        super().__init__(f"{what} {port} on {host} is in use by another program or node: {fix} "
                         "(0: any free port)")


def check_port_free(host: str, port: int, what: str = "port", fix: str = "choose another --port") -> None:
    """Raise `PortInUse` if a socket listens on (host, port); port 0 (any free port) is never in use."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            probe.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(host, port, what, fix) from None
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None


class ExitKind(enum.Enum):
    """Why a running node stopped by itself before it joined."""

    REFUSED = "refused"  # a peer refused our Hello before any peer accepted it: our run or place is not the swarm's
    NO_BOOTSTRAP = "no bootstrap"  # no bootstrap peer answered within the bootstrap timeout


@dataclass(frozen=True)
class NodeExit:
    kind: ExitKind
    reason: str  # one line for a person: what happened and what to do


def first_startup_error(exc: BaseException) -> StartupError | None:
    """The `StartupError` inside `exc` (trio wraps what a nursery's body raises in exception groups)."""
    if isinstance(exc, StartupError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = first_startup_error(sub)
            if found is not None:
                return found
    return None


__all__ = ["ExitKind", "NodeExit", "PortInUse", "StartupError", "check_port_free", "first_startup_error"]

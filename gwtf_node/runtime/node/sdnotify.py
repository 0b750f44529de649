"""Telling systemd how the daemon is doing: the sd_notify protocol, written out.

A service of `Type=notify` (cli/service.py writes the unit) is started when
the node says `READY=1`, and with `WatchdogSec=` systemd kills and restarts it
when no `WATCHDOG=1` came within that interval.  The protocol is a few
newline-separated `KEY=VALUE` lines in one datagram sent to the AF_UNIX socket
named by `$NOTIFY_SOCKET` (a path, or an abstract-namespace name written with
a leading `@`); `$WATCHDOG_USEC` gives the interval, `$WATCHDOG_PID` the
process it is meant for.  That is small enough to write here instead of
depending on a package.

What the node says (`serve`):

- `STATUS=...` whenever its one-line description changes (loading the model,
  a bootstrap attempt and its last error, waiting to be dialled, joined with
  its stage, peers and steps applied), shown by `systemctl status`;
- `READY=1` once, when the node has *joined*: it listens and a peer accepted
  its Hello, or it is the first node of the run (no bootstrap address), which
  is ready once it listens.  A datagram that could not be sent (a full queue)
  is sent again at the next tick.  A relay whose bootstrap peer does not
  answer stays "activating" in systemd, and its STATUS says why;
- `WATCHDOG=1` every half watchdog interval from the trio event loop, so a
  loop that stopped answering (and therefore stopped answering peers' pings)
  is what systemd restarts;
- `STOPPING=1` when the node stops.

Without `$NOTIFY_SOCKET` (not started by systemd) nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ..net.bootstrap import BootstrapState

log = logging.getLogger(__name__)

STATUS_EVERY_S = 2.0  # how often the node's one-line status is looked at (sent only when it changed)


def socket_address(name: str) -> str | bytes:
    """The address to send to for a `$NOTIFY_SOCKET` value: `@name` is the abstract namespace (a leading NUL)."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


def watchdog_interval_s(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between two WATCHDOG=1 pings: half of `$WATCHDOG_USEC`; None when systemd asks for none.

    `$WATCHDOG_PID`, when set, names the process the watchdog is meant for: another process (a child that
    inherited the environment) sends nothing.
    """
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and (not owner.isdigit() or int(owner) != pid):
        return None
    return int(usec) / 1e6 / 2


class Notifier:
    """Sends sd_notify datagrams to one socket; a send that fails is logged once and counted, never raised."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._target = socket_address(address)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)
        self.failures = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier | None:
        """A notifier for `$NOTIFY_SOCKET`, or None when the process was not started by systemd."""
        name = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
        return cls(name) if name else None

    def send(self, **fields: str | int) -> bool:
        """Send `KEY=VALUE` lines in one datagram (`send(READY=1, STATUS="joined")`); whether it was sent."""
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\n", " ")  # a value is one line: a newline would start another field
            lines.append(f"{key}={text}")
        try:
            self._sock.sendto("\n".join(lines).encode(), self._target)
            return True
        except OSError as e:
            if self.failures == 0:
                log.warning("cannot notify systemd at %s (%s): service status and watchdog pings are lost",
                            self.address, e.strerror or e)
            self.failures += 1
            return False

    def close(self) -> None:
        self._sock.close()


async def serve(notifier: Notifier, *, ready: Callable[[], bool], status: Callable[[], str],
                watchdog_s: float | None, status_every_s: float = STATUS_EVERY_S) -> None:
    """Report to systemd until cancelled: STATUS when it changes, READY=1 once `ready()`, WATCHDOG=1 each
    `watchdog_s` (half the interval systemd asked for), STOPPING=1 on the way out."""
    tick_s = status_every_s if watchdog_s is None else min(status_every_s, watchdog_s)
    said, is_ready = "", False
    try:
        while True:
            fields: dict[str, str | int] = {}
            text = status()
            if text != said:
                fields["STATUS"] = text
            becomes_ready = not is_ready and ready()
            if becomes_ready:
                fields["READY"] = 1
                fields["MAINPID"] = os.getpid()
            if watchdog_s is not None:
                fields["WATCHDOG"] = 1
            if fields and notifier.send(**fields):  # a datagram lost (a full queue) is said again next tick
                said = text
                is_ready = is_ready or becomes_ready
            await trio.sleep(tick_s)
    finally:
        notifier.send(STOPPING=1, STATUS="stopping")


def node_ready(node: Any) -> bool:
    """Joined: listening, and accepted by a peer (or the run's first node, which has nobody to join)."""
    p = node.parts
    return p is not None and p.bootstrap.state in (BootstrapState.CONNECTED, BootstrapState.WAITING_FOR_DIAL)


def node_status(node: Any) -> str:
    """One line for `systemctl status`: what the node (a node.Node, not imported: node.py imports this) is
    doing."""
    p, who = node.parts, f"{node.opts.role} {node.opts.name}".rstrip()
    if p is None:
        return f"{who}: starting (loading the model)"
    b = p.bootstrap
    if b.state is BootstrapState.WAITING_FOR_DIAL:
        return f"{who}: first node of the run, waiting to be dialled"
    if b.state is not BootstrapState.CONNECTED:
        last = f"; last error: {b.last_error}" if b.last_error else ""
        return f"{who}: {b.state.value}, bootstrap attempt {b.attempts}{last}"
    place = node.peers.place
    where = ("data node" if node.opts.role == "data" else "waiting for a stage" if place.stage is None
             else f"stage {place.stage}")
    doing = "leaving" if place.leaving else "joined"
    return f"{who}: {doing}, {where}, {len(node.peers.infos())} peers, {node.stage.applied_steps} steps applied"


def serve_from_env(*, ready: Callable[[], bool], status: Callable[[], str],
                   env: Mapping[str, str] | None = None) -> Callable[[], object] | None:
    """The `serve` task to start for this process's systemd service, or None when not run by systemd."""
    env = os.environ if env is None else env
    notifier = Notifier.from_env(env)
    if notifier is None:
        return None
    watchdog_s = watchdog_interval_s(env, os.getpid())

    async def task() -> None:
        try:
            await serve(notifier, ready=ready, status=status, watchdog_s=watchdog_s)
        finally:
            notifier.close()

    return task


__all__ = ["Notifier", "STATUS_EVERY_S", "node_ready", "node_status", "serve", "serve_from_env", "socket_address", "watchdog_interval_s"]

"""Reaching the swarm at start: bootstrap retries with backoff, and a refused Hello ends the node.

A node is *accepted* once any peer says Hello to it (a peer answers a first
Hello with its own, discovery.py).  Until then this component says, in the
log and in status.json (`"bootstrap"`), what it is doing:

* **With bootstrap addresses.**  Each attempt dials every address at once,
  each dial bounded by `DIAL_TIMEOUT_S` and by the deadline, and greets every
  peer it reaches.  Then it waits for an answer until the next attempt is
  due, `backoff_s(attempt)` later: 1, 2, 4, 8, 16, then every 30 s.  Each
  address that fails is logged with the reason, the attempt and the delay
  (`bootstrap /ip4/... unreachable (Connection refused): attempt 3, next in
  4 s`).  With no acceptance within `timeout_s` (0: retry forever) the node
  stops with `NodeExit(NO_BOOTSTRAP)`.  Once a peer accepted it, the
  deadline no longer applies and this component has nothing more to do
  (peers that come and go later are discovery's and liveness's business).
* **Without.**  The node is the first of its swarm, or waits for others to
  dial it: it says so with its address at start and every
  `WAITING_LOG_EVERY_S` while it knows no peer.
* **Refused.**  A node that refuses a Hello answers `Refused(code, reason)`
  (discovery.py).  A refusal from a peer we greeted, before any peer accepted
  us, means our input is not the swarm's (another run.json, a stage the run
  does not have): retrying cannot help, so the node stops with
  `NodeExit(REFUSED)` and the peer's reason.  After a peer accepted us, a
  refusal is logged and nothing more, so a hostile or confused peer cannot
  stop a node that has joined.  (A hostile bootstrap peer can stop a node at
  start, as it could by never answering; the node does not trust its
  bootstrap peer with anything else.)
"""

from __future__ import annotations

import enum
import logging
import os
import re
from typing import Any, Callable

import trio

from ...protocol import messages as m
from .discovery import Discovery
from .peers import Peers
from .conninfo import exception_chain
from .host import PeerUnreachable
from ..ops.startup import ExitKind, NodeExit
from .wire import Wire, now

log = logging.getLogger("gwtf.node")

BACKOFF_FIRST_S = 1.0  # delay after the first failed attempt; doubled after each failure
BACKOFF_CAP_S = 30.0  # longest delay between two attempts
DIAL_TIMEOUT_S = 10.0  # one dial of one address (connect + Hello), at most
WAITING_LOG_EVERY_S = 30.0  # a node with no bootstrap address says it waits, this often while alone
DEFAULT_TIMEOUT_S = 300.0  # give up after this long without a peer accepting us (--bootstrap-timeout)
REASON_MAX_CHARS = 300  # a peer's refusal reason is cut to this before it is logged or shown


class BootstrapState(enum.Enum):
    WAITING_FOR_DIAL = "waiting to be dialled"  # no bootstrap address: waits for peers to dial this node
    DIALING = "dialing"  # an attempt is under way
    RETRYING = "retrying"  # no peer accepted us yet; the next attempt is due at `next_retry_at`
    CONNECTED = "connected"  # a peer accepted our Hello (or greeted us first)
    GAVE_UP = "gave up"  # no bootstrap peer answered within the timeout: the node stops
    REFUSED = "refused"  # a peer refused our Hello before any accepted it: the node stops


def backoff_s(attempt: int, first_s: float = BACKOFF_FIRST_S, cap_s: float = BACKOFF_CAP_S) -> float:
    """Delay after failed attempt number `attempt` (1-based): first_s, doubling, at most cap_s."""
    if attempt < 1:
        raise ValueError(f"attempts are numbered from 1, got {attempt}")
    return min(cap_s, first_s * 2.0 ** min(attempt - 1, 62))


def one_line(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """`text` as one printable line of at most `limit` characters (a peer's words reach our terminal)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


_MISMATCH = re.compile(r"remote_peer=(\w+), remote_peer_id_from_pubkey=(\w+)")


def wrong_peer_id(exc: BaseException) -> tuple[str, str] | None:
    """(the peer id the address names, the one the node there proved) when a dial failed because they differ.

    The Noise handshake checks that the key the remote node signs with is the
    one of the address's /p2p/ part; py-libp2p reports a mismatch only as
    "handshake failed when upgrading to secure connection", with
    `PeerIDMismatchesPubkey` (naming both ids) deep in the chain.
    """
    for e in exception_chain(exc):
        if type(e).__name__ == "PeerIDMismatchesPubkey":
            found = _MISMATCH.search(str(e))
            if found:
                return found.group(1), found.group(2)
    return None


def dial_reason(exc: BaseException, limit: int = 160) -> str:
    """The root cause of a failed dial in a few words.

    py-libp2p nests it several levels deep (SwarmDialAllFailedError >
    MultiError > SwarmException > OpenConnectionError > OSError > the
    socket's ConnectionRefusedError); the errno's text is what a person
    needs.  Without one, the innermost message that is not a wrapper.  A node
    that answers with another peer id than the address names is said so
    (`wrong_peer_id`).
    """
    ids = wrong_peer_id(exc)
    if ids is not None:
        return f"the node there has peer id {ids[1]}, not the {ids[0]} of the address"
    chain = exception_chain(exc)
    for e in chain:
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno)  # "Connection refused", without the socket's own wording around it
    if any(isinstance(e, trio.TooSlowError) for e in chain):
        return "no answer in time"
    wrappers = ("unable to connect", "error 1:", "cannot connect", "fail to open connection")
    for e in chain:
        text = one_line(str(e), limit)
        if text and not text.lower().startswith(wrappers):
            return text
    return one_line(str(exc) or type(exc).__name__, limit)


class Bootstrap:
    def __init__(self, wire: Wire, peers: Peers, discovery: Discovery, host: Any, addrs: list[str], *,
                 timeout_s: float, on_exit: Callable[[NodeExit], None]) -> None:
        self.wire = wire
        self.peers = peers
        self.discovery = discovery
        self.host = host
        self.addrs = list(addrs)
        self.timeout_s = timeout_s
        self.on_exit = on_exit
        self.state = BootstrapState.DIALING if self.addrs else BootstrapState.WAITING_FOR_DIAL
        self.attempts = 0
        self.next_retry_at: float | None = None
        self.deadline: float | None = None
        self.last_error = ""
        self._accepted = trio.Event()
        self._dht_refreshed = False
        self.wrong_ids: dict[str, str] = {}  # bootstrap address -> the peer id that answers there instead

    # ------------------------------------------------------------------ events
    def on_peer_hello(self) -> None:
        """A peer said Hello: we are accepted (also a peer that dialled us first)."""
        if not self._accepted.is_set():
            self._accepted.set()
            if self.state in (BootstrapState.DIALING, BootstrapState.RETRYING, BootstrapState.WAITING_FOR_DIAL):
                self.state = BootstrapState.CONNECTED
                self.next_retry_at = None

    def on_refused(self, sender: str, msg: m.Refused) -> None:
        reason = one_line(msg.reason)
        who = self.peers.who(sender)
        if self._accepted.is_set() or sender not in self.discovery.hellos_sent:
            log.warning("peer %s refused our Hello (%s): %s", who, msg.code.name, reason)
            return
        log.error("refused by peer %s (%s): %s", who, msg.code.name, reason)
        self.state = BootstrapState.REFUSED
        self.last_error = reason
        self.on_exit(NodeExit(ExitKind.REFUSED, f"refused by peer {sender}: {reason}"))

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        if not self.addrs:
            await self._wait_to_be_dialled()
            return
        start = now()
        self.deadline = start + self.timeout_s if self.timeout_s > 0 else None
        while not self._accepted.is_set():
            self.attempts += 1
            self.state = BootstrapState.DIALING
            failures = await self._attempt()
            if self._accepted.is_set():
                break
            due = now() + backoff_s(self.attempts)
            if self.deadline is not None:
                due = min(due, self.deadline)
            self.next_retry_at = due
            self.state = BootstrapState.RETRYING
            last = self.deadline is not None and due >= self.deadline
            for addr, why in failures.items():
                if addr in self.wrong_ids:  # (said once, with the fix, when first seen)
                    continue
                log.warning("bootstrap %s unreachable (%s): attempt %d, %s in %.0f s", addr, why, self.attempts,
                            "gives up" if last else "next", max(0.0, due - now()))
            with trio.move_on_at(due):
                await self._accepted.wait()
            if self._accepted.is_set():
                break
            reached = [a for a in self.addrs if a not in failures]
            if reached:
                self.last_error = "reached, but no Hello came back"
                stats = getattr(self.host, "stats", {})
                log.warning("bootstrap %s reached but sent no Hello back: attempt %d (%d frames received from any "
                            "peer so far)", ", ".join(reached), self.attempts, stats.get("frames_in", 0))
            if self.deadline is not None and now() >= self.deadline:
                self._give_up()
                return
        log.info("joined the swarm after %d bootstrap attempt(s)", self.attempts)

    async def _attempt(self) -> dict[str, str]:
        """Dial every bootstrap address at once and greet the peers reached; {address: why it failed}."""
        failures: dict[str, str] = {}
        cut: set[str] = set()  # dials the bootstrap deadline interrupted: not the address's fault

        async def one(addr: str) -> None:
            start = now()
            limit = start + DIAL_TIMEOUT_S
            if self.deadline is not None:
                limit = min(limit, self.deadline)
            with trio.move_on_at(limit) as scope:
                try:
                    pid = await self.discovery.greet(addr)
                except PeerUnreachable as e:
                    failures[addr] = dial_reason(e)
                    ids = wrong_peer_id(e)
                    if ids is not None:
                        self._wrong_id(addr, *ids)
                    return
            if scope.cancelled_caught:
                if limit - start < DIAL_TIMEOUT_S:
                    cut.add(addr)
                failures[addr] = f"no answer within {limit - start:.1f} s"
            elif pid == self.peers.me:
                failures[addr] = "that address is this node itself"
            elif self.host.dht is not None and not self._dht_refreshed:
                self._dht_refreshed = True  # the DHT learns the swarm from the first peer reached
                self.wire.spawn(self.host.refresh_dht)

        async with trio.open_nursery() as nursery:
            for addr in self.addrs:
                nursery.start_soon(one, addr)
        real = {a: w for a, w in failures.items() if a not in cut}
        if len(self.addrs) == 1 and real:
            self.last_error = real[self.addrs[0]]
        elif real:
            self.last_error = "; ".join(f"{a}: {w}" for a, w in real.items())
        return failures

    def _wrong_id(self, addr: str, named: str, found: str) -> None:
        """A node answers at `addr` with peer id `found`, not the `named` of the address: said once, with the
        fix (the attempts go on: the node the address names may come back there)."""
        if addr in self.wrong_ids:
            return
        self.wrong_ids[addr] = found
        log.error("bootstrap %s: the node at that address has peer id %s, not %s (the /p2p/ part of the address): "
                  "give that node's current address (its <state-dir>/addr, or gwtf-node peer-id --state-dir DIR); "
                  "if it is the node you mean: %s", addr, found, named, addr.replace(named, found))

    def _give_up(self) -> None:
        self.state = BootstrapState.GAVE_UP
        self.next_retry_at = None
        addrs = ", ".join(self.addrs)
        fix = ("check the /p2p/ part of --bootstrap: another node answers there (the node's <state-dir>/addr holds "
               "its full address)" if self.wrong_ids and len(self.wrong_ids) == len(self.addrs) else
               "check that the node at that address runs and that the address is its current one (its "
               "<state-dir>/addr)")
        reason = (f"no bootstrap peer answered within {self.timeout_s:g} s ({self.attempts} attempts to {addrs}; "
                  f"last error: {self.last_error}): {fix}, or raise --bootstrap-timeout (0: retry forever)")
        log.error("%s", reason)
        self.on_exit(NodeExit(ExitKind.NO_BOOTSTRAP, reason))

    async def _wait_to_be_dialled(self) -> None:
        addr = self.host.addrs[0] if self.host.addrs else "(no address)"
        while not self._accepted.is_set():
            log.info("waiting for peers: no bootstrap address given, so this node waits for others to dial it at "
                     "%s (start them with --bootstrap %s)", addr, addr)
            with trio.move_on_after(WAITING_LOG_EVERY_S):
                await self._accepted.wait()

    # ------------------------------------------------------------------ status
    def snapshot(self) -> dict:
        t = now()
        return {
            "state": self.state.value,
            "addrs": self.addrs,
            "attempts": self.attempts,
            "next_retry_in_s": None if self.next_retry_at is None else round(max(0.0, self.next_retry_at - t), 1),
            "gives_up_in_s": (round(max(0.0, self.deadline - t), 1)
                              if self.deadline is not None and not self._accepted.is_set() else None),
            "last_error": self.last_error,
        }


__all__ = ["BACKOFF_CAP_S", "BACKOFF_FIRST_S", "Bootstrap", "BootstrapState", "DEFAULT_TIMEOUT_S", "backoff_s",
           "dial_reason", "one_line", "wrong_peer_id"]

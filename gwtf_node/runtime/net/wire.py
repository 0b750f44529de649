"""What every component of the daemon is handed: sending frames, starting tasks, the clock, refusals.

`Wire` owns no protocol state.  It sends a message (envelope encoded by
`protocol.codec`, optional raw payload) to a peer through the host, never to
a peer that is gone (except Hello and Goodbye), logs and counts refused
frames (per `RefusalCode`: status.json "refused"), and starts tasks in the
node's nursery.  It counts what it sent, per message type and lane (`sent`:
status.json "sent"): "ctrl" frames carry no payload (the host's control
stream), "payload" frames a tensor or a probe's bytes; the bytes are the
encoded envelope plus the payload (the host's few bytes of frame header
aside).  A peer that keeps sending refused frames (`BAN_REFUSALS`
within `BAN_WINDOW_S`) is disconnected and banned for `BAN_S`: its frames
are dropped unread (counted as BANNED) and nothing is sent to it.  A send that fails is logged
and reported as False: the protocol machines have their own deadlines for
lost messages, and those that assume FIFO links (the flow machines) have
theirs sent again (`send_in_order`, driver.py's `Outbox`).
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import trio

from ...protocol import codec
from ...protocol import messages as m
from .peers import Peers

log = logging.getLogger("gwtf.node")


# An honest peer's frames are refused only in races around a join, a leave or a leader change (a frame
# overtaking its sender's Hello, a phase signal of a stale term): a handful per event, resent at most once a
# second per signal.  Fifty refused frames within ten seconds is no race: the peer is broken or hostile.
BAN_REFUSALS = 50  # refused frames within BAN_WINDOW_S that get a peer banned
BAN_WINDOW_S = 10.0  # the window over which refusals are counted
BAN_S = 300.0  # how long a banned peer stays banned (then it may come back and say Hello again)


class FrameRefused(Exception):
    """A frame that is well formed but not acceptable here; logged, counted under `code` and dropped.  `ban`
    False: the frame is not the sender's fault but this node's state (it is not ready for it yet: a node that
    restarts hears its peers' regular traffic before its flows or its stage exist), so it does not count
    towards banning the sender."""

    def __init__(self, why: str, code: m.RefusalCode = m.RefusalCode.INVALID, *, ban: bool = True) -> None:
        super().__init__(why)
        self.code = code
        self.ban = ban


class RefusalTracker:
    """Refused frames per peer over a sliding window; says when a peer is to be banned, and until when."""

    def __init__(self, limit: int = BAN_REFUSALS, window_s: float = BAN_WINDOW_S, ban_s: float = BAN_S) -> None:
        self.limit, self.window_s, self.ban_s = limit, window_s, ban_s
        self.recent: dict[str, list[float]] = {}
        self.banned_until: dict[str, float] = {}

    def is_banned(self, peer: str, t: float) -> bool:
        until = self.banned_until.get(peer)
        if until is None:
            return False
        if t >= until:
            del self.banned_until[peer]
            return False
        return True

    def refused(self, peer: str, t: float) -> bool:
        """Note one refused frame of `peer` at `t`; True if that bans it (from now until `t + ban_s`)."""
        times = [x for x in self.recent.get(peer, ()) if x > t - self.window_s]
        times.append(t)
        if len(times) >= self.limit:
            self.recent.pop(peer, None)
            self.banned_until[peer] = t + self.ban_s
            return True
        self.recent[peer] = times
        return False


def now() -> float:
    return trio.current_time()


class Wire:
    def __init__(self, me: str, host: Any, nursery: trio.Nursery, peers: Peers) -> None:
        self.me = me
        self.host = host
        self.nursery = nursery
        self.peers = peers
        self.refused = 0
        self.refused_by: dict[str, int] = {}  # RefusalCode name -> refused frames (status.json "refused")
        self.handler_faults: dict[str, int] = {}  # message type -> frames whose handling failed here (routes.py)
        self.bans = RefusalTracker()
        self.on_ban: Callable[[str], None] = lambda peer: None  # the node treats a banned peer as gone
        self.closed = False  # the node's nursery has ended: frames still delivered by the host start nothing
        # lane ("ctrl" | "payload") -> message type -> [frames, bytes] sent (module doc; status.json "sent")
        self.sent: dict[str, dict[str, list[int]]] = {"ctrl": {}, "payload": {}}

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self.closed:
            log.debug("node stopped: %s not started", getattr(fn, "__name__", fn))
            return
        try:
            self.nursery.start_soon(fn, *args)
        except RuntimeError:  # the nursery closed before `closed` was set (a frame delivered as the node ends)
            if self.nursery.cancel_scope.cancel_called:
                self.closed = True
                log.debug("node stopping: %s not started", getattr(fn, "__name__", fn))
                return
            raise

    async def send(self, peer: str, msg: m.Message, payload: bytes | memoryview = b"") -> bool:
        if self.bans.banned_until and self.is_banned(peer):
            return False
        if self.peers.is_gone(peer) and not isinstance(msg, (m.Hello, m.Goodbye)):
            log.debug("%s to %s, which is gone: not sent", type(msg).__name__, peer[:16])
            return False
        try:
            envelope = codec.encode("", msg)  # (the connection authenticates this node: codec.py)
            await self.host.send(peer, envelope, payload)
            self.count_sent(type(msg).__name__, len(envelope), len(payload))
            return True
        except Exception as e:  # noqa: BLE001 - a dead or unreachable peer: logged, protocol deals with it
            log.warning("send %s to %s failed: %s", type(msg).__name__, self.peers.who(peer), e)
            return False

    def count_sent(self, kind: str, envelope_bytes: int, payload_bytes: int) -> None:
        """Count one frame sent: its lane by whether it has a payload, its bytes envelope plus payload."""
        row = self.sent["payload" if payload_bytes else "ctrl"].setdefault(kind, [0, 0])
        row[0] += 1
        row[1] += envelope_bytes + payload_bytes

    def sent_totals(self) -> dict[str, dict[str, list[int]]]:
        """status.json "sent": a copy of the counters (lane -> message type -> [frames, bytes]), and the DHT
        operations the host started ("dht": kind -> count, hostdht.py), which travel on libp2p's streams."""
        out: dict = {lane: {k: list(v) for k, v in sorted(rows.items())} for lane, rows in self.sent.items()}
        out["dht"] = dict(sorted(getattr(self.host, "dht_ops", {}).items()))
        return out

    def post(self, peer: str, msg: m.Message) -> None:
        """Send in a task of its own (the caller does not wait)."""
        self.spawn(self.send, peer, msg)

    async def send_all(self, peer: str, msgs: list) -> None:
        for msg in msgs:  # in order: a Hello before what depends on it
            await self.send(peer, msg)

    async def send_in_order(self, peer: str, msgs: list) -> int:
        """Send `msgs` in order up to the first that fails; how many went (driver.py's `Outbox` sends the rest
        again: a machine that assumes FIFO links loses no message to a connection that failed)."""
        for i, msg in enumerate(msgs):
            if not await self.send(peer, msg):
                return i
        return len(msgs)

    async def send_tensor(self, peer: str, msg: Any, tensor, *, kept: int | None = None, at=None) -> bool:
        """`msg` with `tensor` after it: dense, its Top-K of `kept` elements, or its elements at the indices `at`
        (model/compression.py)."""
        from dataclasses import replace

        from ...model.tensors import pack, pack_at, pack_topk

        if at is not None:
            header, payload = pack_at(tensor, at)
        else:
            header, payload = pack(tensor) if kept is None else pack_topk(tensor, kept)
        return await self.send(peer, replace(msg, tensor=header), payload)

    def refuse(self, peer: str, why: str, code: m.RefusalCode = m.RefusalCode.INVALID, *, ban: bool = True) -> None:
        """Drop a frame of `peer`: log it, count it under `code`, and ban a peer that keeps sending such (unless
        `ban` is False: a frame this node is not ready for yet, `FrameRefused`)."""
        self.count_refusal(code)
        log.warning("refused frame from %s (%s): %s", self.peers.who(peer), code.name, why)
        if ban and code is not m.RefusalCode.BANNED and self.bans.refused(peer, now()):
            log.warning("peer %s sent %d refused frames within %.0f s: disconnected and banned for %.0f s",
                        self.peers.who(peer), self.bans.limit, self.bans.window_s, self.bans.ban_s)
            self.on_ban(peer)

    def count_refusal(self, code: m.RefusalCode) -> None:
        """Count a refusal that bans no one (a bad DHT record: its holder is not its writer)."""
        self.refused += 1
        self.refused_by[code.name] = self.refused_by.get(code.name, 0) + 1

    def is_banned(self, peer: str) -> bool:
        return self.bans.is_banned(peer, now())

    async def disconnect(self, peer: str) -> None:
        """Close every connection to `peer` (a banned or revoked peer; one presumed dead: after a partition its
        connections stall in TCP's retransmission backoff, and redialled it comes back on new ones)."""
        from libp2p.peer.id import ID

        lp = getattr(self.host, "libp2p", None)
        if lp is None:
            return
        await self.host.drop_streams(peer)
        try:
            with trio.move_on_after(5):
                await lp.disconnect(ID.from_base58(peer))
        except Exception as e:  # noqa: BLE001 - already gone, or the connection broke while closing
            log.debug("disconnecting %s: %r", peer[:16], e)

"""Hole punching (DCUtR): a relayed connection between two nodes behind NAT upgraded to a direct one.

Two nodes behind two home routers first reach each other through a circuit
relay (relay.py).  py-libp2p's `DCUtRProtocol` then tries to replace that
connection by a direct one: over the relayed connection each side tells the
other the address the relay saw it at (its router's WAN address with its own
listen port), both dial each other at the same moment from their listen
port (a TCP simultaneous open), and where both routers keep the source port
and let the answer of an outgoing SYN in, the SYNs cross and a direct
connection exists (../shared/notes/py-libp2p-nat.md: 4 of 4 lab runs in about
1.6 s).  A router that randomises ports, or answers with RST, defeats it:
the connection stays relayed and works on.

What is ours:

* `HolePunching` runs the library's service on a node that needs a relay
  (one that reserved a slot: behind NAT, or firewalled), and counts
  attempts, successes and failures (status.json `reachability.hole_punch`).
* The connection a successful punch made is remembered (`conns`): the
  status calls it "hole-punched" (conninfo.py), not "direct" or "inbound".
* After an upgrade our long-lived streams to that peer (control, libp2p
  payload) still ride on the relayed connection.  `on_upgraded(peer)` is
  called so the host retires them (host.py `rehome_streams`, `retire`
  here): each is closed for writing under its send lock and dropped once
  the peer has read it to the end and closed its side, so no frame is lost
  and none is overtaken; the next frame opens a stream on the direct
  connection (py-libp2p prefers a direct connection for new streams).
* The relayed connection is then closed `RELAY_CLOSE_AFTER_S` (10 s) after
  the upgrade rather than the library's 60 s: nothing of ours uses it.
* Only the end with the smaller peer id starts a hole punch (the library
  starts one from both ends at once, and those collide: `initiate_hole_punch`).
* The library's first step, a plain dial of the peer's known direct
  addresses, is skipped: `Host.connect` did that before taking the relay,
  and it held every upgrade back by its 10 s dial timeout.
* The library gives a peer 3 punches until it reconnects; a connection that
  stays relayed gets another round `RETRY_FIRST_S` after they failed, then
  at doubling intervals up to `RETRY_MAX_S` (`_retry_loop`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import IHost, INetStream
from libp2p.exceptions import BaseLibp2pError
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS, DCUtRProtocol
from libp2p.tools.anyio_service import background_trio_service

from .conninfo import is_relayed

log = logging.getLogger("gwtf.transport")

RETIRE_WAIT_S = 5.0  # a retired stream's frames are read by the peer within this (else it is reset)
# After an upgrade the relayed connection is closed this much later (library: 60 s).  Our streams leave it within
# a round trip (at most RETIRE_WAIT_S); closing it sooner frees the relay's circuit for others.
RELAY_CLOSE_AFTER_S = 10.0
# The library punches a peer at most MAX_HOLE_PUNCH_ATTEMPTS (3) times until it reconnects; a connection that stays
# relayed (the relay's circuit lasts a day) is punched again this long after the last failure, then at twice the
# interval each time, up to RETRY_MAX_S: a router that dropped the punches for a while (its state table full, a
# rule changed, the two punches crossing badly) lets a later one through, and one that never will costs three
# punches every half hour
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 1800.0
RETRY_CHECK_S = 5.0


async def retire(stream: INetStream, wait_s: float = RETIRE_WAIT_S) -> bool:
    """Close `stream` for writing and wait until the peer closes its end, which it does once it has read every
    frame (host.py's reader closes at end of stream): frames written on the next stream cannot overtake them.
    Reset after `wait_s` (a peer that does not close: an older node, a stalled one).  True if the peer closed."""
    done = False
    with trio.move_on_after(wait_s):
        try:
            await stream.close()
            while await stream.read(4096):  # (nothing is sent on it the other way: only the end)
                pass
            done = True
        except StreamEOF:
            done = True
        except (BaseLibp2pError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    if not done:
        with trio.move_on_after(1):
            try:
                await stream.reset()
            except (BaseLibp2pError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
    return done


def _direct_conns(lp: IHost, pid: ID) -> list:
    return [c for c in lp.get_network().connections.get(pid, ()) if not is_relayed(c)]


class _Dcutr(DCUtRProtocol):
    """The library's DCUtR, each hole punch reported to its `HolePunching` (both the side that starts it and
    the side that answers go through `_perform_hole_punch`)."""

    def __init__(self, lp: IHost, owner: HolePunching) -> None:
        super().__init__(lp)
        self.owner = owner

    async def _perform_hole_punch(self, peer_id: ID, addrs, as_responder: bool = False) -> bool:
        before = {id(c) for c in _direct_conns(self.host, peer_id)}
        t0 = trio.current_time()
        self.owner.started(peer_id, [str(a) for a in addrs], as_responder)
        ok = False
        try:
            ok = await super()._perform_hole_punch(peer_id, addrs, as_responder)
        finally:
            made = [c for c in _direct_conns(self.host, peer_id) if id(c) not in before] if ok else []
            self.owner.finished(peer_id, ok, made, trio.current_time() - t0)
        return ok

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        """Only the end with the smaller peer id starts a hole punch; the other answers.  The library's loop
        runs on both ends and starts one from each at the same moment: each end then dials from its listen
        port twice at once, the second dial fails (`[Errno 99] Cannot assign requested address`: the same
        address pair), and where the two dials that got through were upgraded in clashing roles no connection
        comes of it (seen in the lab: all six punches of a pair failed, routers letting them through)."""
        if self.host.get_id().to_bytes() > peer_id.to_bytes():
            return False
        return await super().initiate_hole_punch(peer_id)

    async def _close_relayed_conns_after_grace(self, peer_id: ID, grace: float = RELAY_CLOSE_AFTER_S) -> None:
        await super()._close_relayed_conns_after_grace(peer_id, grace)

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        """Skipped: the library first dials the peer's direct addresses for `dial_timeout` (10 s) before
        punching, which delays every upgrade by those 10 s (measured in the lab) and repeats what
        `Host.connect` did before it took the relay."""
        return False


class HolePunching:
    """DCUtR on one host; `run` until cancelled."""

    def __init__(self, lp: IHost, on_upgraded: Callable[[str], Awaitable[None]]) -> None:
        self.lp = lp
        self.on_upgraded = on_upgraded
        self.service = _Dcutr(lp, self)
        self.conns: weakref.WeakSet = weakref.WeakSet()  # connections made by a hole punch
        self.attempts = 0  # hole punches run (both ends run one; both usually start it at once: two per peer)
        self.upgraded = 0  # direct connections made by them (one per success, whichever punch made it)
        self.failed = 0  # hole punches that ended without a direct connection
        self.retries = 0  # rounds of punches given to a peer after the library's budget was spent
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with background_trio_service(self.service), trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._retry_loop)
            task_status.started()
            await trio.sleep_forever()

    async def _retry_loop(self) -> None:
        """Give a peer whose punches were all spent (the library's budget) another round later (`RETRY_FIRST_S`,
        doubling): the library's loop punches it again once its count is cleared, if still relayed."""
        interval: dict[ID, float] = {}  # peer -> the wait before its next round
        due: dict[ID, float] = {}  # peer -> when its count is cleared
        while True:
            await trio.sleep(RETRY_CHECK_S)
            t = trio.current_time()
            spent = self.service._hole_punch_attempts  # (the library's own count: peer -> punches it started)
            for pid in [p for p in due if spent.get(p, 0) < MAX_HOLE_PUNCH_ATTEMPTS]:
                del due[pid]  # (reconnected: the library cleared it itself)
            for pid, n in list(spent.items()):
                if n < MAX_HOLE_PUNCH_ATTEMPTS or pid in self.service._in_progress:
                    continue
                if pid not in due:
                    due[pid] = t + interval.setdefault(pid, RETRY_FIRST_S)
                elif t >= due[pid]:
                    del due[pid]
                    spent.pop(pid, None)
                    self.retries += 1
                    log.info("hole punch to %s: %d punches failed; trying again (next round after %.0f s more)",
                             pid, n, min(2 * interval[pid], RETRY_MAX_S))
                    interval[pid] = min(2 * interval[pid], RETRY_MAX_S)

    def is_punched(self, conn) -> bool:
        return conn in self.conns

    def started(self, peer_id: ID, addrs: list[str], initiated: bool) -> None:
        self.attempts += 1
        log.info("hole punch to %s (%s): dialling %s", peer_id, "started here" if initiated else "asked by it",
                 ", ".join(addrs) or "no address")

    def finished(self, peer_id: ID, ok: bool, made: list, took: float) -> None:
        if not ok:
            self.failed += 1
            log.info("hole punch to %s failed after %.2f s: the connection stays relayed", peer_id, took)
            return
        direct = _direct_conns(self.lp, peer_id)
        if not made and not any(c in self.conns for c in direct):
            made = direct  # (made before this punch began: by the peer's own)
        made = [c for c in made if c not in self.conns]  # (both punches under way saw it made: moved once)
        log.info("hole punch to %s: direct connection after %.2f s%s", peer_id, took,
                 "" if made else " (made by the other punch under way)")
        if not made:
            return
        self.upgraded += 1
        for c in made:
            self.conns.add(c)
        if self._nursery is not None:
            self._nursery.start_soon(self._rehome, peer_id)

    async def _rehome(self, peer_id: ID) -> None:
        t0 = trio.current_time()
        await self.on_upgraded(peer_id.to_base58())
        streams = {"relayed": 0, "direct": 0}
        for c in self.lp.get_network().connections.get(peer_id, ()):
            streams["relayed" if is_relayed(c) else "direct"] += len(c.get_streams())
        log.info("streams to %s taken off the relayed connection in %.2f s: the next frames open new ones on the "
                 "direct one (streams open now: %s)", peer_id, trio.current_time() - t0, streams)

    def snapshot(self) -> dict:
        """Counts, and for each peer reached by a hole punch the streams open on its relayed and direct
        connections (0 on the relayed one once both ends moved theirs) and how many relayed connections are
        still open (closed `RELAY_CLOSE_AFTER_S` after the upgrade)."""
        peers = {}
        for pid in {c.muxed_conn.peer_id for c in list(self.conns)}:
            row = {"relayed_conns": 0, "relayed_streams": 0, "direct_streams": 0}
            for c in self.lp.get_network().connections.get(pid, ()):
                relayed = is_relayed(c)
                row["relayed_conns"] += relayed
                row["relayed_streams" if relayed else "direct_streams"] += len(c.get_streams())
            peers[pid.to_base58()] = row
        return {"attempts": self.attempts, "upgraded": self.upgraded, "failed": self.failed, "retries": self.retries,
                "peers": peers}


__all__ = ["RELAY_CLOSE_AFTER_S", "RETIRE_WAIT_S", "HolePunching", "retire"]

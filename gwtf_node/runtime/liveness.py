"""Liveness: who is alive is decided by our own messages, never by the DHT.

Every node pings the peers it works with (its stage, the stages before and
after, the data nodes) every `PING_EVERY_S` and presumes dead a peer it heard
nothing from for `DEAD_AFTER_S` (any frame counts, see `Peers.heard`).  A
dead peer is handed to `on_dead`, which forgets it everywhere (routing, flow
machine, aggregation groups, recovery machine, all-reduce in flight).  The
simulator models this check with the same two constants (`sim/train.py`,
DAEMON_DETECT_S).

A peer presumed dead that is heard again says Hello (a restarted node keeps
its peer id): `peer_back` takes it off the presumed-dead list and counts it
as heard from now on; the node re-admits it everywhere (node.py).

A relay with no live data node has nothing to do and would wait without a
word: `loop` logs that it waits for a data node when that starts, then every
`WAITING_LOG_EVERY_S`, and `waiting_for_data_since` (status.json) says since
when.

`exchange` sends one Ping (or a link meter's LinkProbe) and waits for its
Pong; `measure_rtt` takes the best of three Ping/Pong round trips: the latency
term of a link's cost (Equation 1) and a joiner's cost to each stage.
"""

from __future__ import annotations

import logging
import random
from typing import Callable

import trio

from ..protocol import messages as m
from .looplag import LoopLag
from .peers import Peers
from .wire import Wire, now

log = logging.getLogger("gwtf.node")

PING_EVERY_S = 1.0
DEAD_AFTER_S = 6.0
PONG_WAIT_S = 5.0  # a round trip sample is given up after this long
WAITING_LOG_EVERY_S = 30.0  # a relay with no live data node says so this often


class Liveness:
    def __init__(self, wire: Wire, peers: Peers, on_dead: Callable[[str], None],
                 compute_ms: Callable[[], float] = lambda: 0.0) -> None:
        self.wire = wire
        self.peers = peers
        self.on_dead = on_dead
        self.compute_ms = compute_ms  # this node's compute per microbatch, told in each Pong (linkmeter.py)
        self.pongs: dict[int, tuple[trio.Event, list]] = {}  # nonce -> (answered, [the Pong])
        self.waiting_for_data_since: float | None = None  # a relay: no data node alive since then (trio clock)
        self.data_back_at: float | None = None  # ... and when the last such wait ended
        self.dead_at: dict[str, float] = {}  # peers presumed dead by this check (and not back since) -> when
        self._waiting_logged_at: float | None = None
        self.lag = LoopLag()  # this node's event-loop lag (looplag.py), probed while the check runs

    @property
    def crashed(self):
        """The peers presumed dead by this check and not back since."""
        return self.dead_at.keys()

    async def loop(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.lag.loop)
            await self._check_loop()

    async def _check_loop(self) -> None:
        while True:
            await trio.sleep(PING_EVERY_S)
            t = now()
            self._check_data_nodes(t)
            for pid in sorted(self.peers.watched()):
                silent = self.peers.silent_for(pid, t)
                if silent > DEAD_AFTER_S:
                    self._presume_dead(pid, silent)
                elif silent >= PING_EVERY_S:
                    self.wire.post(pid, m.Ping(random.getrandbits(63)))

    def _presume_dead(self, peer: str, silent_s: float) -> None:
        log.warning("peer %s presumed dead: silent for %.1f s", self.peers.who(peer), silent_s)
        self.dead_at[peer] = now()
        self.on_dead(peer)
        self.wire.spawn(self.wire.disconnect, peer)  # (alive after all: the redial opens new connections)

    def peer_back(self, peer: str) -> float | None:
        """`peer` said Hello after it was forgotten: not presumed dead any more, heard now.  Returns when this
        check presumed it dead (None: it did not, e.g. the peer left or forgot this node)."""
        self.peers.heard(peer, now())
        return self.dead_at.pop(peer, None)

    def cut_off_since(self, t: float) -> bool:
        """This relay was without any data node at some time since `t` (trio clock): it was the one cut off."""
        return self.waiting_for_data_since is not None or (self.data_back_at is not None and self.data_back_at >= t)

    def _check_data_nodes(self, t: float) -> None:
        """A placed relay with no data node in its table waits for one: it says so, then every 30 s."""
        if self.peers.role != "relay" or self.peers.stage is None or self.peers.data_nodes():
            if self.waiting_for_data_since is not None:
                log.info("a data node is back after %.0f s without one", t - self.waiting_for_data_since)
                self.data_back_at = t
            self.waiting_for_data_since = self._waiting_logged_at = None
            return
        if self.waiting_for_data_since is None:
            self.waiting_for_data_since = t
        if self._waiting_logged_at is None or t - self._waiting_logged_at >= WAITING_LOG_EVERY_S:
            self._waiting_logged_at = t
            log.warning("waiting for a data node: none alive for %.0f s (training resumes when one comes back)",
                        t - self.waiting_for_data_since)

    def recently_heard(self) -> list[str]:
        """Peers that the check would not presume dead now."""
        return self.peers.heard_within(DEAD_AFTER_S, now())

    async def on_ping(self, peer: str, msg: m.Ping) -> None:
        await self.wire.send(peer, m.Pong(msg.nonce, self.compute_ms()))

    def on_pong(self, peer: str, msg: m.Pong) -> None:
        waiting = self.pongs.get(msg.nonce)
        if waiting is not None:
            waiting[1].append(msg)
            waiting[0].set()

    async def exchange(self, peer: str, msg: m.Ping | m.LinkProbe, payload: bytes = b"",
                       wait_s: float = PONG_WAIT_S) -> tuple[float, m.Pong] | None:
        """Send `msg` (with `payload`) and wait for its Pong: (seconds it took, the Pong), or None."""
        ev, box = trio.Event(), []
        self.pongs[msg.nonce] = (ev, box)
        try:
            t0 = now()
            if not await self.wire.send(peer, msg, payload):
                return None
            with trio.move_on_after(wait_s):
                await ev.wait()
                return now() - t0, box[0]
            return None
        finally:
            self.pongs.pop(msg.nonce, None)

    async def measure_rtt(self, peer: str, tries: int = 3) -> float | None:
        """Best of `tries` round trips to `peer`, in ms (None: no answer)."""
        samples = []
        for _ in range(tries):
            got = await self.exchange(peer, m.Ping(random.getrandbits(63)))
            if got is None:
                break
            samples.append(got[0] * 1000.0)
        return min(samples) if samples else None

"""Liveness: who is alive is decided by our own messages, never by the DHT.

Every node pings the peers it works with (its stage, the stages before and
after, the data nodes) every `PING_EVERY_S` and presumes dead a peer it heard
nothing from for `DEAD_AFTER_S` (any frame counts, see `Peers.heard`).  A
dead peer is handed to `on_dead`, which forgets it everywhere (routing, flow
machine, aggregation groups, recovery machine, all-reduce in flight).  The
simulator models this check with the same two constants (`sim/train.py`,
DAEMON_DETECT_S).

`measure_rtt` takes the best of three Ping/Pong round trips: the latency term
of a link's cost (Equation 1) and a joiner's cost to each stage.
"""

from __future__ import annotations

import logging
import random
from typing import Callable

import trio

from ..protocol import messages as m
from .peers import Peers
from .wire import Wire, now

log = logging.getLogger("gwtf.node")

PING_EVERY_S = 1.0
DEAD_AFTER_S = 6.0
PONG_WAIT_S = 5.0  # a round trip sample is given up after this long


class Liveness:
    def __init__(self, wire: Wire, peers: Peers, on_dead: Callable[[str], None]) -> None:
        self.wire = wire
        self.peers = peers
        self.on_dead = on_dead
        self.pongs: dict[int, trio.Event] = {}
        self.crashed: set[str] = set()  # peers presumed dead by this check

    async def loop(self) -> None:
        while True:
            await trio.sleep(PING_EVERY_S)
            t = now()
            for pid in sorted(self.peers.watched()):
                silent = self.peers.silent_for(pid, t)
                if silent > DEAD_AFTER_S:
                    self._presume_dead(pid, silent)
                elif silent >= PING_EVERY_S:
                    self.wire.post(pid, m.Ping(random.getrandbits(63)))

    def _presume_dead(self, peer: str, silent_s: float) -> None:
        log.warning("peer %s presumed dead: silent for %.1f s", self.peers.who(peer), silent_s)
        self.crashed.add(peer)
        self.on_dead(peer)

    def recently_heard(self) -> list[str]:
        """Peers that the check would not presume dead now."""
        return self.peers.heard_within(DEAD_AFTER_S, now())

    async def on_ping(self, peer: str, msg: m.Ping) -> None:
        await self.wire.send(peer, m.Pong(msg.nonce))

    def on_pong(self, peer: str, msg: m.Pong) -> None:
        ev = self.pongs.get(msg.nonce)
        if ev is not None:
            ev.set()

    async def measure_rtt(self, peer: str) -> float | None:
        """Best of three round trips to `peer`, in ms (None: no answer)."""
        samples = []
        for _ in range(3):
            nonce = random.getrandbits(63)
            ev = trio.Event()
            self.pongs[nonce] = ev
            t0 = now()
            if not await self.wire.send(peer, m.Ping(nonce)):
                break
            with trio.move_on_after(PONG_WAIT_S):
                await ev.wait()
                samples.append((now() - t0) * 1000.0)
            self.pongs.pop(nonce, None)
        return min(samples) if samples else None

"""User-space link emulation: one-way latency and bandwidth per destination peer.

The kernels this runs on need not have netem (the test machine's has not),
so a test swarm on one machine replays a geo-distributed setting by delaying frames in the sender.
Each shaped destination is a *link* with its own FIFO queue and task, so a
slow link never holds up another one.  The model is a store-and-forward
pipe:

    start    = max(enqueue time, time the link finishes serializing the previous frame)
    departed = start + size / bandwidth          (the link is busy until then)
    arrival  = departed + latency                (the frame is written to the socket then)

Arrivals are non-decreasing in queue order, so one task that sleeps until
each arrival and then performs the real write keeps FIFO order while several
frames are "in flight" on a long link.  `submit` returns when the frame has
*departed* (the sender feels the bandwidth limit as back-pressure, like a
full socket buffer) and hands back a `trio.Event` set when the real write
ran; the write's exception, if any, is stored on the `Delivery`.  Latency is
added on top of the real loopback transfer time, which is small next to the
tens of milliseconds of the measured geo links (`data/geo12-links.json`).

A frame travels in a *lane* of its link (`submit(lane=...)`): the daemon sends
control frames and tensor frames over two connections (host.py, "FIFO per
peer and kind"), and gives each its own lane, with its own queue, writer task
and serialization clock.  So a ping is not held behind the real write of a
56 MB gradient (which on a shaped uplink takes seconds) as it would be behind
one queue, and as it is not on a real link, where the two connections share
the uplink and a small frame passes within a round trip or so.  The lanes do
not share the emulated bandwidth: a control frame's few hundred bytes are left
out of the tensor lane's budget.

An unshaped peer (no `set_link`) is not queued at all: `submit` writes
directly.  `LinkShaper.from_scenario` builds a shaper from a scenario's
`{(src, dst): (latency_ms, bandwidth_mbps)}` table for the local node.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

log = logging.getLogger("gwtf.transport")

_LINK_QUEUE_FRAMES = 4096  # frames waiting on one shaped link before submit blocks


@dataclass(frozen=True, slots=True)
class Link:
    latency_ms: float  # one-way
    bandwidth_mbps: float  # megabits per second; inf = unlimited

    def transfer_s(self, nbytes: int) -> float:
        if math.isinf(self.bandwidth_mbps):
            return 0.0
        return nbytes * 8 / (self.bandwidth_mbps * 1e6)


@dataclass(slots=True)
class Delivery:
    """The outcome of one shaped write."""

    done: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None


class LinkShaper:
    """Per-destination latency and bandwidth, applied by the sending host."""

    def __init__(self) -> None:
        self._links: dict[str, Link] = {}
        self._queues: dict[tuple[str, str], trio.MemorySendChannel] = {}  # (peer, lane) -> its queue
        self._busy_until: dict[tuple[str, str], float] = {}
        self._nursery: trio.Nursery | None = None

    @classmethod
    def from_scenario(
        cls,
        scenario_links: Mapping[tuple[str, str], tuple[float, float]],
        me: str,
        peer_of_name: Mapping[str, str],
    ) -> LinkShaper:
        """Links from node `me` (a name) to every named peer, keyed by their peer ids."""
        shaper = cls()
        for (src, dst), (latency_ms, bandwidth_mbps) in scenario_links.items():
            if src == me and dst in peer_of_name:
                shaper.set_link(peer_of_name[dst], latency_ms, bandwidth_mbps)
        return shaper

    def set_link(self, peer_id: str, latency_ms: float, bandwidth_mbps: float = math.inf) -> None:
        if latency_ms < 0 or not bandwidth_mbps > 0:
            raise ValueError(
                f"link to {peer_id}: latency {latency_ms} ms must be >= 0 and bandwidth "
                f"{bandwidth_mbps} Mbit/s must be > 0"
            )
        self._links[peer_id] = Link(float(latency_ms), float(bandwidth_mbps))

    def link(self, peer_id: str) -> Link | None:
        return self._links.get(peer_id)

    def attach(self, nursery: trio.Nursery) -> None:
        """Run link tasks in `nursery` (the host does this when it starts)."""
        self._nursery = nursery

    def detach(self) -> None:
        self._nursery = None
        for send in self._queues.values():
            send.close()
        self._queues.clear()

    async def submit(self, peer_id: str, nbytes: int, write: Callable[[], Awaitable[None]],
                     lane: str = "data") -> Delivery:
        """Schedule `write` after the link's delay, in order within `lane` (module doc); returns once the frame
        has departed."""
        delivery = Delivery()
        link = self._links.get(peer_id)
        if link is None:
            try:
                await write()
            except BaseException as e:  # handed to the caller through the Delivery
                delivery.error = e
                delivery.done.set()
                raise
            delivery.done.set()
            return delivery
        if self._nursery is None:
            raise RuntimeError("LinkShaper used outside a running host (attach() was not called)")
        key = (peer_id, lane)
        queue = self._queues.get(key)
        if queue is None:
            queue, receive = trio.open_memory_channel(_LINK_QUEUE_FRAMES)
            self._queues[key] = queue
            self._nursery.start_soon(self._run_link, peer_id, receive)
        now = trio.current_time()
        start = max(now, self._busy_until.get(key, now))
        departed = start + link.transfer_s(nbytes)
        self._busy_until[key] = departed
        await queue.send((departed + link.latency_ms / 1000.0, write, delivery))
        await trio.sleep_until(departed)
        return delivery

    async def _run_link(self, peer_id: str, receive: trio.MemoryReceiveChannel) -> None:
        async with receive:
            async for arrival, write, delivery in receive:
                await trio.sleep_until(arrival)
                try:
                    await write()
                except Exception as e:  # a failed write is reported on the Delivery and logged
                    delivery.error = e
                    log.warning("shaped send to %s failed: %s", peer_id, e)
                finally:
                    delivery.done.set()

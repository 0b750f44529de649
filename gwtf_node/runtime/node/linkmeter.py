"""Equation 1 from measurements: latency, bandwidth and compute time of each flow link, measured again and again.

    d(i, j) = (c_i + c_j)/2 + (lat_ij + lat_ji)/2 + 2*size/(bw_ij + bw_ji)

The upstream end of a flow link owns its cost (`flows.py`, `LinkCost`), so
it is the upstream end that measures:

* latency: the best of two Ping / Pong round trips (`Liveness.measure_rtt`), halved (both directions are
  taken as equal: one round trip cannot tell them apart);
* bandwidth: a timed transfer, `LinkProbe` with `PROBE_BYTES` of payload
  answered by a Pong; its time less one round trip is the payload's transfer
  time.  Then the real traffic: every gradient of at least
  `OBSERVE_MIN_BYTES` that comes back from the peer on the tensor channel,
  timed from its first to its last byte (`observe`; channel.py
  `TimedPayload`; a payload over the libp2p connection is not timed).  The
  link is taken as symmetric (bw_ij = bw_ji): the probe goes one way, the
  gradients the other.  Samples are smoothed (`EWMA_WEIGHT`), the bandwidth as
  its inverse (the time per megabit, which is what Equation 1 adds up: a
  mean of 10,000 and 0.5 Mbit/s would be 5,000);
* compute: c_i is this node's compute per microbatch (`LocalStage.compute_ms`,
  from its own forward and backward passes); c_j comes in the peer's Pong.
  Two nodes on one machine (the peer reached over loopback: a local swarm)
  share its processors, so their compute times measure the machine's
  contention of the moment, not the nodes: such a link leaves them out.

`sample` measures one link (at formation: `Flows.form`; for a newcomer:
`Flows._add_neighbour`); `Flows.remeasure_loop` measures every next-stage link
again each `REMEASURE_EVERY_S` and re-forms the flows over a link whose cost
moved by more than `recost_threshold` in two measurements in a row, the same
way (`FlowNode.recost`; both ends agree through `LinkCost(reform=True)`): one
slow probe or one slow computation on a busy machine moves no flow.  Links declared with `--links` (an
emulated setting: the declared values are the truth) are not measured.  A link to a peer on this machine (its
connection comes from loopback: a local swarm) is measured once, at formation, and not again
(`on_this_machine`): its round trips and transfers time the machine's scheduling, not a link, and on a machine
with more daemons than cores they swing by hundreds of milliseconds with the load (loopback round trips of
100-1,262 ms in a 26-daemon swarm on 2 cores); re-forming flows on them is churn that loads the machine more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ...protocol import messages as m
from ...protocol.cost import link_cost
from .liveness import Liveness
from ..net.addresses import is_loopback_host
from ..net.peers import Peers
from .stage import LocalStage
from ..net.wire import FrameRefused, Wire

log = logging.getLogger("gwtf.node")

PROBE_BYTES = 256 * 1024  # long enough for the transfer to dominate a home link's round trip at 100 Mbit/s (21 ms)
PROBE_MAX_BYTES = 1 << 20  # a LinkProbe's payload is refused beyond this
PROBE_WAIT_S = 10.0  # a probe's Pong is given up after this long (256 KiB at 0.2 Mbit/s)
REMEASURE_EVERY_S = 10.0  # each next-stage link is measured again this often
EWMA_WEIGHT = 0.5  # a new bandwidth / latency sample's weight: two samples move a step change three quarters
# A link is re-costed (its flows re-formed) when its cost moves by more than this fraction of the cost in use AND by
# more than RECOST_MIN_MS: re-forming moves units while microbatches travel on them, so the noise of loopback and
# LAN round trips (a millisecond that doubles) and of compute times on a loaded machine must not trigger it, while
# a link throttled from 100 to 10 Mbit/s (a 1 MB activation: +720 ms) or a GPU that became twice as slow does.
RECOST_RELATIVE = 0.5
RECOST_MIN_MS = 20.0
# a payload of the real traffic shorter than this says more about scheduling than about the link (as the probe)
OBSERVE_MIN_BYTES = PROBE_BYTES
MIN_TRANSFER_S = 1e-4  # a probe faster than one round trip (loopback jitter) counts as this much transfer time
MAX_BANDWIDTH_MBPS = 100_000.0  # what a probe on loopback can claim at most


@dataclass
class LinkSample:
    """What was measured of one link (status.json `link_measurements`)."""

    rtt_ms: float
    bandwidth_mbps: float | None  # None: the probe was not answered
    peer_compute_ms: float
    observed: int = 0  # payloads of the real traffic folded into the bandwidth since the first sample (`observe`)


def smoothed_bandwidth(old: float | None, new: float | None) -> float | None:
    """The EWMA of a link's bandwidth, taken over its inverse (module doc); either may be missing."""
    if new is None or old is None:
        return old if new is None else new
    return 1.0 / (EWMA_WEIGHT / new + (1 - EWMA_WEIGHT) / old)


def recost_threshold(old: float, new: float) -> int:
    """+1 / -1 if a link whose cost in use is `old` and now measures `new` moved past the threshold up / down, else
    0."""
    if abs(new - old) <= max(RECOST_RELATIVE * old, RECOST_MIN_MS):
        return 0
    return 1 if new > old else -1


class LinkMeter:
    def __init__(self, wire: Wire, peers: Peers, liveness: Liveness, stage: LocalStage) -> None:
        self.wire = wire
        self.peers = peers
        self.liveness = liveness
        self.stage = stage
        self.samples: dict[str, LinkSample] = {}  # peer -> the smoothed measurement

    async def on_probe(self, peer: str, msg: m.LinkProbe, payload) -> None:
        if payload is not None and len(payload) > PROBE_MAX_BYTES:
            raise FrameRefused(f"LinkProbe of {len(payload)} bytes: at most {PROBE_MAX_BYTES}")
        await self.wire.send(peer, self.liveness.pong(msg.nonce))

    async def sample(self, peer: str) -> LinkSample | None:
        """Measure the link to `peer` once (the best of two round trips, one probe) and fold it into the smoothed
        measurement; None if `peer` does not answer."""
        rtt_ms = await self.liveness.measure_rtt(peer, tries=2)
        if rtt_ms is None:
            return None
        got = await self.liveness.exchange(peer, m.LinkProbe(self.liveness.new_nonce()), bytes(PROBE_BYTES),
                                           wait_s=PROBE_WAIT_S)
        old = self.samples.get(peer)
        bw = None
        if got is not None:
            transfer = max(got[0] - rtt_ms / 1000.0, MIN_TRANSFER_S)
            bw = min(PROBE_BYTES * 8 / transfer / 1e6, MAX_BANDWIDTH_MBPS)
        if old is not None:
            rtt_ms = EWMA_WEIGHT * rtt_ms + (1 - EWMA_WEIGHT) * old.rtt_ms
            bw = smoothed_bandwidth(old.bandwidth_mbps, bw)
        compute = got[1].compute_ms if got is not None else old.peer_compute_ms if old is not None else 0.0
        s = LinkSample(rtt_ms, bw, compute, old.observed if old is not None else 0)
        self.samples[peer] = s
        return s

    @property
    def observed(self) -> int:
        """Payloads of the real traffic folded into the links measured now (`observe`)."""
        return sum(s.observed for s in self.samples.values())

    def observe(self, peer: str, nbytes: int, seconds: float | None) -> None:
        """A payload of `nbytes` came from `peer` over `seconds` (first to last byte, channel.py `TimedPayload`):
        folded into the link's bandwidth like a probe, if the link is measured (a next-stage peer whose gradients
        these are; the link is taken as symmetric) and the payload is at least `OBSERVE_MIN_BYTES`."""
        s = self.samples.get(peer)
        if s is None or seconds is None or nbytes < OBSERVE_MIN_BYTES:
            return
        bw = min(nbytes * 8 / max(seconds, MIN_TRANSFER_S) / 1e6, MAX_BANDWIDTH_MBPS)
        self.samples[peer] = replace(s, bandwidth_mbps=smoothed_bandwidth(s.bandwidth_mbps, bw),
                                     observed=s.observed + 1)

    def on_this_machine(self, peer: str) -> bool:
        """Whether `peer`'s connection is known to come from loopback (module doc: not measured again)."""
        remote = getattr(self.wire.host, "remote_host", None)
        host = remote(peer) if remote is not None else None
        return host is not None and is_loopback_host(host)

    def cost(self, peer: str, size_mb: float, default_bandwidth_mbps: float) -> float | None:
        """Equation 1 for the link to `peer` from its measurement (None: never measured)."""
        s = self.samples.get(peer)
        if s is None:
            return None
        lat = s.rtt_ms / 2.0
        bw = s.bandwidth_mbps or default_bandwidth_mbps
        local = getattr(self.wire.host, "peer_is_local", lambda p: False)(peer)
        mine, theirs = (0.0, 0.0) if local else (self.stage.compute_ms(), s.peer_compute_ms)
        return round(link_cost(mine, theirs, lat, lat, bw, bw, size_mb), 3)

    def snapshot(self) -> dict[str, dict]:
        """status.json: the measurement of each link, by peer name."""
        out = {}
        for pid, s in sorted(self.samples.items()):
            out[self.peers.who(pid)] = {
                "rtt_ms": round(s.rtt_ms, 3),
                "bandwidth_mbps": None if s.bandwidth_mbps is None else round(s.bandwidth_mbps, 1),
                "peer_compute_ms": round(s.peer_compute_ms, 3),
                "payloads_observed": s.observed,
            }
        return out

"""The Top-K ratio of each link this node sends activations and gradients on (the manifest's `train.compression`).

The run's manifest names the compression (`none`, `topk`, `adatopk`) and the
ratio r, so every node of a run applies the same rule (`model/adatopk.py`).
The sender decides the ratio of each tensor it sends; the receiver learns k
from the tensor header and needs no ratio of its own.

For `adatopk`, Equation 7 needs the transfer time R_i of this link and the
largest R_p over the links of the pipeline.  A tensor of the run has one size
on every link, so both come from the bandwidths:

* a link of the links table (`--links`: the emulated or configured latency
  and bandwidth between named nodes) uses its bandwidth;
* any other link uses `flows.DEFAULT_BANDWIDTH_MBPS`, as the cost model does
  (the daemon measures round trips, not bandwidths).

The pipeline's links are the pairs of known nodes of adjacent stages (a data
node and a stage-0 relay, stage k and k+1, the last stage and a data node),
in both directions (activations go one way, gradients the other).  Without a
links table every link has the default bandwidth, so every link gets the
slowest link's ratio c*r: AdaTopK then degenerates to uniform Top-K at c*r.

The gradient of an activation that came Top-K sparse goes back at that
activation's indices when the manifest says `compression_gradients = aligned`
(the default; `microbatches.py` keeps the indices); only the other tensors
follow the link's ratio here.

The ratio of each peer is cached until the peer table changes
(`Peers.last_change`), and logged once per peer and ratio.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ...model.adatopk import (
    Compression, Gradients, kept_count, link_ratio, pipeline_link, sparse_overhead, transfer_s,
)
from ...model.precision import wire_bytes
from .flows import DEFAULT_BANDWIDTH_MBPS
from ..net.peers import Peers

log = logging.getLogger("gwtf.node")


class LinkCompression:
    def __init__(self, manifest: Any, peers: Peers, links_cfg: dict[tuple[str, str], tuple[float, float]]) -> None:
        train = manifest.train
        self.compression = Compression(train.compression)
        self.ratio = float(train.compression_ratio)
        self.gradients = Gradients(train.compression_gradients)
        self.value_bytes = wire_bytes(train.wire_dtype)  # the ratio rule's overhead c: values of the wire dtype
        self.peers = peers
        self.links_cfg = links_cfg
        self._cache: dict[str, float] = {}
        self._cache_stamp: tuple | None = None
        self._logged: dict[str, float] = {}
        self.dense_bytes = 0  # what the tensors sent would have taken dense
        self.sent_bytes = 0  # what they took
        self.aligned_sent = 0  # gradients sent at their activation's indices

    @property
    def enabled(self) -> bool:
        return self.compression is not Compression.NONE

    @property
    def aligned(self) -> bool:
        """A gradient of an activation that came Top-K goes back at the activation's indices."""
        return self.enabled and self.gradients is Gradients.ALIGNED

    # ------------------------------------------------------------------ links
    def _bandwidth(self, a_name: str, b_name: str) -> float:
        shaped = self.links_cfg.get((a_name, b_name))
        return shaped[1] if shaped is not None else DEFAULT_BANDWIDTH_MBPS

    def _nodes(self) -> list[tuple[str, str, int]]:
        """(peer id, name, stage) of every node known, this one included; data nodes at stage -1."""
        out = []
        me_stage = -1 if self.peers.role == "data" else self.peers.stage
        if me_stage is not None:
            out.append((self.peers.me, self.peers.name, me_stage))
        for p in self.peers.infos():
            if p.role == "data":
                out.append((p.peer_id, p.name, -1))
            elif p.role == "relay" and p.stage is not None and p.stage >= 0:
                out.append((p.peer_id, p.name, p.stage))
        return out

    def slowest_bandwidth(self) -> float:
        """The lowest bandwidth among the pipeline's links between known nodes (max_p R_p of Equation 7)."""
        last = self.peers.n_stages - 1
        nodes = self._nodes()
        lowest = math.inf
        for _, a, sa in nodes:
            for _, b, sb in nodes:
                if pipeline_link(sa, sb, last) and a and b:
                    lowest = min(lowest, self._bandwidth(a, b), self._bandwidth(b, a))
        return lowest

    def link_ratio(self, peer: str) -> float:
        """The ratio of the link to `peer` (1.0: dense)."""
        if not self.enabled:
            return 1.0
        stamp = (self.peers.last_change, len(self.peers.peers))
        if stamp != self._cache_stamp:
            self._cache, self._cache_stamp = {}, stamp
        r = self._cache.get(peer)
        if r is None:
            info = self.peers.get(peer)
            bw = self._bandwidth(self.peers.name, info.name) if info is not None else DEFAULT_BANDWIDTH_MBPS
            slowest = self.slowest_bandwidth()
            slowest = bw if math.isinf(slowest) else min(slowest, bw)
            # the tensor size cancels out of R_i / max R_p: one byte stands for it
            r = link_ratio(self.compression, self.ratio, transfer_s(1, bw), transfer_s(1, slowest),
                           sparse_overhead(self.value_bytes))
            self._cache[peer] = r
            if self._logged.get(peer) != r:
                self._logged[peer] = r
                log.info("compression %s to %s: ratio %.2f (link %.0f Mbit/s, slowest %.0f Mbit/s)",
                         self.compression.value, self.peers.who(peer), r, bw, slowest)
        return r

    def kept(self, peer: str, tensor: Any) -> int | None:
        """Elements of `tensor` to keep on the link to `peer`, or None to send it dense."""
        if not self.enabled or not tensor.is_floating_point():
            return None
        return kept_count(tensor.numel(), self.link_ratio(peer), tensor.element_size())

    def count(self, dense_bytes: int, sent_bytes: int, *, aligned: bool = False) -> None:
        self.dense_bytes += dense_bytes
        self.sent_bytes += sent_bytes
        self.aligned_sent += aligned

    def stats(self) -> dict:
        """status.json's `compression`: the rule, the ratio per peer, bytes sent against their dense size."""
        return {"method": self.compression.value, "ratio": self.ratio, "gradients": self.gradients.value,
                "dense_bytes": self.dense_bytes, "sent_bytes": self.sent_bytes, "aligned_sent": self.aligned_sent,
                "link_ratios": {self.peers.who(p): round(r, 3) for p, r in sorted(self._cache.items())}}

"""Which Top-K ratio each link uses: uniform Top-K, or FusionLLM's AdaTopK rule (section 5.2, Equation 7).

Theory of operation
-------------------
Top-K sparsification (FusionLLM section 5.1, `compression.py`) sends the k
largest-magnitude elements of an activation or of its gradient, with their
indices, and the receiver rebuilds the dense tensor with zeros elsewhere.  A
*ratio* r keeps k = ceil(n / r) of n elements.

* `topk` (uniform Top-K, the paper's baseline): every link uses the run's
  ratio r.
* `adatopk`: each link i gets its own ratio by Equation 7,

      r_i = max(1, c * r * R_i / max_p R_p)

  where R_i is the link's estimated communication time of the original
  (dense) tensor and the max runs over the links of the pipeline.  The
  slowest link gets c*r, a link k times faster gets c*r/k, and links more
  than c*r times faster than the slowest get 1 (no compression).  c is the
  size overhead of the sparse encoding, bytes per kept element over bytes
  per dense element: the paper's 3 comes from float32 values with int64
  indices; here indices are int32, so c = (4 + 4) / 4 = 2 for float32
  (`sparse_overhead`), and c = (2 + 4) / 2 = 3 for bfloat16 values (a
  run whose `train.wire_dtype` is bf16, `precision.py`).  With that c, every compressed link ends up with the
  same transfer time, R_max / r: the slowest link's time divided by the
  user's ratio.

Choices where the paper is silent or where this system differs:

* R_i is the *transfer* time, size / bandwidth, without the latency: Equation
  8 writes the compressed time as c * R_p / r_i, which holds only for the
  part of the time that scales with the bytes.  Since every link of a run
  carries tensors of one size, the rule depends only on the bandwidths.
* A ratio at or below c would make the sparse payload at least as large as the
  dense one (the paper's max(1, ...) still sends k = n/r_i elements at c times
  the bytes); such a link sends the dense tensor instead (`kept_count`).
* FusionLLM's scheduler knows every link.  Here the sender of a tensor
  decides its ratio from the links it knows (the emulated or configured link
  table, `runtime/node/linkcompress.py`); the receiver reads k from the header, so
  nodes need not agree on the ratios for the tensors to decode.
* No error feedback: FusionLLM sends the Top-K of each tensor and drops the
  rest (Figure 6, "other elements are left as 0"), and so does this module.
  Error feedback (adding the dropped residual to the next tensor sent) suits
  gradients of the same parameters step after step; the tensors here are the
  activations of different microbatches, whose residuals do not belong to
  the next microbatch.
* The gradient of a Top-K activation: `Gradients` says how it travels back
  and why `aligned` is the default.

This module is pure Python (no torch): the manifest imports `Compression`.
"""

from __future__ import annotations

import enum
import math

INDEX_BYTES = 4  # int32 indices (a tensor of a microbatch has far fewer than 2**31 elements)
DEFAULT_RATIO = 10.0  # the run's ratio r when the manifest names a compression but no ratio


class Compression(str, enum.Enum):
    """The manifest's `train.compression`: what the tensor channel does to activations and their gradients."""

    NONE = "none"  # dense tensors on every link (the decentralized == centralized invariant holds exactly)
    TOPK = "topk"  # Top-K with the run's ratio on every link (FusionLLM's uniform baseline)
    ADATOPK = "adatopk"  # Top-K with the per-link ratio of Equation 7: only links slower than the fastest


class Gradients(str, enum.Enum):
    """The manifest's `train.compression_gradients`: how the gradient of a Top-K activation travels back.

    FusionLLM compresses the gradients with Top-K of their own (`topk`): the receiver of a sparse activation computes
    the gradient of its dense rebuild, keeps that gradient's largest elements
    at the link's ratio, and the sender back-propagates them through every
    element of its output, those it dropped included.  The default here
    (`aligned`) sends the gradient at the indices of the activation it belongs
    to: the elements the sender dropped never reached the receiver, so their
    gradient through the sparsified link is zero, and the kept ones carry the
    exact gradient.  Training then follows the exact gradient of the network
    it evaluates (the forward pass with the Top-K in it), at the same k and
    the same bytes as the activation.  On the benchmark's model (hidden 128,
    1 data node, 2 stages, the ratios Equation 7 gives on geo12 with the data
    node's links the slowest: 20x into stage 0, 18.8x out of the last stage,
    the stage-to-stage link dense), centralized training with the Top-K at the
    crossings (`scripts/bench_compression.py --centralized`, 100 iterations)
    ends 29 % above the dense loss with `topk` gradients, which stop the
    descent after about 40 iterations, and 0.7 % below it with `aligned`
    ones (within 2 % from iteration 69 on; uniform Top-K at 10x: 1.6 %
    below).  A gradient whose activation came dense follows the link's ratio.
    """

    ALIGNED = "aligned"  # at the activation's own indices: the exact gradient through the sparsified link
    TOPK = "topk"  # its own Top-K at the link's ratio (FusionLLM)


def sparse_overhead(value_bytes: int, index_bytes: int = INDEX_BYTES) -> float:
    """c of Equation 7: bytes per kept element (value and index) over bytes per dense element."""
    return (value_bytes + index_bytes) / value_bytes


def adaptive_ratio(link_s: float, slowest_s: float, ratio: float, overhead: float) -> float:
    """Equation 7: r_i = max(1, c * r * R_i / max_p R_p) for a link of transfer time `link_s`."""
    if slowest_s <= 0 or link_s <= 0:
        return 1.0
    return max(1.0, overhead * ratio * link_s / slowest_s)


def link_ratio(compression: Compression, ratio: float, link_s: float, slowest_s: float, overhead: float) -> float:
    """The ratio a link uses under `compression` (1.0: dense)."""
    if compression is Compression.NONE:
        return 1.0
    if compression is Compression.TOPK:
        return ratio
    return adaptive_ratio(link_s, slowest_s, ratio, overhead)


def pipeline_link(stage_a: int, stage_b: int, last: int) -> bool:
    """Whether a tensor goes from a node of `stage_a` to one of `stage_b` (data nodes at -1): the data nodes into
    stage 0, stage k into k + 1, the last stage into the data nodes (the links of P in Equation 7's max)."""
    return (stage_a == -1 and stage_b == 0) or (stage_a >= 0 and stage_b == stage_a + 1) \
        or (stage_a == last and stage_b == -1)


def kept_count(numel: int, ratio: float, value_bytes: int, index_bytes: int = INDEX_BYTES) -> int | None:
    """Elements a Top-K of `ratio` keeps of `numel`, or None when the dense tensor is not larger (send it dense)."""
    if numel == 0 or ratio <= 1.0:
        return None
    k = max(1, math.ceil(numel / ratio))
    if k * (value_bytes + index_bytes) >= numel * value_bytes:
        return None
    return k


def transfer_s(nbytes: float, bandwidth_mbps: float) -> float:
    """R_i of a link: seconds to send `nbytes` at `bandwidth_mbps` megabits per second."""
    if math.isinf(bandwidth_mbps):
        return 0.0
    return nbytes * 8 / (bandwidth_mbps * 1e6)

"""A part's linear layers with their weight gradients kept as factors until they are counted.

A node holds each microbatch's parameter gradients apart until it is known
to count (`StageModel.backward(hold=True)`, `head_loss(hold=True)`: crash
recovery may give the attempt up meanwhile).  Almost all of a decoder
layer's parameters are the weights of its linear layers (nn.Linear; GPT-2's
Conv1D), and the data part's largest is its LM head (vocabulary x hidden:
113 MB for 49,152 x 576).  A linear weight's gradient is one matrix product
of two much smaller tensors: the gradient of the layer's output [N, out] and
its input [N, in], N = B T tokens.  At 32 tokens a 576 x 1536 projection's
factors are 67k values against 885k, so a microbatch held as factors costs a
tenth of its gradients.

`LinearFactors` replaces the `forward` of each such layer of a part (the
instance's, so parameter names stay those of the HF model).  Outside a
`recording` a layer computes as before.  Inside one, it computes with a
detached copy of its weight in the compute dtype (under autocast the
bfloat16 cast autocast makes, cast once per weight and reused until the
weight changes, where autocast made one per forward and every microbatch's
graph kept its own; in float32 the weight itself) and its input cast as
autocast casts it (a cast per layer, as autocast does: the input's gradient
sums the layers' in float32), and notes the input and its output.  Layers
reading one input one after the other (q, k and v; gate and up) note one cast
of it.  So autograd computes no weight gradient: the backward (`grads`) asks
autograd for the gradients of the part's input, of the other parameters
(norms, biases, embeddings) and of each noted output, and returns each
linear weight's gradient as a `Factors`, multiplied out when it is added (or
at once where the factors take more memory than the weights: long
sequences).  A relay adds what it holds at the aggregation (`add_all`):
consecutive microbatches' factors concatenated into one product per chunk.

The operations are those of the layer's own forward under autocast on the
same operands, and `Factors.product` is the matrix product autograd computes
for a weight (`mm_mat2_backward`: `dy^T @ x` for nn.Linear's transposed use,
`x^T @ dy` for Conv1D), so activations, input gradients and every parameter
gradient have the same bits (tests/model/test_linearfactors.py and
test_headgrad.py compare them with autograd's, per family, in float32 and
under autocast); a chunk's product sums its microbatches in another order,
and the centralized reference adds its relays' microbatches the same way.  A layer
read twice in one forward would need the two products summed as autograd
sums them: `grads` refuses it (no family here does).
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_local = threading.local()


@dataclass(frozen=True)
class Factors:
    """A linear layer's weight gradient as its factors: `grad_out` [N, V] and `inp` [N, H] (the layer's input in the
    dtype it computed in).  `transposed`: the weight is stored [H, V] (GPT-2's Conv1D), its gradient `inp^T @
    grad_out`."""

    grad_out: torch.Tensor
    inp: torch.Tensor
    transposed: bool = False

    @property
    def nbytes(self) -> int:
        return self.grad_out.numel() * self.grad_out.element_size() + self.inp.numel() * self.inp.element_size()

    def product(self) -> torch.Tensor:
        """The weight's gradient in float32, [V, H] ([H, V] transposed): what autograd computes for it."""
        return self.computed().float()

    def computed(self) -> torch.Tensor:
        """The weight's gradient in the factors' dtype (the compute dtype), as autograd computes it."""
        if self.transposed:
            return self.inp.t().mm(self.grad_out)
        return self.grad_out.t().mm(self.inp)


def add_all(acc: torch.Tensor, grads: list) -> None:
    """Add one parameter's gradients of several microbatches (`grads`, in order; tensors, `Factors` or None) to
    `acc`: each tensor as it comes, a run of consecutive `Factors` concatenated along the tokens into one product
    per chunk, a chunk as long as its concatenation stays within the product's float32 bytes (at least one).  One
    product of many tokens is about twice as fast on a CPU as one per microbatch (scripts/bench_commit.py), and
    a chunk rounds its sum once in the compute dtype where the products rounded each microbatch's.  The chunks
    depend only on `grads`: the centralized reference, committing the same keys in the same order, computes the
    same bits (model/reference.py)."""
    run: list[Factors] = []
    size = 0  # the run's bytes

    def flush() -> None:
        nonlocal size
        if run:
            f = run[0] if len(run) == 1 else Factors(torch.cat([r.grad_out for r in run]),
                                                     torch.cat([r.inp for r in run]), run[0].transposed)
            acc.add_(f.computed())  # (added in float32 as it is read: no float32 copy of the product)
            run.clear()
            size = 0

    for g in grads:
        if not isinstance(g, Factors):
            flush()
            if g is not None:
                acc.add_(g.float())
            continue
        if run and size + g.nbytes > 4 * acc.numel():
            flush()
        run.append(g)
        size += g.nbytes
    flush()


def materialized(g: torch.Tensor | Factors | None) -> torch.Tensor | None:
    """A parameter gradient as float32, a `Factors` multiplied out."""
    if g is None:
        return None
    return g.product() if isinstance(g, Factors) else g.float()


def _is_conv1d(m: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2): a linear layer whose weight is stored [in, out]."""
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf")


@dataclass
class Recording:
    """What one forward of the part noted: per factored layer call (layer, the input as computed, its output)."""

    owner: "LinearFactors"
    calls: list = field(default_factory=list)
    last: tuple | None = None  # (the last layer's input, its cast as noted), while the forward runs

    def note(self, layer: nn.Module, x: torch.Tensor, xc: torch.Tensor, y: torch.Tensor) -> None:
        if self.last is not None and self.last[0] is x:  # the same input as the layer before: one cast noted
            xc = self.last[1]
        self.last = (x, xc)
        self.calls.append((layer, xc, y))


class LinearFactors:
    """The factored linear layers of one part (module doc)."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter]) -> None:
        index = {id(p): i for i, p in enumerate(params)}
        self.index: dict[int, int] = {}  # id(layer) -> the index of its weight in `params`
        for sub in module.modules():
            conv = _is_conv1d(sub)
            if not (isinstance(sub, nn.Linear) or conv) or id(sub.weight) not in index:
                continue
            self.index[id(sub)] = index[id(sub.weight)]
            method = self._forward_conv1d if conv else self._forward_linear
            sub.forward = functools.partial(method, sub, sub.forward)
        self.factored = frozenset(self.index.values())
        self.weight_bytes = 4 * sum(params[i].numel() for i in self.factored)  # the float32 gradients they replace
        self._casts: dict[int, tuple[int, torch.dtype, torch.Tensor]] = {}  # id(weight) -> (version, dtype, copy)

    @contextmanager
    def recording(self) -> Iterator[Recording]:
        """Factored layers called in this thread inside the block compute as the module doc says and are noted."""
        prev = getattr(_local, "rec", None)
        _local.rec = rec = Recording(self)
        try:
            yield rec
        finally:
            _local.rec = prev
            rec.last = None

    def forget_casts(self) -> None:
        """Let go of the weights' compute-dtype copies (they are made again from the weights on the next forward)."""
        self._casts.clear()

    @property
    def cast_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for _v, _d, t in self._casts.values())

    def grads(self, rec: Recording, out: torch.Tensor, inp: torch.Tensor, params: list[nn.Parameter],
              grad_out: torch.Tensor | None, *, hold: bool) -> tuple[torch.Tensor, list]:
        """(gradient of `inp`, the gradients of `params` in order) of `out` recorded in `rec` for `grad_out` (None: a
        scalar loss); a factored weight's a `Factors` where `hold` and the factors are smaller than the gradients,
        else float32."""
        layers = [self.index[id(layer)] for layer, _x, _y in rec.calls]
        if len(set(layers)) != len(layers):
            raise RuntimeError("a factored linear layer ran twice in one forward: its gradient would be a sum")
        rest = [i for i in range(len(params)) if i not in self.factored]
        got = torch.autograd.grad(out, [inp, *(params[i] for i in rest), *(y for _l, _x, y in rec.calls)],
                                  grad_out, allow_unused=True)
        grads: list = [None] * len(params)
        for i, g in zip(rest, got[1:1 + len(rest)]):
            grads[i] = g
        factors = []
        for (layer, x, _y), i, dy in zip(rec.calls, layers, got[1 + len(rest):]):
            if dy is not None:
                grads[i] = Factors(dy.detach().reshape(-1, dy.shape[-1]), x.detach().reshape(-1, x.shape[-1]),
                                   transposed=_is_conv1d(layer))
                factors.append(grads[i])
        if not hold or _distinct_bytes(factors) >= self.weight_bytes:
            grads = [g.product() if isinstance(g, Factors) else g for g in grads]
        return got[0], grads

    # ---- the layers' forwards ----------------------------------------------------------------------------------

    def _forward_linear(self, layer: nn.Linear, original, x: torch.Tensor) -> torch.Tensor:
        rec = getattr(_local, "rec", None)
        if rec is None or rec.owner is not self:
            return original(x)
        xc, w = self._operands(layer.weight, x)
        y = F.linear(xc, w, layer.bias)
        rec.note(layer, x, xc, y)
        return y

    def _forward_conv1d(self, layer: nn.Module, original, x: torch.Tensor) -> torch.Tensor:
        rec = getattr(_local, "rec", None)
        if rec is None or rec.owner is not self:
            return original(x)
        xc, w = self._operands(layer.weight, x)
        y = torch.addmm(layer.bias, xc.view(-1, xc.size(-1)), w).view(x.size()[:-1] + (layer.nf,))
        rec.note(layer, x, xc, y)
        return y

    def _operands(self, weight: nn.Parameter, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(`x` as autocast casts it, the weight detached in the compute dtype)."""
        dev = x.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        if dtype is None or weight.dtype == dtype:
            w = weight.detach()
        else:
            hit = self._casts.get(id(weight))
            if hit is None or hit[0] != weight._version or hit[1] != dtype:
                hit = (weight._version, dtype, weight.detach().to(dtype))
                self._casts[id(weight)] = hit
            w = hit[2]
        if dtype is None or x.dtype in (dtype, torch.float64) or not x.is_floating_point():
            return x, w
        return x.to(dtype), w


def _distinct_bytes(factors: list[Factors]) -> int:
    """Bytes of the tensors the factors hold, each storage once (layers reading one input share its cast)."""
    seen: dict[int, int] = {}
    for f in factors:
        for t in (f.grad_out, f.inp):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())

"""Top-K sparsification of a tensor: encode on the sending side, the dense tensor rebuilt on the receiving side.

Theory of operation (FusionLLM section 5.1, Figure 6)
-----------------------------------------------------
`topk_encode(t, k)` keeps the k elements of the flattened tensor with the
largest magnitude and returns their indices (int32, ascending) and their
values (in `t`'s dtype); `topk_decode` scatters the values into a tensor of
zeros of the original shape.  The kept values come back bit for bit; every
dropped element becomes 0, so the error is exactly the dropped part, and
because the dropped elements are the smallest in magnitude,

    ||t - decode(encode(t, k))||^2 <= (1 - k/n) * ||t||^2

(the k largest squares hold at least k/n of the sum).  No error feedback:
what is dropped is lost, as in FusionLLM (`adatopk.py` says why).

`gather(t, indices)` is the same encoding at elements chosen elsewhere: the
gradient of a Top-K activation is sent at the activation's own indices
(`adatopk.Gradients.ALIGNED`), `topk_decode` rebuilds it alike.

On the wire (`tensors.pack_topk` / `tensors.unpack`) the payload is the k
indices as little-endian int32 followed by the k values; the header carries
the dense dtype and shape and `sparse_kept = k`.  Indices are sorted so that
the receiver checks them in one pass (strictly increasing, first >= 0, last
< n) and a duplicate or out-of-range index from a peer is refused, not
scattered.

The encoding is applied to floating-point tensors only: activations and
their gradients.  Ties in magnitude are broken by `torch.topk`, so the
choice among equal elements is deterministic for a given input on a given
build.
"""

from __future__ import annotations

import torch

INDEX_DTYPE = torch.int32


class SparseError(ValueError):
    """Indices and values that do not describe a Top-K of a tensor of the given shape; says what is wrong."""


def topk_encode(t: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (int32, ascending, into the flattened tensor) and values of the k largest-magnitude elements."""
    if not t.is_floating_point():
        raise SparseError(f"Top-K applies to floating-point tensors, not {t.dtype}")
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if not 0 < k <= n:
        raise SparseError(f"cannot keep {k} of {n} elements")
    idx = torch.topk(flat.abs(), k, largest=True, sorted=False).indices
    idx, _ = torch.sort(idx)
    return idx.to(INDEX_DTYPE), flat[idx].contiguous()


def gather(t: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The values of the flattened `t` at `indices` (int32, ascending): `t` sparsified at elements chosen
    elsewhere (the gradient of a Top-K activation at that activation's indices)."""
    if not t.is_floating_point():
        raise SparseError(f"Top-K applies to floating-point tensors, not {t.dtype}")
    flat = t.detach().reshape(-1)
    check_indices(indices, flat.numel())
    return flat[indices.to(torch.int64)].contiguous()


def check_indices(indices: torch.Tensor, numel: int) -> None:
    """Refuse indices that are not strictly increasing within [0, numel) (a malformed or hostile payload)."""
    if indices.dim() != 1:
        raise SparseError(f"indices have {indices.dim()} dimensions, expected 1")
    k = indices.numel()
    if k == 0:
        return
    first, last = int(indices[0]), int(indices[-1])
    if first < 0 or last >= numel:
        raise SparseError(f"index out of range: indices span {first}..{last} but the tensor has {numel} elements")
    if k > 1 and not bool((indices[1:] > indices[:-1]).all()):
        raise SparseError("indices are not strictly increasing (duplicated or unsorted)")


def topk_decode(indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The dense tensor of `shape`: `values` at `indices`, zero elsewhere (indices checked first)."""
    numel = 1
    for s in shape:
        numel *= s
    if indices.numel() != values.numel():
        raise SparseError(f"{indices.numel()} indices but {values.numel()} values")
    check_indices(indices, numel)
    out = torch.zeros(numel, dtype=values.dtype, device=values.device)  # (a crossing of a chain on cuda)
    out[indices.to(torch.int64)] = values
    return out.reshape(shape)

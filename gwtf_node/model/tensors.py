"""Tensors on the wire: raw little-endian bytes after a header naming dtype, shape and size.

Theory of operation
-------------------
An activation or gradient travels as a `TensorHeader(dtype, shape, nbytes)`
inside the protobuf message, followed by exactly `nbytes` raw bytes
(DESIGN.md "Runtime choices"): no pickle, nothing that executes, nothing that
allocates before it has been checked.  `unpack` is the gate for bytes from a
peer, so it refuses, with a `TensorError` naming the problem, everything that
is not the tensor the caller expects: an unknown dtype, a negative or
oversized shape, `nbytes` that disagrees with the shape, a payload of another
length, a shape or dtype other than the expected one, and NaN/Inf in a float
tensor (one bad peer must not poison a stage's gradient sum).  The checks on
the header come first and cost nothing; the payload is only then viewed.

Top-K sparse tensors (`pack_topk`, `model/compression.py`): a header with
`sparse_kept = k > 0` announces k int32 indices then k values instead of the
dense bytes; `nbytes` is then k * (4 + itemsize).  `unpack` checks that
size, that k does not exceed the tensor's elements, that the dtype is a float,
and that the indices are strictly increasing and in range, before it
rebuilds the dense tensor; the shape, dtype and finiteness checks then apply
to that dense tensor as to any other.  `sparse_indices` reads back which
elements a checked Top-K payload kept, and `pack_at` sends a tensor at given
indices in the same encoding (the gradient of a Top-K activation travels at
that activation's indices, `model/adatopk.py`).

Activations and their gradients travel in the run's wire dtype
(`precision.py`: float32, or bfloat16 at half the bytes; a Top-K payload's
values likewise, its indices int32), and the receiver passes that dtype as
`expect_dtype`, so a tensor of another dtype is refused like a wrong shape.
The NaN/Inf check applies to bfloat16 as to any float.

Zero copy: `pack` hands out a memoryview of the contiguous CPU tensor;
`unpack` wraps the payload with `torch.frombuffer` when it is writable and
aligned (the tensor then *aliases* the caller's buffer: do not reuse it), else
copies once into a fresh buffer.  Byte order is the host's; every supported
platform (x86-64, arm64) is little-endian, and `pack` refuses otherwise.
"""

from __future__ import annotations

import io
import math
import sys
from typing import Sequence

import torch

from ..protocol.messages import TensorHeader

MAX_TENSOR_BYTES_DEFAULT = 1 << 30  # 1 GiB: far above one microbatch's activations, far below a bad header
MAX_DIMS = 8  # activations are [B, T, H]; a header with more dimensions is malformed

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


class TensorError(ValueError):
    """A tensor from the wire that is refused; the message names the problem."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise TensorError(f"dtype {dtype} cannot travel on the wire; use one of {', '.join(DTYPES)}") from None


def pack(t: torch.Tensor) -> tuple[TensorHeader, memoryview]:
    """Header and raw bytes of `t` (moved to the CPU and made contiguous if needed)."""
    if sys.byteorder != "little":
        raise TensorError("tensors travel little-endian; this host is big-endian")
    name = dtype_name(t.dtype)
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)  # bool: one byte each
    payload = memoryview(raw.numpy()).cast("B")  # the view keeps the tensor alive
    header = TensorHeader(dtype=name, shape=tuple(int(s) for s in t.shape), nbytes=payload.nbytes)
    return header, payload


def pack_topk(t: torch.Tensor, k: int) -> tuple[TensorHeader, memoryview]:
    """Header and payload of the Top-K of `t` (k int32 indices, then k values); the header keeps `t`'s shape."""
    from .compression import topk_encode

    idx, vals = topk_encode(t.detach().to("cpu"), k)
    return _pack_sparse(t, idx, vals)


def pack_at(t: torch.Tensor, indices: torch.Tensor) -> tuple[TensorHeader, memoryview]:
    """Header and payload of `t` at the given `indices` (ascending int32, as a Top-K payload carries them):
    the same encoding as `pack_topk`, with the elements chosen by the caller."""
    from .compression import gather

    return _pack_sparse(t, indices, gather(t.detach().to("cpu"), indices))


def _pack_sparse(t: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> tuple[TensorHeader, memoryview]:
    if sys.byteorder != "little":
        raise TensorError("tensors travel little-endian; this host is big-endian")
    raw = torch.cat([idx.view(torch.uint8), vals.view(torch.uint8)])
    payload = memoryview(raw.numpy()).cast("B")
    header = TensorHeader(dtype=dtype_name(t.dtype), shape=tuple(int(s) for s in t.shape), nbytes=payload.nbytes,
                          sparse_kept=int(idx.numel()))
    return header, payload


class BufferFile(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it (`io.BytesIO` copies a bytearray or
    memoryview): `torch.load` of a stage state received or read whole (model/stages.py) allocates its tensors
    once, not the state's bytes a second time."""

    def __init__(self, buffer: bytes | bytearray | memoryview) -> None:
        super().__init__()
        self._view, self._pos = _byte_view(buffer), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


def _byte_view(payload: bytes | bytearray | memoryview) -> memoryview:
    return memoryview(payload).cast("B") if not isinstance(payload, memoryview) or payload.format != "B" else payload


def sparse_indices(header: TensorHeader, payload: bytes | bytearray | memoryview) -> torch.Tensor | None:
    """The int32 indices of a Top-K payload that `unpack` accepted (None for a dense tensor): which elements
    of the tensor the sender kept."""
    from .compression import INDEX_DTYPE

    k = header.sparse_kept
    if not k:
        return None
    view = _byte_view(payload)
    return torch.frombuffer(bytearray(view[:k * INDEX_DTYPE.itemsize]), dtype=INDEX_DTYPE)


def _sparse_dense(view: memoryview, k: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The dense tensor of a checked-size Top-K payload; TensorError for bad indices."""
    from .compression import INDEX_DTYPE, SparseError, topk_decode

    raw = torch.frombuffer(bytearray(view), dtype=torch.uint8)  # one copy: aligned, writable
    split = k * torch.empty((), dtype=INDEX_DTYPE).element_size()
    try:
        return topk_decode(raw[:split].view(INDEX_DTYPE), raw[split:].clone().view(dtype), shape)  # (aligned)
    except SparseError as e:
        raise TensorError(f"Top-K payload refused: {e}") from None


def unpack(
    header: TensorHeader,
    payload: bytes | bytearray | memoryview,
    *,
    expect_shape: Sequence[int | None] | None = None,
    expect_dtype: str | torch.dtype | None = None,
    allow_nonfinite: bool = False,
    device: str | torch.device = "cpu",
    max_bytes: int = MAX_TENSOR_BYTES_DEFAULT,
) -> torch.Tensor:
    """The tensor that `header` and `payload` describe, after every check; `None` in `expect_shape` is a wildcard."""
    dtype = DTYPES.get(header.dtype)
    if dtype is None:
        raise TensorError(f"unknown tensor dtype {header.dtype!r}; expected one of {', '.join(DTYPES)}")
    if expect_dtype is not None:
        want = expect_dtype if isinstance(expect_dtype, str) else dtype_name(expect_dtype)
        if header.dtype != want:
            raise TensorError(f"tensor dtype is {header.dtype}, expected {want}")
    shape = tuple(header.shape)
    if len(shape) > MAX_DIMS:
        raise TensorError(f"tensor has {len(shape)} dimensions, at most {MAX_DIMS} are accepted")
    if any(not isinstance(s, int) or s < 0 for s in shape):
        raise TensorError(f"tensor shape {shape} has a negative or non-integer dimension")
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    if nbytes > max_bytes:
        raise TensorError(f"tensor of shape {shape} needs {nbytes} bytes, over the {max_bytes}-byte limit")
    kept = header.sparse_kept
    if kept:
        numel = math.prod(shape)
        if not dtype.is_floating_point:
            raise TensorError(f"a Top-K tensor must be floating point, not {header.dtype}")
        if kept > numel:
            raise TensorError(f"Top-K header keeps {kept} elements of a tensor of shape {shape} ({numel} elements)")
        nbytes = kept * (4 + itemsize)  # int32 indices, then the values
        if header.nbytes != nbytes:
            raise TensorError(f"header says {header.nbytes} bytes but {kept} Top-K elements of {header.dtype} "
                              f"need {nbytes}")
    elif header.nbytes != nbytes:
        raise TensorError(f"header says {header.nbytes} bytes but shape {shape} of {header.dtype} needs {nbytes}")
    if expect_shape is not None:
        want_shape = tuple(expect_shape)
        if len(want_shape) != len(shape) or any(w is not None and w != s for w, s in zip(want_shape, shape)):
            shown = tuple("*" if w is None else w for w in want_shape)
            raise TensorError(f"tensor shape is {shape}, expected {shown}")
    view = _byte_view(payload)
    if view.nbytes != nbytes:
        raise TensorError(f"payload has {view.nbytes} bytes but the header announces {nbytes}")
    if kept:
        out = _sparse_dense(view, kept, shape, dtype)
    elif nbytes == 0:
        out = torch.empty(shape, dtype=dtype)
    else:
        if view.readonly:
            view = memoryview(bytearray(view))  # one copy, into memory the tensor may own and write
        load_dtype = torch.uint8 if dtype == torch.bool else dtype
        out = torch.frombuffer(view, dtype=load_dtype).reshape(shape)
        if out.data_ptr() % itemsize:
            out = out.clone()  # unaligned slice of a larger frame
        if dtype == torch.bool:
            if bool((out > 1).any()):
                raise TensorError("bool tensor holds bytes other than 0 and 1")
            out = out.to(torch.bool)
    if out.is_floating_point() and not allow_nonfinite and not bool(torch.isfinite(out).all()):
        bad = int((~torch.isfinite(out)).sum())
        raise TensorError(f"tensor holds {bad} NaN/Inf value(s); refusing it")
    return out.to(device) if torch.device(device).type != "cpu" else out

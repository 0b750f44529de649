"""Hand the C heap's free pages back to the system after a node frees hundreds of MB at once (`trim`).

A node's large tensors come and go once per iteration: the microbatches'
held gradients multiplied out at the step (model/linearfactors.py) and the
step's temporaries, and the checkpoint's state, taken after a step and
freed once its file is written.  glibc's malloc serves them from its heaps
once its mmap threshold has risen (it follows the largest chunk freed, up to
32 MiB), and what is freed inside a heap stays in the process.  Measured in
the network lab (`scripts/bench_scale.py --preset llama-135m --microbatches
16 --settings bf16 --iterations 6 --checkpoint-every 1`, the daemon's
checkpoint after every step; relays then held 110 MB of float32 gradients
per microbatch), each relay's peak RSS growth against `model/memory.py`'s
estimate (estimate / peak) and the swarm's tokens/s:

* nothing given back: 0.63-1.01 (a relay up to 1.6x its estimate), 19.9;
* `trim` after a checkpoint's file is written: 0.77-1.00, 18.1;
* `trim` there and after each optimizer step (what the node does): 0.88-1.06,
  16.9.

Giving pages back costs their first touch again when the next iteration
allocates (0.41-0.44 s per GiB on this machine, against 0.05 s to write
pages already resident): what a 28M-parameter stage's held gradients took
then, about 0.35 s of CPU per relay and iteration; on a GPU they are not in
the C heap.  A low mmap threshold (`MALLOC_MMAP_THRESHOLD_=1048576`) gives
every large tensor back at its free instead, and faults in every one
afresh: 1.05-1.21 and the nodes' calibrated compute 25 % slower.  `trim` is
glibc's `malloc_trim(0)`, which also gives back free pages in the middle of
a heap; it runs where a node has just freed the most: after the optimizer
step (`LocalStage.apply_step`) and after a checkpoint's file is written
(runtime/node/checkpointer.py).  Where the C library has no `malloc_trim`
(musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("gwtf.node")

_UNSET = object()
_trim = _UNSET


def _malloc_trim():
    global _trim
    if _trim is _UNSET:
        try:
            fn = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            _trim = fn
        except (OSError, AttributeError):
            _trim = None
    return _trim


def trim() -> float | None:
    """Give the heaps' free pages back to the system; the seconds it took (None: not available here)."""
    fn = _malloc_trim()
    if fn is None:
        return None
    t0 = time.perf_counter()
    fn(0)
    took = time.perf_counter() - t0
    log.debug("heap trimmed in %.3f s", took)
    return took

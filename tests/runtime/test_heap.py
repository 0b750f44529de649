"""ops/heap.py: `trim` gives the free pages inside the C heap back to the system, and a node trims where it has
just freed the most (after the step, after a checkpoint's file is written)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gwtf_node.runtime.ops import heap

# In its own process, for a fresh allocator: a freed 4-MiB block raises glibc's mmap threshold (as a node's large
# tensors do), so 100 blocks of 3 MiB come from the heap; all but the last (which pins the heap's top) are freed.
PROBE = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, sys.argv[1])
    from gwtf_node.runtime.ops.heap import trim

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    libc.free(libc.malloc(4 << 20))
    base = rss_mb()
    blocks = [libc.malloc(3 << 20) for _ in range(100)]
    for b in blocks:
        ctypes.memset(b, 1, 3 << 20)
    held = rss_mb()
    for b in blocks[:-1]:
        libc.free(b)
    freed = rss_mb()
    took = trim()
    print(json.dumps({"base": base, "held": held, "freed": freed, "trimmed": rss_mb(), "took": took}))
""")


@pytest.mark.skipif(heap._malloc_trim() is None, reason="this C library has no malloc_trim (not glibc)")
def test_trim_gives_back_what_the_heap_kept_after_a_free(tmp_path):
    import json
    from pathlib import Path

    root = str(Path(heap.__file__).resolve().parents[3])
    out = subprocess.run([sys.executable, "-c", PROBE, root], capture_output=True, text=True, timeout=60, check=True)
    r = json.loads(out.stdout)
    assert r["held"] - r["base"] > 250  # 300 MiB touched
    assert r["freed"] - r["base"] > 250, r  # freed, but kept by the heap (its top is pinned)
    assert r["trimmed"] - r["base"] < 50, r  # given back
    assert r["took"] is not None and r["took"] < 5


def test_trim_is_a_no_op_where_the_c_library_has_none(monkeypatch):
    monkeypatch.setattr(heap, "_trim", None)
    assert heap.trim() is None

"""The fork server freezes its heap before forking (zygote.py `freeze_heap`): a forked child's garbage collection
then copies almost none of the imported modules' pages, which the nodes of a local swarm share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, os, sys, time
import torch, trio, libp2p
from gwtf_node.runtime.local.zygote import freeze_heap
if sys.argv[1] == "freeze":
    freeze_heap()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    gc.collect()  # what a node's collector does sooner or later
    os.write(w, b"x")
    time.sleep(30)
    os._exit(0)
os.read(r, 1)
kb = {}
for line in open(f"/proc/{pid}/smaps_rollup").read().splitlines()[1:]:
    parts = line.split()
    if len(parts) >= 2 and parts[1].isdigit():
        kb[parts[0]] = int(parts[1])
os.kill(pid, 9)
os.waitpid(pid, 0)
print((kb["Private_Clean:"] + kb["Private_Dirty:"]) // 1024)
"""


def _child_private_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip())


def test_a_forked_childs_collection_copies_little_of_a_frozen_heap() -> None:
    frozen, plain = _child_private_mib("freeze"), _child_private_mib("plain")
    assert frozen < 20 and plain > 3 * frozen + 30, (frozen, plain)

#!/usr/bin/env python
"""CPU per control frame over libp2p, yamux's window update on every read against once half the window is used.

Two hosts (host.py `open_host`, Noise + Yamux, no DHT) in one process on
loopback: host A sends `--frames` control frames of 64 bytes to host B, B
answers each with one of the same size (a Ping and its Pong), and the
process' CPU time from the first send to the last answer is divided by the
frames.  Each setting runs in its own process (`PY_YAMUX_RELEASE_ON_READ` 1,
py-libp2p's default, against 0, what the daemon sets: hostlisten.py),
alternating, `--repeats` times; the medians and their ratio are printed.

    python scripts/bench_ctrl_frames.py --frames 3000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"update on every read (py-libp2p's default)": "1", "update at half the window (the daemon's)": "0"}


async def _ping_pong(frames: int) -> dict:
    import trio

    from gwtf_node.runtime.net.host import open_host

    with tempfile.TemporaryDirectory() as tmp:
        async with open_host(Path(tmp) / "a", dht=False) as a, \
                open_host(Path(tmp) / "b", dht=False, bootstrap=a.addrs) as b:
            answered, done = [0], trio.Event()

            async def pong(peer: str, envelope: bytes, payload) -> None:
                await b.send(peer, b"p" * 64)

            async def count(peer: str, envelope: bytes, payload) -> None:
                answered[0] += 1
                if answered[0] == frames:
                    done.set()

            a.set_handler(count)
            b.set_handler(pong)
            with trio.fail_after(60):
                await a.send(b.peer_id, b"c" * 64)  # connected, streams open both ways
                while answered[0] < 1:
                    await trio.sleep(0.01)
            answered[0] = 0
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(frames):
                await a.send(b.peer_id, b"q" * 64)
            with trio.fail_after(300):
                await done.wait()
            return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}


def _child(frames: int) -> None:
    import trio

    print(json.dumps(trio.run(_ping_pong, frames)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.frames < 1 or args.repeats < 1:
        ap.error("--frames and --repeats must be at least 1")
    if args.child:
        _child(args.frames)
        return 0
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, value in SETTINGS.items():
            env = {**os.environ, "PY_YAMUX_RELEASE_ON_READ": value, "PYTHONPATH": str(ROOT)}
            out = subprocess.run([sys.executable, __file__, "--child", "--frames", str(args.frames)], env=env,
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                print(f"bench_ctrl_frames: the run with PY_YAMUX_RELEASE_ON_READ={value} failed:\n"
                      f"{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1])["cpu_s"] / args.frames * 1e6)
    medians = {name: statistics.median(v) for name, v in runs.items()}
    for name, v in runs.items():
        print(f"{name}: {medians[name]:.0f} us of CPU per frame and its answer (runs: "
              f"{', '.join(f'{x:.0f}' for x in v)})")
    default, ours = medians.values()
    print(f"ratio (the daemon's / py-libp2p's default): {ours / default:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""CPU per control frame over libp2p: the daemon's reads against py-libp2p's defaults, side by side.

Two hosts (host.py `open_host`, Noise + Yamux, no DHT) in one process on
loopback: host A sends `--frames` control frames of 64 bytes to host B, B
answers each with one of the same size (a Ping and its Pong), and the
process' CPU time from the first send to the last answer is divided by the
frames.  Over yamux every read of a stream sends the peer a window update:

* baseline: each frame read in two reads of the stream (header, envelope),
  `PY_YAMUX_RELEASE_ON_READ=1` (py-libp2p's default: an update after each);
* the daemon: frames read from chunks of the stream (frames.py `Buffered`:
  one read a frame, or fewer), `PY_YAMUX_RELEASE_ON_READ=0` and go-yamux's
  rule (yamuxwin.py: an update once half the window was read).

Each runs in its own process, alternating, `--repeats` times; the medians
and their ratio are printed, with the window updates per frame.

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
SETTINGS = {"baseline (two reads a frame, py-libp2p's default)": "1", "the daemon (buffered reads, hysteresis)": "0"}


async def _ping_pong(frames: int, baseline: bool) -> dict:
    import trio
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    from gwtf_node.runtime.net import host as host_module
    from gwtf_node.runtime.net import yamuxwin
    from gwtf_node.runtime.net.host import open_host

    if baseline:
        host_module.Buffered = lambda read_some: read_some  # each read of a frame a read of the stream
        yamuxwin.install = lambda: False  # py-libp2p's own window updates
    updates = [0]
    send_window_update = YamuxStream.send_window_update

    async def counted(self, increment, skip_lock=False):
        updates[0] += 1
        return await send_window_update(self, increment, skip_lock=skip_lock)

    YamuxStream.send_window_update = counted

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
            answered[0] = updates[0] = 0
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(frames):
                await a.send(b.peer_id, b"q" * 64)
            with trio.fail_after(300):
                await done.wait()
            return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                    "window_updates": updates[0]}


def _child(frames: int, baseline: bool) -> None:
    import trio

    print(json.dumps(trio.run(_ping_pong, frames, baseline)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.frames < 1 or args.repeats < 1:
        ap.error("--frames and --repeats must be at least 1")
    if args.child:
        _child(args.frames, args.baseline)
        return 0
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    updates: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, value in SETTINGS.items():
            env = {**os.environ, "PY_YAMUX_RELEASE_ON_READ": value, "PYTHONPATH": str(ROOT)}
            flags = ["--baseline"] if value == "1" else []
            out = subprocess.run([sys.executable, __file__, "--child", "--frames", str(args.frames), *flags], env=env,
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                print(f"bench_ctrl_frames: the run with PY_YAMUX_RELEASE_ON_READ={value} failed:\n"
                      f"{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(row["cpu_s"] / args.frames * 1e6)
            updates[name] = row["window_updates"] / (2 * args.frames)  # (the frames both ways)
    medians = {name: statistics.median(v) for name, v in runs.items()}
    for name, v in runs.items():
        print(f"{name}: {medians[name]:.0f} us of CPU per frame and its answer (runs: "
              f"{', '.join(f'{x:.0f}' for x in v)}), {updates[name]:.2f} window updates per frame")
    default, ours = medians.values()
    print(f"ratio (the daemon's / py-libp2p's default): {ours / default:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Transport benchmark: tensor throughput and within-stage all-reduce, in separate processes.

(a) Throughput of one frame of 4, 16, 64 MB (`--sizes`) from one Host process
    to another, three ways in the same run:
      * `host.send(peer, envelope, payload)`: the gwtf tensor channel
        (AES-256-GCM over TCP, keys agreed over libp2p Noise);
      * a plain py-libp2p Noise+Yamux stream between the same two hosts;
      * a raw trio TCP socket (no encryption) between the same two processes.
    Time = from the sender's `time.monotonic()` before the first byte to the
    receiver's `time.monotonic()` after the last byte has been decrypted and
    handed over (CLOCK_MONOTONIC is system-wide, so the two clocks agree);
    median over `--repeats`.
(b) All-reduce of a `--floats` (10M) float32 vector among 3 processes: our
    AllReducer vs hivemind's DecentralizedAverager, same tensors (seeded
    torch.randn).  Both are started from a barrier driven by this script:
    every process reports "ready", then gets "go"; round time = last finish -
    first start.  For hivemind the matchmaking runs before the barrier
    (`require_trigger=True`), so only its all-reduce is timed; its full
    `step()` time with matchmaking is reported too.  hivemind cannot be
    imported beside py-libp2p (duplicate protobuf package `crypto.pb`), so it
    runs under its own interpreter (`--hm-python`, default /work/hm-venv).
(c) Per-microbatch protocol overhead vs stage compute: a real swarm of daemon
    processes with one microbatch per iteration (a serial path); the leader's
    time per microbatch minus the compute every node measured in its torch
    calls (`bench_microbatch_overhead`).

Usage:  python scripts/bench_transport.py [--sizes 4,16,64] [--repeats 5] [--skip-hivemind]
The table goes to stdout (docs/bench_transport.md holds a run).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
DEFAULT_HM_PYTHON = "/work/hm-venv/bin/python"
STEP_TIMEOUT_S = 120.0  # bound on every wait of the orchestrator


# ---- orchestration (no libp2p, no hivemind imported here) --------------------------------


class Worker:
    """A subprocess speaking one JSON object per line on stdout; commands on stdin."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, timeout: float = STEP_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"worker {self.proc.args} exited with {self.proc.wait(5)}")
            if line.startswith("{"):
                return json.loads(line)

    def send(self, obj: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


def me(role: str, *extra: str) -> list[str]:
    return [sys.executable, str(HERE), "--role", role, *extra]


def bench_throughput(sizes_mb: list[int], repeats: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        recv = Worker(me("tput-recv", "--state", f"{tmp}/recv"))
        send = None
        try:
            info = recv.read()
            send = Worker(me("tput-send", "--state", f"{tmp}/send", "--peer", json.dumps(info),
                             "--sizes", ",".join(map(str, sizes_mb)), "--repeats", str(repeats)))
            return send.read(timeout=STEP_TIMEOUT_S * 3)["rows"]
        finally:
            for w in (send, recv):
                if w is not None:
                    w.stop()


def run_allreduce_group(argvs: list[list[str]], rounds: int) -> dict:
    """Start 3 workers, exchange addresses, then drive `rounds` barrier-started rounds."""
    workers = [Worker(argv) for argv in argvs]
    try:
        infos = [w.read() for w in workers]
        for w in workers:
            w.send({"cmd": "peers", "peers": infos})
        for w in workers:
            w.read()  # connected / matchmaking ready
        times, extra = [], []
        hashes: set[str] = set()
        for r in range(rounds + 1):  # round 0: warm-up, not timed
            for w in workers:
                w.send({"cmd": "prepare", "round": r})
            for w in workers:
                w.read()
            for w in workers:
                w.send({"cmd": "go", "round": r})
            res = [w.read() for w in workers]
            if r:
                times.append(max(x["t1"] for x in res) - min(x["t0"] for x in res))
                extra += [x.get("step_s", 0.0) for x in res]
                hashes |= {x["hash"] for x in res}
        return {"round_s": times, "step_s": extra, "identical": len(hashes) == 1 if hashes else None,
                "hash": sorted(hashes)[0] if hashes else "", "infos": infos}
    finally:
        for w in workers:
            w.stop()


def bench_allreduce(floats: int, rounds: int, skip_hivemind: bool, hm_python: str) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours = run_allreduce_group(
            [me("ar-gwtf", "--state", f"{tmp}/p{i}", "--rank", str(i), "--floats", str(floats)) for i in range(3)],
            rounds,
        )
    out["gwtf"] = ours
    # the exact reference: the sorted-peer-id order sum of the three seeded tensors
    import torch

    order = sorted(range(3), key=lambda i: ours["infos"][i]["peer_id"])
    ref = None
    for i in order:
        t = torch.randn(floats, generator=torch.Generator().manual_seed(1000 + i))
        ref = t if ref is None else ref.add_(t)
    import hashlib

    out["gwtf_exact"] = hashlib.sha256(ref.numpy().tobytes()).hexdigest()[:16] == ours["hash"]
    if skip_hivemind:
        out["hivemind"] = "skipped (--skip-hivemind)"
    elif not Path(hm_python).exists():
        out["hivemind"] = f"not run: {hm_python} does not exist (install hivemind in a separate venv)"
    else:
        try:
            out["hivemind"] = run_allreduce_group(
                [[hm_python, str(HERE), "--role", "ar-hivemind", "--rank", str(i), "--floats", str(floats)]
                 for i in range(3)],
                rounds,
            )
        except (RuntimeError, queue.Empty) as e:
            out["hivemind"] = f"failed: {e!r}"
    return out


def bench_microbatch_overhead(iterations: int) -> list[dict]:
    """(c) Per-microbatch protocol overhead vs stage compute, on a real swarm of processes.

    `gwtf-node local`'s machinery with 1 data node, 2 stages x 1 relay and ONE
    microbatch per iteration, so the microbatch's path is strictly serial:
    embed -> stage 0 -> stage 1 -> head/loss -> stage 1 bwd -> stage 0 bwd ->
    embed bwd.  `pipeline_seconds` (the leader, from opening the iteration to
    the last backward) minus the compute time every node measured inside its
    torch calls is what the protocol and transport cost: framing, encryption,
    the copies, the event loop and the thread hand-offs, 6 tensor frames and
    3 Complete frames per microbatch.  Two model sizes: the demo model and a
    larger one whose activations are 4 MB.
    """
    import tempfile

    from gwtf_node.model.manifest import default_manifest, save_manifest
    from gwtf_node.runtime.local.swarm import LocalSwarm, run_local

    configs = [
        ("demo (hidden 64, 4x64 tokens)", dict(hidden=64, seq_len=64, microbatch_size=4)),
        ("larger (hidden 512, 8x256 tokens)", dict(hidden=512, seq_len=256, microbatch_size=8)),
    ]
    rows = []
    for label, kw in configs:
        man = default_manifest(stages=2, microbatches_per_iteration=1, **kw)
        with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
            work = Path(tmp)
            save_manifest(man, work / "run.json")
            swarm = LocalSwarm(work, work / "run.json", data_nodes=1, stages=2, relays_per_stage=1,
                               iterations=iterations, log_level="WARNING")
            recs = run_local(swarm, lambda r: None)
            compute = sum(json.loads((work / n / "status.json").read_text())["compute_s"] for n in swarm.names())
        pipeline = sum(r["pipeline_seconds"] for r in recs)
        act_mb = kw["microbatch_size"] * kw["seq_len"] * kw["hidden"] * 4 / 1e6
        rows.append({"config": label, "activation_mb": act_mb, "iterations": len(recs),
                     "pipeline_ms": 1000 * pipeline / len(recs), "compute_ms": 1000 * compute / len(recs),
                     "overhead_ms": 1000 * (pipeline - compute) / len(recs),
                     "ratio": (pipeline - compute) / compute if compute else float("nan")})
        print(f"  {label}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def fmt_overhead(rows: list[dict]) -> str:
    out = ["## (c) per-microbatch protocol overhead vs stage compute (1 microbatch, 2 stages x 1 relay, processes)",
           "",
           "| model | activation MB | microbatch time ms | compute ms (all nodes) | overhead ms | overhead / compute |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['config']} | {r['activation_mb']:.2f} | {r['pipeline_ms']:.1f} | {r['compute_ms']:.1f} | "
                   f"{r['overhead_ms']:.1f} | {r['ratio']:.2f} |")
    return "\n".join(out)


# ---- worker roles ----------------------------------------------------------------------------


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _stdin_json() -> dict:
    import trio

    line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    if not line:
        return {"cmd": "quit"}
    return json.loads(line)


YAMUX_BENCH = "/gwtf/bench-yamux/1.0.0"


async def role_tput_recv(args) -> None:
    import struct

    import trio

    from gwtf_node.runtime.net.host import open_host

    async with open_host(Path(args.state), dht=False) as host:
        async def on_frame(peer, envelope, payload):
            t1 = time.monotonic()
            await host.send(peer, b"ack" + struct.pack(">d", t1))

        host.set_handler(on_frame)

        async def on_yamux(stream):
            from libp2p.network.stream.exceptions import StreamEOF
            while True:
                try:
                    head = await stream.read(8)
                except StreamEOF:
                    return
                (n,) = struct.unpack(">Q", head)
                buf = bytearray(n)
                got = 0
                while got < n:
                    chunk = await stream.read(n - got)
                    buf[got:got + len(chunk)] = chunk
                    got += len(chunk)
                await stream.write(struct.pack(">d", time.monotonic()))

        from libp2p.custom_types import TProtocol
        host.libp2p.set_stream_handler(TProtocol(YAMUX_BENCH), on_yamux)

        async def raw_conn(stream):
            sock = stream.socket
            while True:
                head = await stream.receive_some(8)
                if not head:
                    return
                while len(head) < 8:
                    head += await stream.receive_some(8 - len(head))
                (n,) = struct.unpack(">Q", head)
                buf = bytearray(n)
                view = memoryview(buf)
                got = 0
                while got < n:
                    got += await sock.recv_into(view[got:], n - got)
                await stream.send_all(struct.pack(">d", time.monotonic()))

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, raw_conn, 0, host="127.0.0.1"))
            raw_port = listeners[0].socket.getsockname()[1]
            emit({"addrs": host.addrs, "peer_id": host.peer_id, "raw_port": raw_port})
            await _stdin_json()
            nursery.cancel_scope.cancel()


async def role_tput_send(args) -> None:
    import struct

    import trio

    from gwtf_node.runtime.net.host import open_host

    peer = json.loads(args.peer)
    sizes = [int(s) for s in args.sizes.split(",")]
    async with open_host(Path(args.state), dht=False) as host:
        pid = await host.connect(peer["addrs"][0])
        acks: list[float] = []
        got = trio.Event()

        async def on_frame(_peer, envelope, payload):
            nonlocal got
            acks.append(struct.unpack(">d", envelope[3:11])[0])
            got.set()
            got = trio.Event()

        host.set_handler(on_frame)
        from libp2p.custom_types import TProtocol
        from libp2p.peer.id import ID

        stream = await host.libp2p.new_stream(ID.from_base58(pid), [TProtocol(YAMUX_BENCH)])
        raw = await trio.open_tcp_stream("127.0.0.1", peer["raw_port"])
        rows = []
        for mb in sizes:
            payload = os.urandom(mb << 20)
            res: dict[str, list[float]] = {"channel": [], "yamux": [], "raw": []}
            for rep in range(args.repeats + 1):  # the first repeat warms up (channel handshake)
                with trio.fail_after(STEP_TIMEOUT_S):
                    t0 = time.monotonic()
                    n_acks = len(acks)
                    await host.send(pid, b"bench", payload)
                    while len(acks) == n_acks:
                        await got.wait()
                    ch = acks[-1] - t0
                    t0 = time.monotonic()
                    await raw.send_all(struct.pack(">Q", len(payload)))
                    await raw.send_all(payload)
                    t1b = b""
                    while len(t1b) < 8:
                        t1b += await raw.receive_some(8 - len(t1b))
                    rw = struct.unpack(">d", t1b)[0] - t0
                    t0 = time.monotonic()
                    await stream.write(struct.pack(">Q", len(payload)) + payload)
                    yb = await stream.read(8)
                    ym = struct.unpack(">d", yb)[0] - t0
                if rep:
                    res["channel"].append(ch)
                    res["raw"].append(rw)
                    res["yamux"].append(ym)
            med = {k: statistics.median(v) for k, v in res.items()}
            rows.append({"mb": mb, **{f"{k}_mbps": (mb << 20) / 1e6 / v for k, v in med.items()}})
        await raw.aclose()
        emit({"rows": rows})
        await _stdin_json()


async def role_ar_gwtf(args) -> None:
    import hashlib

    import torch
    import trio

    from gwtf_node.protocol.codec import decode
    from gwtf_node.runtime.node.allreduce import AllReducer
    from gwtf_node.runtime.net.host import open_host

    tensor = torch.randn(args.floats, generator=torch.Generator().manual_seed(1000 + args.rank))
    async with open_host(Path(args.state), dht=False) as host:
        reducer = AllReducer(host)

        async def on_frame(peer, envelope, payload):
            _s, msg = decode(envelope)
            if reducer.accepts(msg):
                await reducer.on_chunk(peer, msg, payload)

        host.set_handler(on_frame)
        emit({"peer_id": host.peer_id, "addrs": host.addrs})
        cmd = await _stdin_json()
        group = [p["peer_id"] for p in cmd["peers"]]
        for p in cmd["peers"]:
            if p["peer_id"] != host.peer_id:
                await host.connect(p["addrs"][0])
        emit({"connected": True})
        while True:
            cmd = await _stdin_json()
            if cmd["cmd"] == "quit":
                return
            r = cmd["round"]
            emit({"ready": r})
            await _stdin_json()  # go
            t0 = time.monotonic()
            result, count = await reducer.all_reduce(f"bench/{r}", group, tensor, 1.0, STEP_TIMEOUT_S)
            t1 = time.monotonic()
            emit({"t0": t0, "t1": t1, "hash": hashlib.sha256(result.numpy().tobytes()).hexdigest()[:16]})


def role_ar_hivemind(args) -> None:
    """Runs under the hivemind venv: imports hivemind, never libp2p or gwtf_node.runtime."""
    import hashlib

    import hivemind
    import torch
    from hivemind.averaging.control import AveragingStage

    tensor = torch.randn(args.floats, generator=torch.Generator().manual_seed(1000 + args.rank))
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    emit({"peer_id": str(dht.peer_id), "addrs": [str(a) for a in dht.get_visible_maddrs()]})
    cmd = json.loads(sys.stdin.readline())
    if args.rank:  # rejoin through rank 0, the bootstrap of this little swarm
        dht.shutdown()
        dht = hivemind.DHT(start=True, initial_peers=cmd["peers"][0]["addrs"], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    averager = hivemind.averaging.DecentralizedAverager(
        [tensor.clone()], dht, prefix="gwtf_bench", target_group_size=3, min_group_size=3,
        min_matchmaking_time=2.0, request_timeout=5.0, start=True,
    )
    emit({"connected": True})
    try:
        while True:
            cmd = json.loads(sys.stdin.readline() or '{"cmd": "quit"}')
            if cmd["cmd"] == "quit":
                break
            r = cmd["round"]
            with averager.get_tensors() as ts:  # the same input every round
                ts[0].copy_(tensor)
            s0 = time.monotonic()
            control = averager.step(wait=False, require_trigger=True, timeout=STEP_TIMEOUT_S)
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while control.stage != AveragingStage.AWAITING_TRIGGER and not control.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hivemind matchmaking did not finish in {STEP_TIMEOUT_S} s")
                time.sleep(0.005)
            matched = time.monotonic() - s0
            emit({"ready": r})
            json.loads(sys.stdin.readline())  # go
            t0 = time.monotonic()
            control.allow_allreduce()
            control.result(timeout=STEP_TIMEOUT_S)
            t1 = time.monotonic()
            with averager.get_tensors() as ts:
                digest = hashlib.sha256(ts[0].numpy().tobytes()).hexdigest()[:16]
            emit({"t0": t0, "t1": t1, "step_s": matched + (t1 - t0), "hash": digest})
    finally:
        averager.shutdown()
        dht.shutdown()


# ---- main ------------------------------------------------------------------------------------


def fmt_table(tput: list[dict], ar: dict | None) -> str:
    lines = ["## (a) throughput, one frame, two processes, loopback (median MB/s, 1 MB = 1e6 bytes)", "",
             "| size | gwtf channel (host.send) | libp2p Noise+Yamux stream | raw trio TCP | channel / raw | channel / yamux |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in tput:
        lines.append(f"| {r['mb']} MiB | {r['channel_mbps']:.0f} | {r['yamux_mbps']:.0f} | {r['raw_mbps']:.0f} | "
                     f"{r['channel_mbps'] / r['raw_mbps']:.2f} | {r['channel_mbps'] / r['yamux_mbps']:.1f} |")
    if ar is not None:
        g = ar["gwtf"]
        lines += ["", "## (b) all-reduce, 3 processes, loopback (seconds per round, barrier start to last finish)", "",
                  "| implementation | median | min | max | rounds | notes |", "|---|---:|---:|---:|---:|---|"]
        lines.append(f"| gwtf AllReducer | {statistics.median(g['round_s']):.3f} | {min(g['round_s']):.3f} | "
                     f"{max(g['round_s']):.3f} | {len(g['round_s'])} | identical on all 3: {g['identical']}, "
                     f"equals sorted-order reference sum: {ar['gwtf_exact']} |")
        hm = ar["hivemind"]
        if isinstance(hm, dict):
            lines.append(f"| hivemind DecentralizedAverager (all-reduce only) | {statistics.median(hm['round_s']):.3f} | "
                         f"{min(hm['round_s']):.3f} | {max(hm['round_s']):.3f} | {len(hm['round_s'])} | "
                         f"full step() incl. matchmaking: median {statistics.median(hm['step_s']):.2f} s |")
            lines.append(f"| ratio hivemind / gwtf | {statistics.median(hm['round_s']) / statistics.median(g['round_s']):.1f}x | | | | |")
        else:
            lines.append(f"| hivemind DecentralizedAverager | - | - | - | - | {hm} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4,16,64", help="payload sizes in MiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--floats", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=5, help="timed all-reduce rounds")
    ap.add_argument("--skip-hivemind", action="store_true")
    ap.add_argument("--skip-allreduce", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--overhead-iterations", type=int, default=20)
    ap.add_argument("--hm-python", default=DEFAULT_HM_PYTHON)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "ar-hivemind":
        return role_ar_hivemind(args)
    if args.role:
        import trio

        fn = {"tput-recv": role_tput_recv, "tput-send": role_tput_send, "ar-gwtf": role_ar_gwtf}[args.role]
        return trio.run(fn, args)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# bench_transport: sizes {sizes} MiB, repeats {args.repeats}, all-reduce {args.floats} floats x 3 "
          f"processes, {args.rounds} rounds; {os.cpu_count()} CPUs", flush=True)
    tput = [] if args.skip_throughput else bench_throughput(sizes, args.repeats)
    ar = None if args.skip_allreduce else bench_allreduce(args.floats, args.rounds, args.skip_hivemind, args.hm_python)
    print(fmt_table(tput, ar))
    if not args.skip_overhead:
        print()
        print(fmt_overhead(bench_microbatch_overhead(args.overhead_iterations)))


if __name__ == "__main__":
    main()

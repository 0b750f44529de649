#!/usr/bin/env python
"""A stage's state handed over a home uplink that goes down half-way: chunks resumed against one frame.

Two relay daemons of one stage run in this process (`Node`, as the tests run them): a source holding the stage's
state (its AdamW moments made by one step, so the state is 12 bytes a parameter) and a newcomer that downloads it
(`Joining.fetch_state`), each on a state directory of its own, over loopback.  The tensor channel's sends are paced
at `--rate-mbit` (each record of its payloads leaves after its bytes at that rate), and once `--cut-at` of the
state has left, the link moves no payload for `--down-s` seconds (a home router that restarts; the control
messages still pass).  The sender gives a record up after its 30-s stall and once more on a new connection; the
newcomer asks again once no byte came for a frame timeout (60 s).  Side by side, in one run:

    chunks      the daemon: 64-MiB chunks, the newcomer resumes with what it holds (runtime/node/statechunks.py)
    one frame   the state in one frame (a chunk as large as the state): asked again, it comes again whole

Both run with the daemon's timeouts (a download whose answer has begun is asked again a minute after its last
byte).  Prints per variant: seconds from the first request to the state loaded, MB that went on the link (every
payload byte that left, also those of a frame cut off) and that over the state's bytes, MB in the frames that were
sent whole, the requests (with the offsets of those that resumed), and the ratios of chunks to one frame.

    python scripts/bench_handover.py --preset llama-135m --stages 4 --stage 1 --rate-mbit 50 --cut-at 0.5
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gwtf_node.runtime.net import channel  # noqa: E402

VARIANTS = {"chunks": None, "one frame": 1 << 62}  # chunk bytes (None: the daemon's)


class Link:
    """The tensor channel's sends paced at `rate` bytes/s; once `cut` bytes left, nothing moves for `down_s`."""

    def __init__(self, rate_bps: float, down_s: float) -> None:
        self.rate, self.down_s, self.cut, self.sent, self.down_until = rate_bps, down_s, None, 0, 0.0
        self.real = channel.RawConn.send_all

    def install(self) -> None:
        link = self

        async def send_all(conn, data) -> None:
            if len(data) > 64 << 10:  # (a payload record; control frames pass)
                if link.cut is not None and link.sent >= link.cut:
                    link.cut, link.down_until = None, trio.current_time() + link.down_s
                await trio.sleep_until(link.down_until)  # (the sender gives a record up after its 30-s stall)
                await trio.sleep(len(data) / link.rate)
                link.sent += len(data)
            await link.real(conn, data)

        channel.RawConn.send_all = send_all


async def _start(nursery, run: Path, stage: int, workdir: Path, name: str, boot: str | None):
    from gwtf_node.runtime.node.node import Node, NodeOptions

    node = Node(NodeOptions(run_path=run, role="relay", stage=stage, state_dir=workdir / name, name=name,
                            bootstrap=[boot] if boot else [], insecure_unsigned=True, bootstrap_timeout_s=0,
                            settle_s=0.2))
    nursery.start_soon(node.run)
    with trio.fail_after(300):
        while not (node.parts is not None and (workdir / name / "addr").exists() and node.stage.built):
            await trio.sleep(0.1)
    return node


def _step(part) -> None:
    """One AdamW step of zero gradients: the state then holds the moments, as a trained stage's does."""
    import torch

    for p in part.params:
        p.grad = torch.zeros_like(p)
    part.optimizer.step()
    for p in part.params:
        p.grad = None


async def _variant(run: Path, stage: int, workdir: Path, link: Link, chunk: int | None, cut_at: float) -> dict:
    async with trio.open_nursery() as nursery:
        source = await _start(nursery, run, stage, workdir, "source", None)
        boot = (workdir / "source" / "addr").read_text().split()[0]
        newcomer = await _start(nursery, run, stage, workdir, "newcomer", boot)
        await source.stage.run(_step, source.stage.model)
        size = len(await source.stage.run(source.stage.model.state_bytes))
        src = source.parts.wire.me
        with trio.fail_after(60):
            while src not in newcomer.peers.ids("relay", stage):
                await trio.sleep(0.1)
        if chunk is not None:
            source.parts.joining.server.chunk_bytes = chunk
        asked = []
        serve = source.parts.joining._answer_state_request

        async def counted(peer, msg):
            asked.append(msg.offset)
            await serve(peer, msg)

        source.parts.joining._answer_state_request = counted
        link.sent, link.cut, link.down_until = 0, int(cut_at * size), 0.0
        t0 = time.perf_counter()
        nursery.start_soon(newcomer.parts.joining.fetch_state, src, 0)
        with trio.fail_after(3600):
            while not (newcomer.parts.joining.state_loaded.is_set() and newcomer.parts.joining.fetch_since):
                await trio.sleep(0.05)  # (fetch_state makes its event anew when it starts)
        seconds = time.perf_counter() - t0
        _frames, sent = source.parts.wire.sent["payload"]["StageState"]
        same = source.stage.model.state_hash() == newcomer.stage.model.state_hash()
        source.stop()
        newcomer.stop()
    return {"state_mb": size / 1e6, "seconds": seconds, "sent_mb": sent / 1e6, "sent_over_state": sent / size,
            "wire_mb": link.sent / 1e6, "wire_over_state": link.sent / size,
            "requests": len(asked), "resumed_at_mb": [o / 1e6 for o in asked if o],
            "loaded_identical": same}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-135m")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--cut-at", type=float, default=0.5, help="fraction of the state sent when the link goes down")
    ap.add_argument("--down-s", type=float, default=90.0, help="seconds the link moves nothing from --cut-at on")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="the daemons' INFO log lines too")
    a = ap.parse_args(argv)
    if not 0 < a.cut_at < 1 or a.rate_mbit <= 0 or a.down_s < 0 or not 0 <= a.stage < a.stages:
        ap.error("--cut-at must be in (0, 1), --rate-mbit positive, --down-s at least 0, --stage one of the run's "
                 "stages")
    from gwtf_node.model.hfconfig import family_config
    from gwtf_node.model.manifest import default_manifest, save_manifest
    from gwtf_node.model.presets import preset_config

    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    link = Link(a.rate_mbit * 1e6 / 8, a.down_s)
    link.install()
    family, config, _ = family_config(preset_config(a.preset))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench_handover.") as tmp:
        for name, chunk in VARIANTS.items():
            workdir = Path(tmp) / name.replace(" ", "_")
            workdir.mkdir()
            run = workdir / "run.json"
            save_manifest(default_manifest(family=family, config=config, stages=a.stages, seq_len=32,
                                           microbatch_size=1), run)
            rows[name] = trio.run(_variant, run, a.stage, workdir, link, chunk, a.cut_at)
    ours, base = rows["chunks"], rows["one frame"]
    ratios = {"seconds": ours["seconds"] / base["seconds"], "wire_mb": ours["wire_mb"] / base["wire_mb"]}
    if a.json:
        print(json.dumps({"preset": a.preset, "stage": a.stage, "rate_mbit": a.rate_mbit, "cut_at": a.cut_at,
                          "down_s": a.down_s,
                          "variants": rows, "chunks_over_one_frame": ratios}))
        return 0
    print(f"{a.preset}, stage {a.stage} of {a.stages}: {ours['state_mb']:.1f} MB of state at {a.rate_mbit:g} Mbit/s, "
          f"the link moving nothing for {a.down_s:g} s from {a.cut_at:.0%} of it on")
    print("| variant | seconds to loaded | MB on the link | / state | MB in frames sent whole | requests | "
          "resumed at MB | loaded = source |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['seconds']:.1f} | {r['wire_mb']:.1f} | {r['wire_over_state']:.2f} | {r['sent_mb']:.1f} | "
              f"{r['requests']} | {', '.join(f'{x:.1f}' for x in r['resumed_at_mb']) or '-'} | "
              f"{r['loaded_identical']} |")
    print(f"chunks / one frame: time {ratios['seconds']:.2f}x, bytes on the link {ratios['wire_mb']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

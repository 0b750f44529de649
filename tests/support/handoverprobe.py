"""Measure the memory a stage state's hand-over takes at both ends, for tests/runtime/test_memory.py (its own
process).

    python tests/support/handoverprobe.py RUN.json STAGE

The source: relay STAGE built and stepped once (AdamW's moments exist), then `statechunks.StateServer` answering a
newcomer (its frames go to a wire that only counts them): the RSS growth over the state's bytes.  The newcomer:
the same stage built as a joiner builds it, then each chunk as the transport delivers it (a bytearray, dropped
once handled) through `statechunks.Download`, and what `Joining.on_state` does with the whole (`params_hash` for
the members' check, `load_state_bytes`): the RSS growth from before its build to that peak, against
`memory.estimate`'s `part_bytes` of the part (capacity 1).  Prints one JSON object.  MALLOC_MMAP_THRESHOLD_ is set
low by the caller so that freed buffers leave the RSS at once.
"""

from __future__ import annotations

import gc
import json
import sys

from memprobe import _Rss, _warm_up


class _Stage:
    """What StateServer asks of a node's stage: its steps, its snapshot, its worker thread (here: in line)."""

    def __init__(self, part) -> None:
        self.part, self.applied_steps = part, 1

    async def wait_steps(self, at_least, timeout_s) -> None:
        pass

    def snapshot(self):
        return self.applied_steps, self.part.state_bytes()

    async def run(self, fn, *args):
        return fn(*args)


class _Wire:
    """The frames sent to the newcomer: their messages and payloads (views of the source's state, not copies)."""

    def __init__(self) -> None:
        self.frames: list = []

    async def send(self, peer, msg, payload=b"") -> bool:
        self.frames.append((msg, payload))
        return True

    def spawn(self, fn, *args) -> None:
        pass


def main() -> None:
    import torch
    import trio

    torch.set_num_threads(1)
    import transformers  # noqa: F401 - imported before the baseline, as in a node

    from gwtf_node.model import memory
    from gwtf_node.model.manifest import load_manifest
    from gwtf_node.model.stages import build_stage
    from gwtf_node.protocol.messages import StageStateRequest
    from gwtf_node.runtime.node.handover import params_hash
    from gwtf_node.runtime.node.statechunks import Download, StateServer

    run, stage = sys.argv[1], int(sys.argv[2])
    man = load_manifest(run, check_files=False)
    meter = _Rss()
    _warm_up(torch, torch.device("cpu"))
    source = build_stage(man, "relay", stage)
    for p in source.params:
        p.grad = torch.zeros_like(p)
    source.optimizer.step()
    for p in source.params:
        p.grad = None
    gc.collect()
    wire = _Wire()
    server = StateServer(_Stage(source), wire, lambda steps: ())
    base = meter.now()
    meter.reset()
    trio.run(server.answer, "newcomer", StageStateRequest(stage), stage, "newcomer", 0.0)
    sent = meter.peak() - base
    size = sum(view.nbytes for _msg, view in wire.frames)
    del source
    gc.collect()
    base = meter.now()
    joiner = build_stage(man, "relay", stage)
    gc.collect()
    meter.reset()
    download = Download(lambda: 1 << 34)

    async def receive():
        blob = None
        for msg, view in wire.frames:  # each payload as the transport delivers it, one at a time
            blob = await download.take(_Stage(None).run, "source", msg, bytearray(view))
        return blob

    blob = trio.run(receive)
    params_hash(blob)
    joiner.load_state_bytes(blob)
    peak = meter.peak() - base
    est = memory.estimate(man, "relay", stage, 1)
    print(json.dumps({"params": joiner.num_params, "state_bytes": size, "chunks": len(wire.frames),
                      "source_growth": sent, "joiner_growth": peak, "estimate": est.part_bytes}))


if __name__ == "__main__":
    main()

"""Measure the memory a stage state's hand-over takes at both ends, for tests/runtime/test_memory.py (its own
process).

    python tests/support/handoverprobe.py RUN.json STAGE

The source: relay STAGE built and stepped once (AdamW's moments exist), then the state it sends to a newcomer
(`StageModel.state_bytes`, `handover.state_frame`) taken: the RSS growth over the state's bytes.  The newcomer:
the same stage built as a joiner builds it, the payload as the transport delivers it (a bytearray), then what
`Joining.on_state` does with it in its worker thread (`handover.received_state`, `params_hash` for the members'
check, `load_state_bytes`): the RSS growth from before its build to that peak, against `memory.estimate`'s
`part_bytes` of the part (capacity 1).  Prints one JSON object.  MALLOC_MMAP_THRESHOLD_ is set low by the caller
so that freed buffers leave the RSS at once.
"""

from __future__ import annotations

import gc
import json
import sys

from memprobe import _Rss, _warm_up


def main() -> None:
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401 - imported before the baseline, as in a node

    from gwtf_node.model import memory
    from gwtf_node.model.manifest import load_manifest
    from gwtf_node.model.stages import build_stage
    from gwtf_node.protocol.messages import StageState
    from gwtf_node.runtime.node.handover import params_hash, received_state, state_frame

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
    base = meter.now()
    meter.reset()
    msg, payload = state_frame(StageState(stage, 1, "", None), source.state_bytes())
    sent = meter.peak() - base
    size = payload.nbytes
    data = bytearray(payload)  # (what the transport hands the newcomer: counted as the newcomer's)
    del payload, source
    gc.collect()
    base = meter.now() - len(data)
    joiner = build_stage(man, "relay", stage)
    gc.collect()
    meter.reset()
    blob = received_state(msg, data, 1 << 34)
    params_hash(blob)
    joiner.load_state_bytes(blob)
    peak = meter.peak() - base
    est = memory.estimate(man, "relay", stage, 1)
    print(json.dumps({"params": joiner.num_params, "state_bytes": size, "source_growth": sent,
                      "joiner_growth": peak, "joiner_payload": len(data), "estimate": est.part_bytes}))


if __name__ == "__main__":
    main()

"""Measure a part's peak memory on the CPU, for tests/runtime/test_memory.py (run as its own process).

    python tests/support/memprobe.py RUN.json ROLE STAGE CAPACITY

Prints one JSON object: the RSS growth from before the part is built to the peak of an iteration and its
optimizer step, then the checkpoint's state taken and held while `CAPACITY` forwards and their backwards run
(each one's parameter gradients held apart until the step, as a node holds them), and its file written (as runtime/node/checkpointer.py does), and the next step; the peak is reset after
`build_stage` with /proc/self/clear_refs, so the whole model that `build_stage` may build first and free does
not count; and `memory.estimate`'s figures.
MALLOC_MMAP_THRESHOLD_ is set low by the caller so that freed tensors leave the RSS at once.
"""

from __future__ import annotations

import gc
import json
import sys


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _warm_up(torch) -> None:
    """What any first training step loads once per process (kernels, sdpa, AdamW): not the part's memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8))).loss.backward()
    opt.step()
    del model, opt


def main() -> None:
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401 - imported before the baseline, as in a node

    from gwtf_node.model import memory
    from gwtf_node.model.manifest import load_manifest
    from gwtf_node.model.stages import build_stage

    run, role, stage, capacity = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    man = load_manifest(run, check_files=False)
    stage_arg = None if role == "data" else stage
    est = memory.estimate(man, role, stage_arg, capacity)
    from transformers.masking_utils import create_causal_mask  # noqa: F401 - loaded lazily by the first forward

    _warm_up(torch)
    gc.collect()
    base = _status("VmRSS")
    part = build_stage(man, role, stage_arg)
    gc.collect()
    built = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    b, t, h = man.data.microbatch_size, man.data.seq_len, man.dims.hidden
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, man.dims.vocab, (b, t), generator=g)

    def forwards(keys) -> None:
        for k in keys:
            if role == "relay":
                part.forward(k, torch.randn(b, t, h, generator=g))
            else:
                part.embed(k, ids)

    def backward(k: int) -> None:  # its parameter gradients held apart until the step, as a node does
        if role == "relay":
            part.backward(k, torch.randn(b, t, h, generator=g), hold=True)
        else:
            _loss, grad = part.head_loss(k, torch.randn(b, t, h, generator=g), ids, hold=True)
            part.embed_backward(k, grad)

    def step(keys) -> None:
        for k in keys:
            part.commit(k)
        part.apply_mean_grad(part.grad_vector(), 1)

    # an iteration, its step; the checkpoint's state taken after it and held (runtime/node/checkpointer.py) while
    # the next iteration's `capacity` microbatches go forward, then back (all in flight at once, each one's
    # gradients held), then its file written, and the step
    forwards([0])
    backward(0)
    step([0])
    import tempfile

    from gwtf_node.runtime.node import checkpoints

    state, digest, params = part.state_bytes(), part.state_hash(), part.param_vector()
    forwards(range(1, capacity + 1))
    for k in range(1, capacity + 1):
        backward(k)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints.write(tmp, run_id=man.run_id, role=role, stage=stage_arg, steps=1, state=state,
                          params_sha256=digest, params=params, keep=1)
        del state, params
    step(range(1, capacity + 1))  # the next aggregation's step, the checkpoint's state released
    peak = _status("VmHWM")
    print(json.dumps({"part": est.part, "params": part.num_params, "measured": peak - base,
                      "built": built - base, "estimate": est.part_bytes, "per_microbatch": est.per_microbatch,
                      "capacity": capacity}))


if __name__ == "__main__":
    main()

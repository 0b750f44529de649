"""Measure a part's peak memory, for tests/runtime/test_memory.py and scripts/gpu_check.py (its own process).

    python tests/support/memprobe.py RUN.json ROLE STAGE CAPACITY [DEVICE]

Prints one JSON object: the RSS growth from before the part is built to the peak of an iteration and its
optimizer step, then the checkpoint's state taken and held while `CAPACITY` forwards and their backwards run
(each one's parameter gradients held apart until the step, as a node holds them), and its file written (as runtime/node/checkpointer.py does), and the next step; the peak is reset after
`build_stage` with /proc/self/clear_refs, so the whole model that `build_stage` may build first and free does
not count; and `memory.estimate`'s figures.
MALLOC_MMAP_THRESHOLD_ is set low by the caller so that freed tensors leave the RSS at once.
On a CUDA `DEVICE` the part lives on the GPU and the growth is `torch.cuda.max_memory_allocated`'s over the
allocated bytes before `build_stage` (the peak reset after it), against the estimate for that device; the
seconds of the timed microbatches' forwards and backwards are printed too.
"""

from __future__ import annotations

import gc
import json
import sys
import time


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _warm_up(torch, dev) -> None:
    """What any first training step loads once per process (kernels, sdpa, AdamW): not the part's memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).to(dev)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 64, (2, 8), device=dev)
    model(ids, labels=ids).loss.backward()
    opt.step()
    del model, opt


class _Cuda:
    """The allocated bytes of a CUDA device: the baseline, the peak reset, the peak."""

    def __init__(self, torch, dev) -> None:
        self.torch, self.dev = torch, dev

    def now(self) -> int:
        self.torch.cuda.synchronize(self.dev)
        return self.torch.cuda.memory_allocated(self.dev)

    def reset(self) -> None:
        self.torch.cuda.synchronize(self.dev)
        self.torch.cuda.reset_peak_memory_stats(self.dev)

    def peak(self) -> int:
        self.torch.cuda.synchronize(self.dev)
        return self.torch.cuda.max_memory_allocated(self.dev)


class _Rss:
    """The process's resident set: the baseline, VmHWM reset to the current RSS, the peak."""

    def now(self) -> int:
        return _status("VmRSS")

    def reset(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS

    def peak(self) -> int:
        return _status("VmHWM")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401 - imported before the baseline, as in a node

    from gwtf_node.model import memory
    from gwtf_node.model.manifest import load_manifest
    from gwtf_node.model.stages import build_stage

    run, role, stage, capacity = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    dev = torch.device(device)
    meter = _Cuda(torch, dev) if dev.type == "cuda" else _Rss()
    man = load_manifest(run, check_files=False)
    stage_arg = None if role == "data" else stage
    est = memory.estimate(man, role, stage_arg, capacity, device=device)
    from transformers.masking_utils import create_causal_mask  # noqa: F401 - loaded lazily by the first forward

    _warm_up(torch, dev)
    gc.collect()
    base = meter.now()
    part = build_stage(man, role, stage_arg, device=dev)
    gc.collect()
    built = meter.now()
    meter.reset()
    b, t, h = man.data.microbatch_size, man.data.seq_len, man.dims.hidden
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, man.dims.vocab, (b, t), generator=g).to(dev)

    def randn() -> "torch.Tensor":
        return torch.randn(b, t, h, generator=g).to(dev)

    def forwards(keys) -> None:
        for k in keys:
            if role == "relay":
                part.forward(k, randn())
            else:
                part.embed(k, ids)

    def backward(k: int) -> None:  # its parameter gradients held apart until the step, as a node does
        if role == "relay":
            part.backward(k, randn(), hold=True)
        else:
            _loss, grad = part.head_loss(k, randn(), ids, hold=True)
            part.count_held(k)
            part.embed_backward(k, grad)

    def step(keys) -> None:
        part.commit_many(keys)
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
    meter.now()
    t0 = time.perf_counter()
    forwards(range(1, capacity + 1))
    for k in range(1, capacity + 1):
        backward(k)
    meter.now()
    seconds = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints.write(tmp, run_id=man.run_id, role=role, stage=stage_arg, steps=1, state=state,
                          params_sha256=digest, params=params, keep=1)
        del state, params
    step(range(1, capacity + 1))  # the next aggregation's step, the checkpoint's state released
    peak = meter.peak()
    print(json.dumps({"part": est.part, "params": part.num_params, "measured": peak - base,
                      "built": built - base, "estimate": est.part_bytes, "per_microbatch": est.per_microbatch,
                      "capacity": capacity, "device": device, "seconds": seconds,
                      "tokens": capacity * b * t}))


if __name__ == "__main__":
    main()

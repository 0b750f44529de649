"""What a node's part of the model needs in memory, from the manifest alone, and whether it fits its device.

Theory of operation
-------------------
A part (the data part, or relay stage k) holds, with P its parameters
(`hfconfig.parameter_counts`, built on the meta device) and the master
weights in float32 whatever the precision:

* parameters: 4 P bytes;
* gradients: the float32 accumulators StageModel keeps (4 P);
* the aggregation between iterations (`aggregation_bytes`, transient, when
  no microbatch is held): the larger of the all-reduce (the gradient vector,
  the result, the parts received and their wire bytes: 16 P) and the step
  (the summed vector and `.grad`, 8 P, and AdamW's temporaries,
  `step_temporaries`);
* on the CPU, the checkpoint (`checkpoint_bytes`: the state's bytes,
  parameters and optimizer state, and the parameter vector: 16 P with
  AdamW), taken after a step and held while its file is written during the
  next iteration's microbatches, until that iteration's all-reduce
  (runtime/node/checkpointer.py); measured with tests/support/memprobe.py;
* optimizer state: AdamW's two moments (8 P), SGD's momentum (4 P or 0);
* held gradients: from its backward to the step, each microbatch carried in the iteration keeps its parameter
  gradients apart (`StageModel.backward(hold=True)`: crash recovery may give an attempt up after its backward
  ran), its linear weights' as their factors where those are the smaller (`linear_factors`), else 4 P; the
  backward frees its activations as it makes them, so a microbatch holds one or the other (`per_unit`).  The
  data part holds a microbatch's head gradients from its head to its final backward, the head weight's as its
  two factors (B T (V + H) values in the compute dtype) where they are smaller than the V x H matrix
  (linearfactors.py), multiplied out with other completed microbatches' (`StageModel.count_held`);
* activations: every in-flight microbatch keeps the autograd graph of one
  stage forward (`StageModel.forward` stashes it until the backward).  Per
  layer and per token, the tensors autograd saves are linear in the shapes:
  a LLaMA-family layer (llama, mistral, qwen2) saves 32 H + 16 I + 8 KV +
  4 heads + 8 bytes in float32, a GPT-2 block 32 H + 20 I + 4 heads + 16
  (H hidden, I intermediate, KV = key/value heads x head dim; the 4 bytes
  per head are the attention's log-sum-exp, no T x T matrix is kept).
  Fitted exactly to the distinct storages saved for backward (`saved_tensors_hooks`, parameters left out)
  of one and two layers at eight shapes and three (B, T) pairs on the CPU (sdpa attention), they predict
  each of them exactly (tests/runtime/test_memory.py checks other shapes, GQA and Qwen2's biases).
  Under `bf16-mixed` (autocast to bfloat16 around the forward, measured
  with CPU autocast) a layer saves 24 H + 8 I + 4 KV + 4 heads + 8 bytes
  (LLaMA) or 20 H + 10 I + 4 heads + 16 (GPT-2) per token (at shapes other
  than the fitted ones within 1 %), and the part keeps one bfloat16 copy of
  its weights, made once per step (2 P; linearfactors.py); the linear layers' inputs count as saved (their factors'
  inputs).  A relay also keeps the stage's output (B T H floats); the data part keeps the embedding output and the
  input ids.  One microbatch's backward adds a layer's worth of activation
  gradients besides the gradients it holds; the data part's head computes
  logits, their log-softmax and their gradient (3 x B T V floats) at once.
* a fixed overhead per process (`OVERHEAD_BYTES`): torch, transformers and
  the runtime imported (the device's free memory is read after its context).

`estimate(manifest, role, stage, capacity)` adds these up: the resident
state plus the larger of the aggregation and the microbatches (`capacity`,
what the node carries in an iteration, each holding `per_unit`) with the
checkpoint held (and the data part's head).  `fits` compares it with the
free memory of the device (`torch.cuda.mem_get_info` on CUDA, MemAvailable
of /proc/meminfo on the CPU); `capacity_that_fits` is the largest capacity,
at most the cap, whose estimate fits.  Tests measure the peak of a real part
(RSS growth, or `torch.cuda.max_memory_allocated`) against the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hfconfig import ParamCounts
    from .manifest import RunManifest

MIB = 1 << 20
# RSS of a python process that imported torch, transformers and gwtf_node's runtime (measured: 390-430 MiB on
# x86-64 Linux with torch 2.13 CPU); the node's other memory (libp2p, buffers, queues) is small beside a stage
OVERHEAD_BYTES = 512 * MIB
LLAMA_LIKE = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class MemoryEstimate:
    part: str  # "data" or "stage<k>"
    params: int  # bytes of the float32 master weights
    gradients: int  # the float32 accumulators
    optimizer: int  # AdamW moments / SGD momentum
    per_microbatch: int  # what one microbatch keeps from its forward to its backward (activations)
    held: int  # what one microbatch keeps from its backward to the step (its parameter gradients)
    capacity: int  # microbatches the node carries in an iteration
    transient: int  # beside the microbatches: the checkpoint's state held, the data part's head
    aggregation: int  # the aggregation's peak beyond the resident state (no microbatch held then)
    overhead: int = OVERHEAD_BYTES

    @property
    def per_unit(self) -> int:
        """What one more unit of capacity adds: a microbatch keeps its activations or its gradients, not both."""
        return max(self.per_microbatch, self.held)

    @property
    def part_bytes(self) -> int:
        """The part's own peak, without the process overhead: its resident state plus the larger of the
        iteration's microbatches (`capacity - 1` of them each holding its activations or its gradients while the
        last one's backward turns the one into the other) with the transient, and the aggregation."""
        microbatches = self.per_unit * max(0, self.capacity - 1) + self.per_microbatch + self.held
        return self.params + self.gradients + self.optimizer + max(microbatches + self.transient, self.aggregation)

    @property
    def total(self) -> int:
        return self.part_bytes + self.overhead

    def describe(self) -> str:
        return (f"{self.part} needs {self.total / MIB:,.0f} MiB: parameters {self.params / MIB:,.0f}, gradients "
                f"{self.gradients / MIB:,.0f}, optimizer {self.optimizer / MIB:,.0f}, microbatches "
                f"{self.capacity} x {self.per_unit / MIB:,.1f} (activations {self.per_microbatch / MIB:,.1f} or "
                f"held gradients {self.held / MIB:,.1f}), checkpoint/head {self.transient / MIB:,.0f}, aggregation "
                f"{self.aggregation / MIB:,.0f}, process {self.overhead / MIB:,.0f}")


def _shapes(family: str, config: dict) -> dict[str, int]:
    if family == "gpt":
        h = config.get("n_embd", 768)
        heads = config.get("n_head", 12)
        return {"H": h, "I": config.get("n_inner") or 4 * h, "heads": heads, "KV": h}
    h = config.get("hidden_size", 4096)
    heads = config.get("num_attention_heads", 32)
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    return {"H": h, "I": config.get("intermediate_size", 11008), "heads": heads, "KV": kv * head_dim,
            "q": heads * head_dim}


def layer_bytes_per_token(family: str, config: dict, precision: str = "fp32") -> int:
    """Bytes autograd saves per token in one decoder layer's forward (without autocast's weight copies)."""
    s = _shapes(family, config)
    h, i, kv, heads = s["H"], s["I"], s["KV"], s["heads"]
    bf16 = precision == "bf16-mixed"
    if family == "gpt":
        return (20 * h + 10 * i + 4 * heads + 16) if bf16 else (32 * h + 20 * i + 4 * heads + 16)
    return (24 * h + 8 * i + 4 * kv + 4 * heads + 8) if bf16 else (32 * h + 16 * i + 8 * kv + 4 * heads + 8)


def linear_factors(family: str, config: dict, precision: str = "fp32") -> tuple[int, int]:
    """(bytes per token, parameters) of one decoder layer's linear weights as a held microbatch keeps their
    gradients' factors (linearfactors.py): each layer's output gradient and each distinct input, in the compute
    dtype; and the weights they stand for."""
    s = _shapes(family, config)
    h, i, kv = s["H"], s["I"], s["KV"]
    size = 2 if precision == "bf16-mixed" else 4
    if family == "gpt":  # c_attn, attn.c_proj, c_fc, mlp.c_proj; inputs ln_1, the heads merged, ln_2, the GELU
        return size * ((5 * h + i) + (3 * h + i)), 4 * h * h + 2 * h * i
    q = s["q"]  # q, k, v, o, gate, up, down; inputs the norm (q, k, v), the heads, the norm (gate, up), the product
    return size * ((q + 2 * kv + 2 * h + 2 * i) + (2 * h + q + i)), 2 * h * q + 2 * h * kv + 3 * h * i


def optimizer_bytes(manifest: "RunManifest", params: int) -> int:
    t = manifest.train
    if t.optimizer == "adamw":
        return 8 * params
    return 4 * params if t.momentum > 0 else 0


def step_temporaries(manifest: "RunManifest", params: int, largest: int, device: str) -> int:
    """Bytes AdamW allocates inside a step: per tensor on the CPU (sqrt and its quotient of the largest
    parameter), for all parameters at once on CUDA (torch's foreach implementation); SGD works in place."""
    if manifest.train.optimizer != "adamw":
        return 0
    return max(8 * largest, 4 * params if device.startswith("cuda") else 0)


def aggregation_bytes(manifest: "RunManifest", params: int, largest: int, device: str) -> int:
    """The aggregation's peak beyond the resident state, the larger of its two pieces (module doc): the
    all-reduce (the gradient vector, the result, the parts received and their wire bytes: 16 P) and the step (the
    summed vector, `.grad` and the optimizer's temporaries)."""
    step = 8 * params + step_temporaries(manifest, params, largest, device)
    if device.startswith("cuda"):  # (the all-reduce is in host memory)
        return step
    return max(16 * params, step)


def checkpoint_bytes(manifest: "RunManifest", params: int, device: str) -> int:
    """The checkpoint's state held during the next iteration's microbatches: the state's bytes (parameters and
    optimizer state) and the parameter vector; in host memory, so nothing on CUDA."""
    if device.startswith("cuda"):
        return 0
    return 4 * params + optimizer_bytes(manifest, params) + 4 * params


STATE_FRAMING_BYTES = 16 << 20  # torch.save's records around a part's tensors (names, headers: under 1 MB measured)


def largest_state_bytes(manifest: "RunManifest", counts: "ParamCounts | None" = None) -> int:
    """A bound on the largest part's state as `StageModel.state_bytes()` holds it (float32 parameters and the
    optimizer's state, 1/64 more and STATE_FRAMING_BYTES for the framing): the largest frame a member of this
    run sends, to a newcomer taking over its part; the transport accepts frames this large (runtime/node/node.py)."""
    from .hfconfig import parameter_counts

    counts = counts or parameter_counts(manifest.model.family, manifest.model.config)
    n = max([counts.data] + [counts.stage(start, end) for start, end in manifest.stages])
    raw = 4 * n + optimizer_bytes(manifest, n)
    return raw + raw // 64 + STATE_FRAMING_BYTES


def estimate(manifest: "RunManifest", role: str, stage: int | None, capacity: int,
             counts: "ParamCounts | None" = None, device: str = "cpu") -> MemoryEstimate:
    """The memory of this node's part holding `capacity` microbatches at once, on `device`."""
    from .hfconfig import parameter_counts

    fam, cfg = manifest.model.family, manifest.model.config
    counts = counts or parameter_counts(fam, cfg)
    precision = getattr(manifest.train, "precision", "fp32")
    b, t = manifest.data.microbatch_size, manifest.data.seq_len
    tokens = b * t
    s = _shapes(fam, cfg)
    hidden = 4 * tokens * s["H"]  # one [B, T, H] float32 tensor
    if role == "data":
        n = counts.data
        per_mb = hidden + 8 * tokens  # the embedding output and the input ids
        vocab, width = manifest.dims.vocab, s["H"]
        logits = 4 * tokens * vocab
        head = 3 * logits + 2 * hidden
        if precision == "bf16-mixed":
            head += logits // 2 + 2 * n  # bfloat16 logits and weight copy before the float32 loss
        # a microbatch in flight holds its head gradients (the final norm's, at most 2 H, and the head weight's as
        # its factors where they are the smaller: linearfactors.py), multiplied out when it completes; and its
        # embedding output until then
        weight = 4 * vocab * width
        factors = (2 if precision == "bf16-mixed" else 4) * tokens * (vocab + width)
        held = min(weight, factors) + 8 * width + per_mb
        # the head factors of completed microbatches wait to be added together, up to half the weight's float32
        # bytes (StageModel.count_held); then their concatenation and its product in the compute dtype
        pending = weight // 2 if factors < weight else 0
        flush = pending + (weight // 2 if precision == "bf16-mixed" else weight) if pending else 0
        transient = max(head, flush) + pending + checkpoint_bytes(manifest, n, device)
        aggregation = aggregation_bytes(manifest, n, counts.data_largest, device)
        name = "data"
    else:
        start, end = manifest.stages[stage]
        n = counts.stage(start, end)
        layers = end - start
        per_layer = tokens * layer_bytes_per_token(fam, cfg, precision)
        per_mb = layers * per_layer + hidden  # the saved tensors and the stage output
        # the commit's product of one weight at a time (linearfactors.add_all: the factors concatenated, at most
        # the product's float32 bytes, and the product in the compute dtype)
        transient = checkpoint_bytes(manifest, n, device) + 8 * counts.layer_largest
        if precision == "bf16-mixed":
            transient += 2 * n  # the weights' bfloat16 copies, made once per step (linearfactors.py)
        aggregation = aggregation_bytes(manifest, n, counts.layer_largest, device)
        name = f"stage{stage}"
        # the parameter gradients each microbatch holds apart from its backward to the step: the linear
        # weights' as their factors where those are the smaller (linearfactors.py)
        per_token, weights = linear_factors(fam, cfg, precision)
        factors = layers * tokens * per_token
        held = factors + 4 * (n - layers * weights) if factors < 4 * layers * weights else 4 * n
    return MemoryEstimate(name, params=4 * n, gradients=4 * n, optimizer=optimizer_bytes(manifest, n),
                          per_microbatch=per_mb, held=held, capacity=capacity, transient=transient,
                          aggregation=aggregation)


def free_bytes(device: str) -> int:
    """Free memory of `device`: the GPU's (torch.cuda.mem_get_info) or the machine's MemAvailable."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def capacity_that_fits(manifest: "RunManifest", role: str, stage: int | None, free: int, cap: int,
                       counts: "ParamCounts | None" = None, device: str = "cpu") -> int:
    """The most in-flight microbatches (1..cap) whose estimate fits in `free` bytes; 0 when not even one does."""
    one = estimate(manifest, role, stage, 1, counts, device)
    if one.total > free:
        return 0
    return max(1, min(cap, 1 + (free - one.total) // max(1, one.per_unit)))


def relay_demand(manifest: "RunManifest", data_nodes: int) -> int:
    """The most microbatches a relay may be sent at once, as a capacity's cap: the run's demand, microbatches per
    iteration x its data nodes (`join --data-nodes`)."""
    return manifest.data.microbatches_per_iteration * data_nodes


def hold_limit(manifest: "RunManifest", stage: int, free: int, counts: "ParamCounts | None" = None,
               device: str = "cpu") -> int:
    """The most microbatches a relay of `stage` holds within `free` bytes, in flight or their gradients held to the
    step (each its activations or its held gradients: `capacity_that_fits` without a cap); 0 when not one fits."""
    return capacity_that_fits(manifest, "relay", stage, free, 1 << 40, counts, device)


def fit_error(manifest: "RunManifest", role: str, stage: int | None, capacity: int, device: str, free: int,
              counts: "ParamCounts | None" = None,
              fix: str = "join another stage, lower --capacity, or use a larger device") -> str | None:
    """One line saying that the part does not fit `free` bytes of `device`, or None when it fits."""
    need = estimate(manifest, role, stage, capacity, counts, device)
    if need.total <= free:
        return None
    where = "free GPU memory" if device.startswith("cuda") else "available RAM (MemAvailable)"
    return f"{need.describe()}, but {device} has {free / MIB:,.0f} MiB {where}: {fix}"


def stage_capacities(manifest: "RunManifest", free: int, cap: int,
                     counts: "ParamCounts | None" = None, device: str = "cpu") -> dict[int, int]:
    """Each relay stage's capacity that fits `free` bytes (1..cap), for the stages where one microbatch fits."""
    from .hfconfig import parameter_counts

    counts = counts or parameter_counts(manifest.model.family, manifest.model.config)
    out = {}
    for k in range(manifest.num_stages):
        c = capacity_that_fits(manifest, "relay", k, free, cap, counts, device)
        if c:
            out[k] = c
    return out

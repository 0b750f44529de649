"""The torch layer: run manifests, stage partitioning and execution, data, tensors on the wire.

`manifest` and `tensors` import quickly; `stages`, `data` and `reference`
import torch, and `build_stage` imports transformers on first use (seconds).
Nothing here imports the runtime or the simulator (tests/test_layering.py).
"""

"""The torch layer: run manifests, stage partitioning and execution, data, tensors on the wire.

`manifest` imports no torch (the daemon reads and signs manifests before it
pays for torch); `tensors`, `stages`, `data` and `reference` import torch
(about 2 s), and `build_stage` imports transformers on first use (4-5 s more).
Nothing here imports the runtime or the simulator (tests/repo/test_layering.py).
"""

"""This node's part of the model: its stage (or a data node's embedding and head) and the torch worker.

Torch runs in one worker thread (`trio.to_thread`, a limiter of 1: a
stage's tensors are not thread-safe) so that the event loop keeps answering
while a stage computes.  `compute` counts the time spent inside stage
forward/backward/embedding/head (`compute_s`, status.json), and per microbatch
key (`key_compute_s`, emptied by tally.py into useful and wasted compute);
`run` is for the rest (optimizer step, state snapshots, checkpoints).
Both also count the worker thread's CPU time (`compute_cpu_s`, and
`work_cpu_s` per piece of work over all its calls), and aggregation.py
the process's CPU time in its aggregations (`aggregation_cpu_s`, all
threads): where several nodes share a machine's cores, what their work
costs there, beside its wall time that counts the waiting for a core.
`compute_ms` is this node's compute per microbatch, Equation 1's c_i: the
smoothed time of one call times the calls of one microbatch (a relay's
forward and backward; a data node's embedding, head with its loss, and
embedding backward), starting from a profile of one microbatch when the part
is built (`StageModel.profile_ms`), 0 before.

The work it measured.  `run` times each piece of work under its function's
name (`work_s`: the last `apply_step`, `take_state`, `grad_vector`,
`snapshot`, ...); `note_work` records one timed elsewhere.  `busiest_s` is
the longest of them and of the compute per microbatch: what liveness.py
scales its peers' deadlines with, and aggregation.py its phase-signal
retries (a node that takes 30 s to step expects its stage-mates to take
about as long).

`applied_steps` counts the optimizer steps applied to this part; it changes
with the step itself (`apply_step`, in the worker thread) so that a state
snapshot sees both or neither, and when a joiner installs a downloaded state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import trio

from ..net.wire import FrameRefused
from ..ops.heap import trim
from .snapshots import StageStatus

log = logging.getLogger("gwtf.node")

CALLS_PER_MICROBATCH = {"relay": 2, "data": 3}
CALL_EWMA_WEIGHT = 0.1  # a call's weight in the smoothed call time: about the last twenty calls count


@dataclass(frozen=True)
class StateTaken:
    """A part's state at one moment: what a checkpoint file holds (checkpoints.py)."""

    steps: int  # optimizer steps applied to it
    state: bytes  # StageModel.state_bytes()
    params_sha256: str  # StageModel.state_hash()
    params: Any  # the flat parameter vector (a float32 tensor)


class LocalStage:
    def __init__(self, manifest: Any, role: str, device: str, data_index: int, data_nodes: int) -> None:
        self.manifest = manifest
        self.role = role
        self.device = device
        self.data_index = data_index
        self.data_nodes = data_nodes
        self.model = None  # model.stages.StageModel, once built
        self.source = None  # data nodes: model.data.MicrobatchSource
        self.limiter = trio.CapacityLimiter(1)
        self.compute_s = 0.0  # time inside stage forward/backward/embed/head (not the optimizer step)
        self.compute_cpu_s = 0.0  # the worker thread's CPU time inside them
        self.work_cpu_s: dict[str, float] = {}  # piece of work -> the worker thread's CPU time in it, all calls
        self.aggregation_cpu_s = 0.0  # the process's CPU time in its aggregations, all threads (aggregation.py)
        self.hold_limit = 0  # a relay: the microbatches that fit its device, in flight or held to the step (`build`)
        self.compute_calls = 0
        self.key_compute_s: dict[tuple, float] = {}  # microbatch key -> compute seconds not yet tallied (tally.py)
        self.applied_steps = 0  # optimizer steps applied to this node's part
        self.call_ms: float | None = None  # smoothed time of one stage computation
        self.steps_changed = trio.Event()
        self.work_s: dict[str, float] = {}  # piece of work -> the seconds it took last (module doc)

    @property
    def built(self) -> bool:
        return self.model is not None

    def build(self, stage: int | None) -> None:
        """Build the part of `stage` (a data node: the embedding and the head); in the worker thread.  A relay first
        measures its hold limit: the microbatches that fit its device's free memory now (`memory.hold_limit`, at
        least the one it computes), in flight or their gradients held to the step."""
        from ...model import memory
        from ...model.data import MicrobatchSource
        from ...model.stages import build_stage

        if self.role == "relay":
            dev = str(self.device)
            self.hold_limit = max(1, memory.hold_limit(self.manifest, stage, memory.free_bytes(dev), device=dev))
        self.model = build_stage(self.manifest, self.role, None if self.role == "data" else stage, device=self.device)
        # Equation 1's c_i from the first link measurement on: a profile now, the real calls later
        self.call_ms = self.model.profile_ms() / CALLS_PER_MICROBATCH.get(self.role, 2)
        if self.role == "data":
            self.source = MicrobatchSource.for_manifest(self.manifest, self.data_index, self.data_nodes)

    async def compute(self, fn, *args):
        """Run a stage computation in the torch worker thread; its own time counts as compute (also under the
        microbatch key that is its first argument, written here in the event loop's thread)."""
        spent = [0.0]

        def timed():
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args)
            finally:
                spent[0] = time.perf_counter() - t0
                self.compute_s += spent[0]
                self.compute_cpu_s += time.thread_time() - c0
                self.compute_calls += 1

        try:
            return await trio.to_thread.run_sync(timed, limiter=self.limiter)
        finally:
            if args and isinstance(args[0], tuple):
                self.key_compute_s[args[0]] = self.key_compute_s.get(args[0], 0.0) + spent[0]
                ms = spent[0] * 1000.0
                self.call_ms = ms if self.call_ms is None else \
                    CALL_EWMA_WEIGHT * ms + (1 - CALL_EWMA_WEIGHT) * self.call_ms

    def compute_ms(self) -> float:
        """Compute per microbatch (module doc); 0.0 before the first call."""
        return 0.0 if self.call_ms is None else self.call_ms * CALLS_PER_MICROBATCH.get(self.role, 2)

    async def run(self, fn, *args):
        """Run torch work that is not stage compute (step, snapshot) in the worker thread; timed in `work_s`."""
        def timed():
            t0, c0 = time.perf_counter(), time.thread_time()
            what = getattr(fn, "__name__", "work")
            try:
                return fn(*args)
            finally:
                self.note_work(what, time.perf_counter() - t0)
                self.work_cpu_s[what] = self.work_cpu_s.get(what, 0.0) + time.thread_time() - c0

        return await trio.to_thread.run_sync(timed, limiter=self.limiter)

    def note_work(self, what: str, seconds: float) -> None:
        self.work_s[what] = seconds

    def busiest_s(self) -> float:
        """The longest piece of work measured here: a microbatch's compute or the last of each `work_s`."""
        return max([self.compute_ms() / 1000.0, *self.work_s.values()])

    def hidden_size_mb(self) -> float:
        """Size of one microbatch's activation in MB (in the run's wire dtype): the `size` of Equation 1 (known
        from the manifest before the stage is built: a joiner measures its links with it)."""
        from ...model.precision import wire_bytes

        m = self.manifest
        return m.data.microbatch_size * m.data.seq_len * m.dims.hidden * wire_bytes(m.train.wire_dtype) / 1e6

    def unpack(self, msg: Any, payload, what: str):
        """The activation or gradient a frame carries, checked against this stage's shape and dtype."""
        from ...model.tensors import TensorError, unpack

        if msg.tensor is None:
            raise FrameRefused(f"{what} without a tensor header")
        try:
            return unpack(msg.tensor, payload, expect_shape=self.model.expected_hidden_shape(
                self.manifest.data.microbatch_size), expect_dtype=self.model.wire_dtype)
        except TensorError as e:
            raise FrameRefused(f"{what} tensor refused: {e}") from None

    # ------------------------------------------------------------------ steps and state
    def apply_step(self, total, count: int, iteration: int) -> bool:
        """The optimizer step and its count, together (a state snapshot sees both or neither).  False, and no step,
        when the state already holds it: a state downloaded while the all-reduce ran (a repair, cutcheck.py)."""
        if self.applied_steps > iteration:
            log.warning("iteration %d: the state installed meanwhile holds %d steps: its step is not applied again",
                        iteration, self.applied_steps)
            return False
        self.model.apply_mean_grad(total, count)
        self.applied_steps = iteration + 1
        trim()  # (the microbatches' held gradients and the step's temporaries are free now: ops/heap.py)
        return True

    def steps_done(self) -> None:
        """Wake whoever waits for the steps to change (a state request waiting for a step)."""
        self.steps_changed.set()
        self.steps_changed = trio.Event()

    async def wait_steps(self, at_least: int, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            while self.applied_steps < at_least:
                await self.steps_changed.wait()

    def install(self, state: bytes, steps: int) -> None:
        """Load a part's state (`state_bytes()`, from a checkpoint) holding `steps` steps; in the worker thread."""
        self.model.load_state_bytes(state)
        self.applied_steps = steps

    def set_steps(self, steps: int) -> None:
        """A state was installed (downloaded, or the run's initial weights) with `steps` steps applied."""
        self.applied_steps = steps

    def snapshot(self) -> tuple[int, bytes]:
        return self.applied_steps, self.model.state_bytes()

    def take_state(self) -> StateTaken | None:
        """This part's state as a checkpoint holds it (checkpointer.py); in the worker thread, so it is consistent."""
        if self.model is None:
            return None
        return StateTaken(self.applied_steps, self.model.state_bytes(), self.model.state_hash(),
                          self.model.param_vector())

    def status(self) -> StageStatus:
        """What the status shows of this node's part (snapshots.py): copies, built now."""
        return StageStatus(self.device, self.compute_s, self.compute_calls, self.compute_ms(), self.applied_steps,
                           dict(self.work_s), self.compute_cpu_s, dict(self.work_cpu_s), self.aggregation_cpu_s,
                           self.hold_limit)

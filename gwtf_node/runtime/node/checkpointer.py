"""When and how this node's part is checkpointed: after a step, in the background; at the end, at once.

After the step of every `every`-th iteration the part's state is taken in
the stage's worker thread (the parameters and optimizer state serialized to
bytes, their hash and parameter vector: a consistent picture, a fraction of
a second for a 28M-parameter stage) and written to its file in a thread of
its own (checkpoints.py: sha256, the file, fsync, rename: seconds, and tens
of seconds when every node of a local swarm writes hundreds of MB at once)
while the next iteration runs.  The step is over, and the phase signals go
on, once the state is taken, not once it is on disk: the next iteration's
microbatches only read the parameters, and its step changes them after the
state was taken.  One write at a time.  On the CPU the next iteration's
all-reduce starts once the write is done (`before_all_reduce`), so the state
held for it overlaps the microbatches, never the all-reduce's buffers (what
model/memory.py counts).  On a GPU (`overlap`) the state taken is in host
memory and the all-reduce's buffers on the device: the all-reduce does not
wait for the file, and a checkpoint that comes due while the write before it
is still in flight is skipped (logged; the next one due is taken), so that
neither the all-reduce nor the step waits for a disk slower than an
iteration (a 1 GB state a few seconds, against iterations of 2-3 s).

A node that stops or leaves writes its last state at once (`write_now`,
which waits for a write in flight; the same steps are not written twice).
A crash while a write is in flight leaves the checkpoint before it (the
file is renamed into place whole), as a crash during a write did when it
held up the step: a relay back from a crash compares its checkpoint's steps
with its stage (resume.py).

A write that fails (a full disk, a directory made unwritable while the node
runs) is a WARNING: the node trains on, and its newest good checkpoint stays
what a restart resumes from.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import trio

from . import checkpoints
from ..ops.heap import trim
from .stage import LocalStage, StateTaken

log = logging.getLogger("gwtf.node")


class Checkpointer:
    def __init__(self, stage: LocalStage, state_dir: Path, stage_of: Callable[[], int | None], *, every: int,
                 keep: int = checkpoints.KEEP, overlap: bool | None = None) -> None:
        self.stage = stage
        self.state_dir = state_dir
        self.stage_of = stage_of  # this relay's stage now (None: a data node's part)
        self.every = every  # after the step of every `every`-th iteration (0: only when the node stops)
        self.keep = keep
        self._lock = threading.RLock()  # one file write at a time, from the background or at once
        self._idle = trio.Event()  # no background write in flight
        self._idle.set()
        self.written_steps: int | None = None  # the steps of the newest checkpoint written here
        self.last_write_s = 0.0  # how long the last write took (its file, after the state was taken)
        # (module doc) None: the part's device says: a GPU holds the all-reduce apart from the state taken
        self.overlap = str(stage.device).split(":")[0] != "cpu" if overlap is None else overlap
        self.skipped = 0  # checkpoints skipped because the write before was still in flight (`overlap`)

    def due(self, iteration: int) -> bool:
        return bool(self.every) and (iteration + 1) % self.every == 0

    async def after_step(self, spawn: Callable) -> float:
        """Take the state in the worker (after the write before it is done) and write it in the background through
        `spawn` (the node's nursery); the seconds the step waited for it."""
        t0 = time.perf_counter()
        if self.overlap and not self._idle.is_set():
            self.skipped += 1
            log.info("checkpoint of %d steps skipped: the one before is still being written (the last write took "
                     "%.1f s); the next one due is taken", self.stage.applied_steps, self.last_write_s)
            return 0.0
        await self._idle.wait()  # (the all-reduce before waited for it: nothing in flight, but a write at a leave)
        taken = await self.stage.run(self.stage.take_state)
        if taken is not None:
            self._idle = trio.Event()
            spawn(self._write_in_background, [taken])  # (in a list: the write frees it, module doc of ops/heap.py)
        return time.perf_counter() - t0

    async def before_all_reduce(self) -> None:
        """On the CPU, until the write in flight is done (module doc); on a GPU at once."""
        if not self.overlap:
            await self._idle.wait()

    async def _write_in_background(self, held: list[StateTaken]) -> None:
        try:  # (a thread is not cancelled: a node that stops waits for its file, then writes its last state)
            await trio.to_thread.run_sync(self._write_and_free, held)
        finally:
            self._idle.set()

    def _write_and_free(self, held: list[StateTaken]) -> None:
        """`_write` the state `held` holds, then free it and give its pages back (ops/heap.py)."""
        self._write(held.pop())
        trim()

    def write_now(self) -> None:
        """The part's state now, written before this returns (after a write in flight); in the worker thread or when
        the node has stopped.  Nothing is written when the newest checkpoint holds the same steps."""
        with self._lock:
            if self.written_steps is not None and self.written_steps == self.stage.applied_steps:
                return
            taken = self.stage.take_state()
            if taken is not None:
                self._write(taken)

    def _write(self, taken: StateTaken) -> None:
        with self._lock:
            t0 = time.perf_counter()
            try:
                checkpoints.write(self.state_dir, run_id=self.stage.manifest.run_id, role=self.stage.role,
                                  stage=None if self.stage.role == "data" else self.stage_of(), steps=taken.steps,
                                  state=taken.state, params_sha256=taken.params_sha256, params=taken.params,
                                  keep=self.keep)
            except OSError as e:
                where = e.filename or self.state_dir
                log.warning("could not write a checkpoint (%s: %s): training goes on; a restart resumes from the "
                            "newest checkpoint written before", where, e.strerror or e)
                return
            self.written_steps = taken.steps
            self.last_write_s = time.perf_counter() - t0
            log.debug("checkpoint of %d steps: %.0f MB written in %.2f s", taken.steps, len(taken.state) / 1e6,
                      self.last_write_s)

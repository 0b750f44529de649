"""A checkpoint after a step is taken at once and written in the background, one write at a time
(runtime/node/checkpointer.py): the step does not wait for the file, the file holds the state of the moment it
was taken, and a node that stops writes its last state after the write in flight."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import trio

from gwtf_node.model.manifest import default_manifest
from gwtf_node.runtime.node import checkpointer as ckmod
from gwtf_node.runtime.node import checkpoints
from gwtf_node.runtime.node.checkpointer import Checkpointer
from gwtf_node.runtime.node.stage import LocalStage


@pytest.fixture
def stage() -> LocalStage:
    s = LocalStage(default_manifest(), "relay", "cpu", 0, 1)
    s.build(0)
    return s


def _step(stage: LocalStage) -> None:
    """One optimizer step of the part (a gradient of ones), counted as the stage counts them."""
    stage.apply_step(torch.ones_like(stage.model.grad_vector()), 1, stage.applied_steps)


class _HeldWrites:
    """checkpoints.write, held until the test lets it go (so the test sees what happens while a file is written)."""

    def __init__(self, monkeypatch) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.calls: list[int] = []
        real = checkpoints.write

        def held(*a, **kw):
            self.calls.append(kw["steps"])
            self.started.set()
            assert self.release.wait(60), "the test never released the write"
            return real(*a, **kw)

        monkeypatch.setattr(ckmod.checkpoints, "write", held)


@pytest.mark.trio
async def test_the_step_goes_on_while_the_file_is_written_and_the_file_holds_the_state_taken(
        tmp_path: Path, stage: LocalStage, monkeypatch) -> None:
    held = _HeldWrites(monkeypatch)
    ck = Checkpointer(stage, tmp_path, lambda: 0, every=1)
    _step(stage)
    taken_hash = stage.model.state_hash()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await ck.after_step(nursery.start_soon)  # returns with the write held: the step does not wait for it
        assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").glob("*.pt"))
        _step(stage)  # the next iteration's step changes the live part while the file is being written
        assert stage.model.state_hash() != taken_hash
        held.release.set()
    ck_file = checkpoints.newest(tmp_path, run_id=stage.manifest.run_id)
    assert ck_file is not None and ck_file.steps == 1 and ck_file.params_sha256 == taken_hash
    assert ck.written_steps == 1


@pytest.mark.trio
async def test_one_write_at_a_time_and_the_last_state_after_the_one_in_flight(
        tmp_path: Path, stage: LocalStage, monkeypatch) -> None:
    held = _HeldWrites(monkeypatch)
    ck = Checkpointer(stage, tmp_path, lambda: 0, every=1, keep=5)
    _step(stage)
    async with trio.open_nursery() as nursery:
        await ck.after_step(nursery.start_soon)
        await trio.to_thread.run_sync(held.started.wait, 30)
        _step(stage)
        second = trio.Event()

        async def next_step() -> None:
            await ck.after_step(nursery.start_soon)
            second.set()

        nursery.start_soon(next_step)
        await trio.sleep(0.3)
        assert not second.is_set() and held.calls == [1]  # the second state waits for the first file
        held.release.set()
        with trio.fail_after(60):
            await second.wait()
    assert held.calls == [1, 2]
    _step(stage)
    await trio.to_thread.run_sync(ck.write_now)  # the node stops: its last state, written at once
    await trio.to_thread.run_sync(ck.write_now)  # the same steps again: nothing written
    assert held.calls == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.pt")) == [
        "step-00000001.pt", "step-00000002.pt", "step-00000003.pt"]


def test_the_checkpoint_after_every_nth_iteration() -> None:
    ck = Checkpointer(None, Path("."), lambda: 0, every=3, overlap=False)  # type: ignore[arg-type]
    assert [ck.due(i) for i in range(6)] == [False, False, True, False, False, True]
    assert not any(Checkpointer(None, Path("."), lambda: 0, every=0, overlap=False).due(i)  # type: ignore
                   for i in range(4))


@pytest.mark.trio
async def test_on_a_gpu_the_all_reduce_does_not_wait_for_the_file_and_a_checkpoint_due_meanwhile_is_skipped(
        tmp_path: Path, stage: LocalStage, monkeypatch) -> None:
    """`overlap` (a GPU: the state taken in host memory, the all-reduce's buffers on the device), set by hand on this
    CPU stage; on the CPU (the default here) the all-reduce waits for the file."""
    assert not Checkpointer(stage, tmp_path, lambda: 0, every=1).overlap  # (cpu)
    held = _HeldWrites(monkeypatch)
    ck = Checkpointer(stage, tmp_path, lambda: 0, every=1, overlap=True)
    cpu = Checkpointer(stage, tmp_path, lambda: 0, every=1)
    _step(stage)
    async with trio.open_nursery() as nursery:
        await ck.after_step(nursery.start_soon)
        await trio.to_thread.run_sync(held.started.wait, 30)
        with trio.fail_after(5):
            await ck.before_all_reduce()  # the write is held, the all-reduce goes on
        _step(stage)
        with trio.fail_after(5):
            assert await ck.after_step(nursery.start_soon) == 0.0  # due, but the write before is in flight
        assert ck.skipped == 1 and held.calls == [1]
        cpu._idle = trio.Event()  # a CPU part with a write in flight: its all-reduce waits until the file is done
        waited = trio.Event()

        async def cpu_all_reduce() -> None:
            await cpu.before_all_reduce()
            waited.set()

        nursery.start_soon(cpu_all_reduce)
        await trio.sleep(0.2)
        assert not waited.is_set()
        cpu._idle.set()
        held.release.set()
    assert waited.is_set() and held.calls == [1] and ck.written_steps == 1
    _step(stage)
    async with trio.open_nursery() as nursery:  # nothing in flight: the next one due is taken and written
        await ck.after_step(nursery.start_soon)
    assert held.calls == [1, 3] and ck.written_steps == 3


@pytest.mark.trio
async def test_the_state_taken_is_freed_once_written_and_the_heap_trimmed_then_and_after_each_step(
        tmp_path: Path, stage: LocalStage, monkeypatch) -> None:
    """The checkpoint's state (hundreds of MB for a large stage) is let go once its file is written, and the heap's
    free pages are given back then and after every step (ops/heap.py), so that a relay's RSS does not keep them."""
    import weakref

    from gwtf_node.runtime.node import stage as stagemod

    trims: list[str] = []
    monkeypatch.setattr(stagemod, "trim", lambda: trims.append("step"))
    taken: list[weakref.ref] = []
    monkeypatch.setattr(ckmod, "trim", lambda: trims.append(f"checkpoint, state freed: {taken[0]() is None}"))
    real_write = ckmod.Checkpointer._write

    def write(self, state):
        taken.append(weakref.ref(state))
        real_write(self, state)

    monkeypatch.setattr(ckmod.Checkpointer, "_write", write)
    ck = Checkpointer(stage, tmp_path, lambda: 0, every=1)
    _step(stage)
    assert trims == ["step"]
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await ck.after_step(nursery.start_soon)
    # nothing holds the state taken once its file is written, when the heap is trimmed
    assert trims == ["step", "checkpoint, state freed: True"] and ck.written_steps == 1

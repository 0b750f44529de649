"""kill -USR1: every task of the node and where it waits, in the log (runtime/ops/taskdump.py)."""

from __future__ import annotations

import logging
import os

import pytest
import trio

from gwtf_node.runtime.ops import taskdump


async def _parked(event: trio.Event) -> None:
    await event.wait()


@pytest.mark.trio
async def test_dump_names_every_task_and_where_it_waits():
    event = trio.Event()
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as inner:
            inner.start_soon(_parked, event, name="parked-one")
            await trio.sleep(0.01)
            text = taskdump.dump()
            event.set()
        outer.cancel_scope.cancel()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "task parked-one")
    frames = []
    for line in lines[at + 1:]:
        if line.strip().startswith("task "):
            break
        frames.append(line.strip())
    assert frames[0].startswith("await tests/runtime/test_taskdump.py:") or "test_taskdump.py" in frames[0]
    assert frames[0].endswith("in _parked")
    assert any(f.endswith("in wait") for f in frames)  # trio.Event.wait, where it is suspended
    assert not any("_traps.py" in f for f in frames)  # trio's own two suspension frames are left out
    depth = len(lines[at]) - len(lines[at].lstrip())
    assert depth >= 4  # under the test's task, under the nurseries' owner: indented by depth
    assert lines[0].startswith("task ")  # the root task first


@pytest.mark.trio
async def test_dump_is_cut_at_max_lines(monkeypatch):
    monkeypatch.setattr(taskdump, "MAX_LINES", 5)
    event = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(_parked, event, name=f"p{i}")
        await trio.sleep(0.01)
        text = taskdump.dump()
        event.set()
    lines = text.splitlines()
    assert len(lines) <= 6
    assert "more lines left out: over 5" in lines[-1]


@pytest.mark.trio
async def test_sigusr1_writes_the_dump_to_the_log(caplog):
    caplog.set_level(logging.WARNING, logger="gwtf.node")
    event = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(taskdump.answer_signals)
        nursery.start_soon(_parked, event, name="waiting-here")
        await trio.sleep(0.01)
        os.kill(os.getpid(), taskdump.SIGNAL)
        with trio.fail_after(5):
            while not any("task dump" in r.getMessage() for r in caplog.records):
                await trio.sleep(0.01)
        event.set()
        nursery.cancel_scope.cancel()
    msg = next(r.getMessage() for r in caplog.records if "task dump" in r.getMessage())
    assert "task waiting-here" in msg
    assert "tasks:" in msg.splitlines()[0]

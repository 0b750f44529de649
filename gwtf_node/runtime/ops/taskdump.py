"""What every task of a running node waits on: `kill -USR1 <pid>` writes it to the log.

A node that looks stuck (no frame in, no progress, yet alive and idle) is
waiting somewhere: on a read, a lock, a channel, a semaphore inside the
networking library.  A Python stack sampler shows only the thread running
now, which in an idle trio program is the event loop's poll.  This module
walks trio's task tree instead, from the root task through every nursery,
and gives each task's chain of awaits down to the frame where it is
suspended (`Task.iter_await_frames`), innermost last:

    task libp2p.network.connection.swarm_connection.SwarmConn._handle_muxed_stream
      await libp2p/host/basic_host.py:1554 in _swarm_stream_handler
      await gwtf_node/runtime/net/host.py:456 in _read_ctrl_stream
      await libp2p/stream_muxer/yamux/yamux.py:1147 in read_stream

`answer_signals` is the task that answers SIGUSR1 (the node starts it
first, node.py `_run_locked`); `dump()` returns the text, for tests and for
callers that want it elsewhere.  The dump goes to the log at WARNING with one line per task
or frame; its length is bounded by `MAX_LINES` (a node with thousands of
tasks says how many it left out).
"""

from __future__ import annotations

import logging
import os
import signal

import trio

log = logging.getLogger("gwtf.node")

MAX_LINES = 4000  # a dump longer than this is cut, saying how many lines were left out
SIGNAL = signal.SIGUSR1
_TRAPS = os.path.join("trio", "_core", "_traps.py")


def _frames(task: trio.lowlevel.Task) -> list[str]:
    out = []
    for frame, lineno in task.iter_await_frames():
        code = frame.f_code
        if code.co_filename.endswith(_TRAPS):  # trio's own suspension: the same two frames in every task
            continue
        out.append(f"await {_short(code.co_filename)}:{lineno} in {code.co_name}")
    return out


def _short(path: str) -> str:
    """`path` from its package on (.../site-packages/libp2p/x.py -> libp2p/x.py), else as given."""
    site = path.rfind("site-packages" + os.sep)
    if site >= 0:
        return path[site + len("site-packages" + os.sep):]
    ours = path.rfind("gwtf_node" + os.sep)
    return path[ours:] if ours >= 0 else path


def dump(root: trio.lowlevel.Task | None = None) -> str:
    """Every task under `root` (the root task by default) with the frames it waits in, indented by depth."""
    lines: list[str] = []
    left_out = 0
    stack = [(root or trio.lowlevel.current_root_task(), 0)]
    while stack:
        task, depth = stack.pop()
        if task is None:
            continue
        block = [f"{'  ' * depth}task {task.name}"] + [f"{'  ' * (depth + 1)}{f}" for f in _frames(task)]
        if len(lines) + len(block) > MAX_LINES:
            left_out += len(block)
        else:
            lines.extend(block)
        children = [t for n in task.child_nurseries for t in n.child_tasks]
        stack.extend((t, depth + 1) for t in sorted(children, key=lambda t: t.name, reverse=True))
    if left_out:
        lines.append(f"({left_out} more lines left out: over {MAX_LINES})")
    return "\n".join(lines)


async def answer_signals(task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Write `dump()` to the log on every SIGUSR1 until cancelled."""
    with trio.open_signal_receiver(SIGNAL) as signals:
        task_status.started()
        async for _ in signals:
            text = dump()
            tasks = sum(1 for line in text.splitlines() if line.lstrip().startswith("task "))
            log.warning("task dump (SIGUSR1), %d tasks:\n%s", tasks, text)


__all__ = ["MAX_LINES", "SIGNAL", "answer_signals", "dump"]

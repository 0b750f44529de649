"""Event-loop lag: how late the node's trio loop answers, and which task step held it.

Everything a node says to its peers (Pongs, phase signals, Hellos) is sent
from the event loop's thread, so a loop that does not run for a while makes
the node look dead (liveness.py).  Two measures:

* `LoopLag.loop`: a task that sleeps `TICK_S` and records how late it
  wakes: the lag.  `max_lag_s` (since start), `last_lag_s` and `stalls`
  (wake-ups later than `STALL_S`) go to status.json (`event_loop`), and a
  lag over `STALL_S` is logged as a warning with the slowest task step seen
  since the last tick.
* a watchdog thread: when the probe has not woken for `WATCHDOG_S`, it
  logs once, per stall, the stack of the event loop's thread (what it is
  doing now: a blocking call in the loop shows up there, a loop that waits
  for the GIL shows the line it waits at).
* `StepTimer`, a trio instrument (`trio.lowlevel.add_instrument`): it times
  every task step (the code a task runs between two awaits, in the event
  loop's thread) and keeps the slowest since the last tick: the task's name
  and where it next waited (the innermost coroutine frame), which is just
  after the code that held the loop.  Its cost is two clock reads per step.

A lag can also come from outside the loop: a worker thread that holds the
GIL, or other processes on the same cores.  The slowest step then stays
short while the lag is long; the warning says both.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

import trio

log = logging.getLogger("gwtf.node")

TICK_S = 0.1  # the lag probe sleeps this long between wake-ups
STALL_S = 1.0  # a wake-up this late is a stall: counted and logged
WATCHDOG_S = 2.0  # the probe this late: the watchdog logs the loop thread's stack


def _where(task: trio.lowlevel.Task) -> str:
    """file:line of the innermost coroutine frame of `task` (where it waits now)."""
    coro = task.coro
    frame = None
    while coro is not None:
        f = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if f is None:
            break
        frame = f
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} ({frame.f_code.co_name})"


class StepTimer(trio.abc.Instrument):
    """Times each task step; keeps the slowest since `take()` (its seconds, task name and where it waited next)."""

    def __init__(self) -> None:
        self._t0: float | None = None  # (None: the step under way began before the instrument was added)
        self.slowest: tuple[float, str, str] = (0.0, "", "")
        self.max_step_s = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._t0 = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._t0 is None:
            return
        dt = time.perf_counter() - self._t0
        if dt > self.slowest[0]:
            self.slowest = (dt, task.name, _where(task) if dt >= STALL_S / 4 else "")
            self.max_step_s = max(self.max_step_s, dt)

    def take(self) -> tuple[float, str, str]:
        s, self.slowest = self.slowest, (0.0, "", "")
        return s


class LoopLag:
    """The lag probe (module doc); `snapshot()` is status.json's `event_loop`."""

    def __init__(self, steps: bool = True) -> None:
        self.max_lag_s = 0.0
        self.last_lag_s = 0.0
        self.stalls = 0
        self.timer = StepTimer() if steps else None

    async def loop(self) -> None:
        if self.timer is not None:
            trio.lowlevel.add_instrument(self.timer)
        stop = threading.Event()
        self._woke = time.perf_counter()
        dog = threading.Thread(target=self._watchdog, args=(threading.get_ident(), stop), daemon=True,
                               name="gwtf-loop-watchdog")
        dog.start()
        try:
            while True:
                t0 = self._woke = time.perf_counter()
                await trio.sleep(TICK_S)
                lag = max(0.0, time.perf_counter() - t0 - TICK_S)
                self.last_lag_s = lag
                self.max_lag_s = max(self.max_lag_s, lag)
                step = self.timer.take() if self.timer is not None else (0.0, "", "")
                if lag >= STALL_S:
                    self.stalls += 1
                    log.warning("event loop stalled %.2f s (slowest task step %.2f s: %s at %s)", lag, step[0],
                                step[1] or "?", step[2] or "?")
        finally:
            stop.set()
            if self.timer is not None:
                try:
                    trio.lowlevel.remove_instrument(self.timer)
                except KeyError:
                    pass

    def _watchdog(self, loop_thread: int, stop: threading.Event) -> None:
        logged_for = None
        while not stop.wait(WATCHDOG_S / 4):
            woke = self._woke
            late = time.perf_counter() - woke - TICK_S
            if late < WATCHDOG_S or logged_for == woke:
                continue
            logged_for = woke
            frame = sys._current_frames().get(loop_thread)
            stack = "".join(traceback.format_stack(frame, limit=8)) if frame is not None else "?"
            log.warning("event loop held for %.1f s so far; its thread is at:\n%s", late, stack.rstrip())

    def snapshot(self) -> dict:
        return {"max_lag_s": round(self.max_lag_s, 3), "last_lag_s": round(self.last_lag_s, 3),
                "stalls": self.stalls,
                "max_step_s": round(self.timer.max_step_s, 3) if self.timer is not None else None}

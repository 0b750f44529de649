"""Timers of the daemon's components: deadlines keyed by (component, key), fired by one task (node.py)."""

from __future__ import annotations

from typing import Callable

import trio

from ..protocol.effects import TimerKey
from .wire import Owner


class Timers:
    """Deadlines keyed by (component, key); a timer set again under the same key replaces the earlier one."""

    def __init__(self, fire: Callable[[Owner, TimerKey], None]) -> None:
        self.fire = fire
        self.deadlines: dict[tuple[Owner, TimerKey], float] = {}
        self.wake = trio.Event()

    def set(self, key: tuple[Owner, TimerKey], deadline: float) -> None:
        self.deadlines[key] = deadline
        self.wake.set()

    def cancel(self, key: tuple[Owner, TimerKey]) -> None:
        self.deadlines.pop(key, None)

    async def loop(self) -> None:
        while True:
            self.wake = trio.Event()
            if self.deadlines:
                key = min(self.deadlines, key=self.deadlines.get)
                deadline = self.deadlines[key]
                with trio.move_on_at(deadline):
                    await self.wake.wait()
                    continue
                if self.deadlines.get(key) == deadline:
                    del self.deadlines[key]
                    self.fire(*key)
            else:
                await self.wake.wait()

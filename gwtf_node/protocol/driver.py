"""The driver: what carries out a machine's effects, one interface that the daemon and the simulator each implement.

Theory of operation
-------------------
A machine returns effects (`effects.py`); the component that owns the machine
hands them to `carry_out` with its `Driver` and its own handlers.  The
effects every machine may return go to the driver: `Send` (`send`),
`SetTimer` / `CancelTimer` (`set_timer`, `cancel_timer`, under the machine's
own key: a driver keeps one machine's timers apart from another's) and the
recovery machine's `Compute` (`compute`: run the computation, then tell the
machine `on_compute_done`).  The rest (`OpenIteration`, `IterationSettled`,
`StartStep`, `LeftOut`, `OutOfStep`, `Overdue`) are events of the component
itself: it names a handler for each one its machine may return, and an effect
with neither is refused loudly (`UnknownEffect`): a machine's effect is never
dropped silently.

Effects are carried out in the order the machine returned them.  A driver may
hold back the messages it sends to keep each peer's in order (the daemon
sends the recovery and flow machines' messages to one peer in one task):
`flush` ends a batch and sends what it holds; a driver that sends at once
(the simulator's) has nothing to flush.

The daemon's driver is `runtime/node/driver.py` (frames through the wire,
timers keyed by component, computations on the component's worker); the
simulator's is `sim/train/interpret.py` (virtual links, versioned timer
events, the node's compute queue).  This module is typing and dispatch only:
no I/O.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from .effects import CancelTimer, Send, SetTimer, TimerKey
from .recovery import Compute


class UnknownEffect(TypeError):
    """A machine returned an effect that neither its driver nor its component handles: a bug, never dropped."""


class Driver(Protocol):
    """What carries out one machine's effects (module docstring)."""

    def send(self, to: str, msg: Any) -> None:
        """Send `msg` to peer `to` (a driver that keeps each peer's order may hold it until `flush`)."""

    def set_timer(self, key: TimerKey, deadline: float) -> None:
        """Call the machine back with `key` at `deadline` (replacing a timer set under the same key)."""

    def cancel_timer(self, key: TimerKey) -> None:
        """Forget the timer set under `key`, if any."""

    def compute(self, e: Compute) -> None:
        """Run the computation `e`, then hand the machine `on_compute_done(now, e.key, e.kind)`, or
        `on_compute_failed` where its inputs are gone."""

    def flush(self) -> None:
        """The end of a batch of effects: send the messages held to keep a peer's order."""


Handlers = Mapping[type, Callable[[Any], None]]  # effect type -> the component's handler of it


def carry_out(driver: Driver, effects: list, own: Handlers | None = None, *, what: str = "the machine") -> None:
    """Carry out `effects` in order: the common ones through `driver`, the others through `own` (the component's
    handlers); an effect that neither handles raises `UnknownEffect` (what came before it is done)."""
    try:
        for e in effects:
            t = type(e)
            if t is Send:
                driver.send(e.to, e.msg)
            elif t is SetTimer:
                driver.set_timer(e.key, e.deadline)
            elif t is CancelTimer:
                driver.cancel_timer(e.key)
            elif own is not None and t in own:
                own[t](e)
            elif t is Compute:
                driver.compute(e)
            else:
                raise UnknownEffect(f"{what} returned {e!r}: no component handles it")
    finally:
        driver.flush()

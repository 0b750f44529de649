"""Effects: what a protocol machine asks its driver to do.

Machines never perform I/O.  They return a list of effects that the daemon
(`runtime/`) or the simulator (`sim/`) interprets: send a message to a peer,
or call the machine back at an absolute deadline with a timer key.  A timer
set again under the same key replaces the earlier one.

A timer key is a small frozen value of the machine's own (`TimerKey`: the
recovery machine's `recovery.MbTimer`, the phase's `phases.PhaseTimer`, or a
plain string for machines with a few fixed timers): the driver keeps it as it
is and hands it back to the machine's `on_timer`, never taking it apart.

`Effect` is what every driver interprets the same way for every machine.  Each
machine names the whole of what it returns in one union of its own, these
three and the effects only its driver knows: `recovery.RecoveryEffect` (adds
`Compute`, `OpenIteration`, `IterationSettled`) and `phases.PhaseEffect` (adds
`StartStep`, `OpenIteration`, `LeftOut`, `OutOfStep`, `Overdue`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

TimerKey = Hashable  # a machine's timer key: hashable, compared by value, opaque to the driver


@dataclass(frozen=True, slots=True)
class Send:
    to: str
    msg: Any


@dataclass(frozen=True, slots=True)
class SetTimer:
    key: TimerKey
    deadline: float  # absolute time, in the machine's clock (seconds)


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: TimerKey


Effect = Send | SetTimer | CancelTimer

"""Effects: what a protocol machine asks its driver to do.

Machines never perform I/O.  They return a list of effects that the daemon
(`runtime/`) or the simulator (`sim/`) interprets: send a message to a peer,
or call the machine back at an absolute deadline with a timer key.  A timer
set again under the same key replaces the earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Send:
    to: str
    msg: Any


@dataclass(frozen=True, slots=True)
class SetTimer:
    key: str
    deadline: float  # absolute time, in the machine's clock (seconds)


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: str


Effect = Send | SetTimer | CancelTimer

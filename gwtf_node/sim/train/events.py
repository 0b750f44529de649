"""The training simulator's events, its queue, and which machine a message goes to.

An event is a frozen dataclass under `SimEvent`, one class per kind; `TrainSim.run` takes them out of the
`EventQueue` in (time, push order) and hands each to the handler its type names in one table.  A timer event
carries the version of its key when it was set: a firing whose version is no longer the key's is stale and
does nothing (a timer set again or cancelled since)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from ...protocol.messages import (
    Backward, BeginAggregation, CanTake, Forward, HeartbeatAck, IterationDone, LeaderHeartbeat, PhaseAck, Recover,
    RequestVote, Vote,
)

PHASE_MSGS = (IterationDone, BeginAggregation, CanTake, PhaseAck)  # to the node's Phases
LEADER_MSGS = (RequestVote, Vote, LeaderHeartbeat, HeartbeatAck)  # to a data node's LeaderMachine
TENSOR_MSGS = (Forward, Backward, Recover)  # carry an activation or a gradient: they wait for their link


@dataclass(frozen=True, slots=True)
class SimEvent:
    """Something that happens at one virtual time."""


@dataclass(frozen=True, slots=True)
class Deliver(SimEvent):
    """A message reaches `node` (to its microbatch machine, aggregation phase, election or joining)."""

    node: str
    sender: str
    msg: Any


@dataclass(frozen=True, slots=True)
class MachineTimer(SimEvent):
    """A timer of one of `node`'s machines: `key` is (component, the machine's key), component one of "rec",
    "phase", "leader"."""

    node: str
    key: tuple
    version: int


@dataclass(frozen=True, slots=True)
class ComputeDone(SimEvent):
    """A computation of `node` ends: `kind` (forward, backward, ..., "aggregate": the step) of `key`, which took
    `seconds` from `start`; `token` names it (an all-reduce round's step)."""

    node: str
    kind: str
    key: Any
    seconds: float
    start: float
    token: int


@dataclass(frozen=True, slots=True)
class Crash(SimEvent):
    """`node` crashes (`churn`: drawn by the churn, which may spare it; else scripted)."""

    node: str
    churn: bool = False


@dataclass(frozen=True, slots=True)
class Reflow(SimEvent):
    """Oracle or DT-FM routing: the flows settle (`members`: relay -> (stage, capacity), None: the live ones)."""

    members: dict | None = None


@dataclass(frozen=True, slots=True)
class Gone(SimEvent):
    """The membership layer reports `node` gone: to every node but `later`, or (`late`) only to `later`."""

    node: str
    later: tuple[str, ...] = ()  # nodes that learn of it later (churn.py's `_crash`)
    late: bool = False


@dataclass(frozen=True, slots=True)
class Rejoin(SimEvent):
    """Crashed relay `node` is back as a joiner (`joining="restart"`: its download finished)."""

    node: str


@dataclass(frozen=True, slots=True)
class FlowDeliver(SimEvent):
    """A flow machine's message reaches `node`."""

    node: str
    sender: str
    msg: Any


@dataclass(frozen=True, slots=True)
class FlowTimer(SimEvent):
    """A flow machine's timer."""

    node: str
    key: Any
    version: int


@dataclass(frozen=True, slots=True)
class PoolDeliver(SimEvent):
    """A pooled machine's message reaches machine `role` of `node` (pooling.py)."""

    node: str
    role: str
    sender: str  # the sending machine's id (poolnodes.py)
    msg: Any


@dataclass(frozen=True, slots=True)
class PoolTimer(SimEvent):
    """A pooled machine's timer: `key` is ((POOLED, role), the machine's key)."""

    node: str
    key: Any
    version: int


@dataclass(frozen=True, slots=True)
class StepRetry(SimEvent):
    """An all-reduce round waited ALLREDUCE_TIMEOUT_S for a named member that does not step."""

    key: tuple


@dataclass(frozen=True, slots=True)
class JoinLookup(SimEvent):
    """Joiner `node` looks the leader up in the DHT."""

    node: str


@dataclass(frozen=True, slots=True)
class JoinTimer(SimEvent):
    """A timer of a joiner's or a leader's membership machine (`key`: (component, the machine's key))."""

    node: str
    key: tuple
    version: int


@dataclass(frozen=True, slots=True)
class StateArrives(SimEvent):
    """A stage state of `steps` steps from `source` reaches `node`."""

    node: str
    steps: int
    source: str


@dataclass(frozen=True, slots=True)
class LeaveWaited(SimEvent):
    """Leaving relay `node` waited `leave_wait_s` for the aggregation of `iteration`, its last (churn.py)."""

    node: str
    iteration: int


@dataclass(frozen=True, slots=True)
class Halt(SimEvent):
    """`TrainSim.run(until=...)` stops here (`token`: that call's)."""

    token: int


class EventQueue:
    """The events to come and the virtual clock: events of equal time come out in the order they were pushed."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, SimEvent]] = []
        self._seq = 0

    def push(self, t: float, event: SimEvent) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, event))

    def pop(self, t_limit: float) -> SimEvent | None:
        """The next event, with the clock moved to its time; None when the queue is empty or the next event is
        after `t_limit` (then it is dropped and the clock stays)."""
        if not self._heap:
            return None
        t, _, event = heapq.heappop(self._heap)
        if t > t_limit:
            return None
        self.now = t
        return event

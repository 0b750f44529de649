"""The kinds of events in the training simulator's queue, and which machine a message goes to."""

from __future__ import annotations

import enum

from ...protocol.messages import (
    Backward, BeginAggregation, CanTake, Forward, HeartbeatAck, IterationDone, LeaderHeartbeat, PhaseAck, Recover,
    RequestVote, Vote,
)

PHASE_MSGS = (IterationDone, BeginAggregation, CanTake, PhaseAck)  # to the node's Phases
LEADER_MSGS = (RequestVote, Vote, LeaderHeartbeat, HeartbeatAck)  # to a data node's LeaderMachine
TENSOR_MSGS = (Forward, Backward, Recover)  # carry an activation or a gradient: they wait for their link


class Event(enum.IntEnum):
    """What an event in the queue is (the engine orders by time, then by push order)."""

    MSG = 0  # a message reaches `node` (a: sender, b: message)
    TIMER = 1  # a timer of one of `node`'s machines (a: (component, key), b: its version)
    DONE = 2  # a computation of `node` ends (a: (kind, key, seconds, start), b: its token)
    CRASH = 3  # `node` crashes
    REFLOW = 4  # oracle routing: the flows settle (a: the members)
    GONE = 5  # the membership layer reports `node` gone
    JOIN = 6  # the joiner replacing `node` finished its download
    FLOW_MSG = 7  # a flow machine's message
    FLOW_TIMER = 8  # a flow machine's timer
    RESYNC = 9  # `node` loaded its stage's state after the step of iteration `a`

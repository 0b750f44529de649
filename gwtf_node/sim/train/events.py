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
    JOIN = 6  # crashed relay `node` is back as a joiner (`joining="restart"`: its download finished)
    FLOW_MSG = 7  # a flow machine's message
    FLOW_TIMER = 8  # a flow machine's timer
    STEP_RETRY = 9  # an all-reduce round waited ALLREDUCE_TIMEOUT_S for a named member that does not step (a: key)
    JOIN_LOOKUP = 10  # joiner `node` looks the leader up in the DHT
    JOIN_TIMER = 11  # a timer of a joiner's or a leader's membership machine (a: (component, key), b: its version)
    STATE = 12  # a stage state reaches `node` (a: its steps, b: the source)
    LEAVE = 13  # leaving relay `node` waited `leave_wait_s` for its last aggregation (a: that iteration; churn.py)
    HALT = 14  # `TrainSim.run(until=...)` stops here (b: its token)

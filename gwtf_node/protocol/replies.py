"""The enums of the flow messages (`messages.py` re-exports them): which label side, a request's outcome,
why a unit is denied.  Each mirrors the proto enum of the same meaning in `protos/gwtf.proto`."""

from __future__ import annotations

import enum


class Side(enum.IntEnum):
    IN = 1  # cost for a new unit handed to this node
    OUT = 2  # cost for this node to send one unit it holds onwards


class Reply(enum.IntEnum):
    """Outcome of a request; mirrors the proto enum `Outcome`."""

    APPROVED = 1  # "Done: the unit / move is yours."
    COST_CHANGED = 2  # "My cost is not what you expected; here is the current one."
    NO_CAPACITY = 3  # "I have no room and no cheaper way to make room."
    NO_SUCH_FLOW = 4  # "I do not carry the flow you named (any more)."
    NOT_IMPROVING = 5  # "By my numbers the move does not lower the cost."
    BUSY = 6  # "I am in the middle of another move; ask again later."
    NOT_LINKED = 7  # "I have no link to a node the move needs."


class DenyReason(enum.IntEnum):
    NO_ROUTE = 1  # "I cannot forward this unit: take it back and route it elsewhere."
    DISPLACED = 2  # "A cheaper unit took your place here: route yours elsewhere."

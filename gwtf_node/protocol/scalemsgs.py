"""Messages of scaled formation: Goldberg-Tarjan cost scaling by one machine a node (flow/scaling.py).

A *side* is `(kind, node)`: a relay's `in` and `out` sides, a data node's
`source` and `sink`.  A push moves `amount` along the residual arc
`tail -> head` and carries the tail's price; a message names the kinds of its
sides only (the sender's and the receiver's nodes are the others); `phase` and `eps` let a node that
hears of a phase first from a push start it then.  `credit` is the share of
the phase's credit the message carries, an exact fraction written "n/d" (Huang's
weight throwing: the phase ends when all of it is back at the data node);
`ScalePhase` also carries `alpha`, the factor every node scales its link costs
by.  A push or refusal from a link's upstream end carries the link's cost as
that end holds it, and the downstream end takes it: both ends must price the
link alike (a push one end finds admissible and the other not would go back
and forth for ever), and the daemon's two ends may have measured it apart.

`seq` numbers what a node sends one peer (from 1; 0: unnumbered), so that the
receiver takes each message once and asks for a lost one (`ScaleNack`,
`ScaleProbe`); `ack` says up to which number the sender took the receiver's
(flow/resend.py).
"""

from __future__ import annotations

from dataclasses import dataclass

SIDE_KINDS = ("in", "out", "source", "sink")
UPSTREAM = ("out", "source")  # the kinds of a link's upstream side: a message from it carries the link's cost


@dataclass(frozen=True, slots=True)
class ScalePhase:
    """The data node to every node: refine with this epsilon; and a share of the phase's credit."""

    number: int
    eps: int
    credit: str
    alpha: int
    seq: int = 0
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScalePush:
    """`amount` along the residual arc tail -> head, at the tail's price."""

    tail: str  # the kind of the tail side (at the sender of a push, at the receiver of a refusal)
    head: str
    amount: int
    price: int
    phase: int
    eps: int
    credit: str
    cost: int = 0  # from the link's upstream end: the link's cost, which the downstream end takes (`LINK_COST`)
    seq: int = 0
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScaleRefuse:
    """The push came on a stale price (not admissible at the head): the amount goes back, with the head's price;
    or (`gone`) over a link the head does not have (it measured its links without the tail's): the tail drops
    the arc."""

    tail: str  # the kind of the tail side (at the sender of a push, at the receiver of a refusal)
    head: str
    amount: int
    price: int
    phase: int
    eps: int
    credit: str
    gone: bool = False
    cost: int = 0  # as ScalePush's
    seq: int = 0
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScaleCredit:
    """A node with nothing left to do in the phase hands its credit back to the data node."""

    credit: str
    seq: int = 0
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScaleDone:
    """The data node to every node: the last phase ended, the flows are final."""

    phases: int
    seq: int = 0
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScalePrice:
    """Eager prices (the first `eager_phases` phases, every phase by default): a side's new price, told after a
    relabel to the neighbouring nodes that can push to the side (`ScalingMachine.tells`).  No work comes of it, so
    it carries no credit."""

    side: str  # a side of the sender
    price: int


@dataclass(frozen=True, slots=True)
class ScaleAbort:
    """A node whose neighbour left during formation, to the data node; then the data node to every node: formation
    is off, the flow machines form the flows from nothing (label waves)."""

    reason: str
    seq: int = 0
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScaleNack:
    """The receiver of `seqs` never got them (a later one came): send them again.  With none, the receiver got a
    message twice: `ack` says how far it took the sender's (so that probes send them no more, flow/resend.py)."""

    seqs: tuple[int, ...]
    ack: int = 0


@dataclass(frozen=True, slots=True)
class ScaleProbe:
    """A node that heard nothing of formation for a while: send your last message again (and, from the data node,
    to every peer): a lost one arrives, one that came is taken once."""

    phase: int
    last: int  # the numbered messages the sender has sent the receiver: it asks for those it lacks


SCALE_MESSAGES = (ScalePhase, ScalePush, ScaleRefuse, ScaleCredit, ScaleDone, ScalePrice, ScaleAbort, ScaleNack,
                  ScaleProbe)
NUMBERED = (ScalePhase, ScalePush, ScaleRefuse, ScaleCredit, ScaleDone, ScaleAbort)  # carry `seq` (flow/resend.py)

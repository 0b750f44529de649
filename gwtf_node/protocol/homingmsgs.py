"""Messages of pooled formation's homing (flow/pool.py, flow/homing.py).

The pool (the data node that formed the units as one commodity) traces the
units, asks the relays they pass for their link costs, and installs each
unit's route as its data node's (`Install`).  `round` numbers a homing
attempt: a message of an older round is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HomingStart:
    """Pool -> a data node's source side: trace your units (one `TraceUnit` per unit you sent)."""

    round: int


@dataclass(frozen=True, slots=True)
class TraceUnit:
    """One unit, followed downstream: each relay adds itself and passes it on along one of its units not traced
    yet in this round; the sink side adds where it ended and hands it to the pool."""

    round: int
    origin: str  # the data node it left
    path: tuple[str, ...]  # the relays so far
    end: str = ""  # the data node it ended at (set by the sink side)


@dataclass(frozen=True, slots=True)
class CostQuery:
    """Pool -> a relay on some unit's path: your link costs to these peers (either side)."""

    round: int
    peers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CostReply:
    round: int
    costs: tuple[tuple[str, float], ...]  # (peer, d(self, peer)) for each asked peer it has a link to


@dataclass(frozen=True, slots=True)
class Route:
    commodity: str  # the data node whose units these are
    prev: str  # where they come from (a relay, or the data node itself at the first stage)
    next: str  # where they go (a relay, or the data node itself after the last stage)
    count: int


@dataclass(frozen=True, slots=True)
class Install:
    """Pool -> every node on a homed unit's path: the units through you, per data node, from now on."""

    round: int
    routes: tuple[Route, ...]


@dataclass(frozen=True, slots=True)
class PoolFrame:
    """A message between the machines of pooled formation, which a node hosts several of (a data node its source
    side, its sink side and maybe the pool; a relay one): `frame` is an encoded Envelope holding a flow or homing
    message from the sender's `sender_role` to the receiver's `role` ("" for a relay, else "src", "snk",
    "pool")."""

    role: str
    sender_role: str
    frame: bytes

"""Messages of the leader election among the data nodes (leader.py), re-exported by messages.py.

On the wire each one is the protobuf message of the same name in
`protos/gwtf.proto` (codec.py finds them through messages.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestVote:
    """Vote for the sender in `term` (`pre`: would you, without changing anything?)."""

    term: int
    pre: bool
    sent_at: float  # the sender's clock; echoed in the Vote, only the sender compares it
    cfg_term: int = 0  # the candidate's voter set: the term of the leader it came from (voters.py "Voter set")
    cfg_version: int = 0  # ... and its version in that term; a voter grants only to a set at least as new
    lease_s: float = 0.0  # a grant promises no other vote for max(this, the voter's own lease floor)


@dataclass(frozen=True, slots=True)
class Vote:
    """Answer to a RequestVote; a grant promises no other vote for a lease (see leader.py)."""

    term: int  # the term voted for when granted, else the voter's current term
    pre: bool
    granted: bool
    sent_at: float  # echo of RequestVote.sent_at


@dataclass(frozen=True, slots=True)
class LeaderHeartbeat:
    """The leader of `term` renews its lease and shares its voter set (voters.py "Voter set")."""

    term: int
    sent_at: float  # the leader's clock; echoed in the HeartbeatAck
    data_nodes: tuple[str, ...]  # the voters that may lead
    witnesses: tuple[str, ...] = ()  # the voters that only vote (relays, voters.py "Two data nodes: witnesses")
    cfg_version: int = 0  # version of this voter set within `term` (one change per version)
    lease_s: float = 0.0  # an ack promises no other vote for max(this, the voter's own lease floor)


@dataclass(frozen=True, slots=True)
class HeartbeatAck:
    term: int  # the acknowledger's current term
    sent_at: float  # echo of LeaderHeartbeat.sent_at
    ok: bool  # False: the heartbeat's term is stale

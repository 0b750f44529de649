"""The voter set of the leader election: who votes, how it changes, how long a lease lasts.

Pure helpers of `leader.py` (read its "Voter set" section for the rules and
why they are safe).  A voter set is the data nodes (they vote and may lead)
plus *witnesses* (relays that vote but never stand).  Only the acting leader
changes it, one voter per change (`next_change`); followers adopt the set the
leader's heartbeats carry, stamped with the leader's term.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# A voter the leader has not heard from (no HeartbeatAck) for this long is removed from the voter set.
# Long enough that a daemon restarted from its state directory (the same peer id) comes back before it is
# dropped, and many election timeouts (so a lost message or a short partition never churns the set); short
# enough that a run with one of two data nodes gone regains its tolerance of one more failure in half a minute.
VOTER_GONE_S = 30.0

# The voter set aimed for when there are exactly two data nodes: 2 data nodes + 1 witness tolerate one
# failure.  One data node needs no witness (it is the only node that may lead, so a witness adds a failure
# mode and no availability); three or more data nodes are their own odd-or-larger quorum.
TARGET_VOTERS = 3

# The lease is this many times the round trip to the slowest voter of the fastest quorum (at least the
# configured floor): heartbeats go every lease / 4, so a lease spans 4 heartbeats of which any one whose
# ack returns within 2 round trips renews it; a link briefly at twice its usual round trip still renews.
LEASE_RTT_FACTOR = 8.0


@dataclass(frozen=True)
class VoterSet:
    """One version of the voter set, stamped with the term of the leader that sent (or made) it."""

    data: frozenset[str]
    witnesses: frozenset[str]
    term: int = 0  # the term of the leader it came from (0: the initial set)
    version: int = 0  # its version within that term

    @property
    def voters(self) -> frozenset[str]:
        return self.data | self.witnesses

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def stamp(self) -> tuple[int, int]:
        """Raft's (last log term, last log index): a voter grants only to a candidate whose stamp is not older."""
        return self.term, self.version


def witnesses_needed(n_data: int) -> int:
    """Witnesses for a voter set with `n_data` data nodes (see TARGET_VOTERS)."""
    return TARGET_VOTERS - n_data if n_data == 2 else 0


def next_change(cur: VoterSet, me: str, known_data: Iterable[str], relays: Iterable[str],
                left: Iterable[str], gone: Iterable[str]) -> tuple[frozenset[str], frozenset[str]] | None:
    """The next (data, witnesses) the leader `me` moves to, differing from `cur` by one voter, or None.

    In order: add a known data node that is not a voter; remove a voter that left or is gone (never `me`);
    add a witness while there are fewer than `witnesses_needed` (the admitted relay with the lowest peer id
    that is not gone or left); drop a surplus witness (the highest id).  Adding before removing matters
    only for the data nodes; a gone voter is removed before witnesses are trimmed, so a set that still
    counts a dead data node keeps its witness.
    """
    left, gone = set(left), set(gone)
    out = (left | gone) - {me}
    for d in sorted(set(known_data) - cur.voters - out):
        return cur.data | {d}, cur.witnesses
    for v in sorted(cur.voters & out):
        return cur.data - {v}, cur.witnesses - {v}
    need = witnesses_needed(len(cur.data))
    if len(cur.witnesses) < need:
        for r in sorted(set(relays) - cur.voters - out):
            return cur.data, cur.witnesses | {r}
    if len(cur.witnesses) > need:
        return cur.data, cur.witnesses - {max(cur.witnesses)}
    return None


def lease_for_rtts(rtts_s: dict[str, float], voters: Iterable[str], me: str, floor_s: float, cap_s: float) -> float:
    """A lease sized from measured round trips: LEASE_RTT_FACTOR times the round trip to the slowest voter of
    the fastest quorum (this node's own counts as 0; a voter without a measurement is left out), within
    [floor_s, cap_s]."""
    voters = sorted(set(voters))
    quorum = len(voters) // 2 + 1
    rtts = sorted(0.0 if v == me else rtts_s[v] for v in voters if v == me or v in rtts_s)
    if len(rtts) < quorum:
        return floor_s
    return min(cap_s, max(floor_s, LEASE_RTT_FACTOR * rtts[quorum - 1]))

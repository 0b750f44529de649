"""The voter set of the leader election: who votes, how it changes, how long a lease lasts.

Pure helpers of `leader.py`, whose docstring gives the election's theory;
the voter set's part of it is here.

Two data nodes: witnesses.  With two voters the quorum is 2: if either
crashes, or the two are partitioned, nobody can renew a lease.  Any rule that
lets one side of a 2-node partition act alone (lowest id wins, the last
leader keeps it) yields two leaders when the partition is symmetric or none
when the favoured node is the one that crashed; a third vote is the only way
out.  Hence *witnesses*: relays that vote and acknowledge heartbeats like any
voter but never stand (``LeaderConfig.witness``: no election timer; a voter
grants only to a data node of its set).  A witness persists the same state
as a data node, so a restarted witness never votes twice in a term.  The
leader chooses them (``voters.next_change``): while the set has exactly two
data nodes, the admitted relay with the lowest peer id that is not gone
joins as the one witness (2 of 3 tolerates one failure).  One data node has
none (it is the only node that may lead: a witness would add a failure and
no availability); three or more have none.

Voter set.  The set (data nodes and witnesses) is Raft's configuration with
single-server changes (Ongaro's thesis section 4.3), here without a log: the
set itself plays the log.  Every node holds one ``VoterSet`` stamped
``(term, version)``: the term of the leader it came from and its version in
that term.  Rules:

1. Only the acting leader changes the set, by one voter at a time, and only
   once the current set is *committed*: a quorum of it acknowledged a
   heartbeat carrying it in the leader's own term (``committed``).  On
   winning, the leader restamps its set with its term (Raft's no-op entry),
   so its first change waits for a quorum of its term's acknowledgements.
2. Heartbeats carry the set; a follower adopts it when its stamp is newer
   than its own (an older heartbeat of the same term arriving late changes
   nothing), and persists it before acknowledging.
3. Every node counts quorums in the newest set it holds; a voter grants a
   vote or a pre-vote only to a candidate whose stamp (sent in RequestVote)
   is not older than its own (Raft's up-to-date check).

Why one leader at a time still holds: two sets that differ by one voter have
intersecting majorities, so the lease argument of leader.py goes through whenever
the leader's set and a candidate's are equal or adjacent.  They always are:
a leader proposes version v + 1 only after v is committed in its term, so a
quorum of v holds a stamp of that term; a candidate still holding an older
set (v - 1, or one from an earlier term) needs a quorum of it, which meets
that committed quorum (adjacent sets), and there a voter with the newer
stamp refuses it (rule 3).  A set made by a leader of an earlier term that
never got committed is overwritten by the next leader's (rule 2), and the
no-op of rule 1 is exactly Raft's fix of the single-server change bug: a new
leader cannot start a change that conflicts with an uncommitted one of a
previous term, since it first commits its own term in the old set.  The
leader's lease is counted over its current set; promises given under the
previous set still count (a promise is a promise) and the two are adjacent.
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

    Removal.  A voter that said Goodbye (``voter_left``) or whose acks the
    leader has not heard for ``voter_gone_s`` (``voters.VOTER_GONE_S``, 30 s:
    longer than a daemon restart, many election timeouts) is removed, one at a
    time as above; the leader never removes itself.  Additions come before
    removals for data nodes (``add_data_node``: an admitted data node is known),
    and a gone voter is removed before a witness is trimmed, so a set still
    counting a dead data node keeps its witness.  A data node outside the set
    still receives the heartbeats: its acks mark it heard, and it is added back
    (a restarted data node with the same id rejoins this way); a voter removed
    as gone is not re-added until it is heard again.  A data node that starts
    later needs no list: it starts from the initial set, whose stamp (0, 0) no
    voter of a running set grants to, and the leader adds it.
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

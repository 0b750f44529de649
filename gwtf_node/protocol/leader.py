"""Leader election among the data nodes: terms, pre-votes and leases.

GWTF needs one data node to act as *leader*: it starts the aggregation phase
(BEGIN AGGREGATION, section V-E) and places joining nodes (section V-B).  The
paper only says the leader "can be elected in a robust way"; this module is
that way.  It is Raft's election (Ongaro and Ousterhout, 2014: terms, one
vote per term, pre-vote from Ongaro's thesis section 9.6) with *leases*, and
no replicated log: the leader holds no state that others must agree on, so
only the election and the lease matter.

Theory of operation
-------------------
*Voters* are the data nodes plus optional *witnesses* (nodes that vote but
never run, see "Two data nodes" below).  A quorum is a strict majority of the
voters a node knows: ``len(voters) // 2 + 1``.

Every grant is a *promise*.  A voter that votes for C, or acknowledges a
heartbeat of leader L, promises not to vote (nor pre-vote) for anybody else
for ``lease_s`` measured on its own clock from when it received the request.
The leader counts, for every voter, the *send* time of the latest request of
the current term that voter granted (the request carries ``sent_at`` and the
grant echoes it, so only the leader's own clock is compared).  Its lease ends
at ``t_q + lease_s * (1 - 2 * max_clock_drift)``, where ``t_q`` is the
quorum-th latest of those send times (its own vote counts, at the send
time).  ``is_leader(now)`` is true only while ``now`` is before that end:
the leader *acts* (begins aggregation, assigns joiners) only then.

Safety (at most one leader acting at any instant, hence at most one per
term).  Suppose L acts at time t, so a quorum Q granted requests that L sent
at s >= t - lease'.  Any candidate C that wins needs a quorum Q', and Q and
Q' share a voter v.  Either v granted L's request before voting for C: then v
voted for C no sooner than (its receipt of s) + lease_s >= s + lease_s on
real time (with clock rates within 1 +/- max_clock_drift the factor
(1 - 2 rho) absorbs the difference), so C wins after L's lease has ended.  Or
v voted for C first: then v's term is above L's, and v refuses L's request
(ok = False), contradicting v in Q.  Votes themselves are promises, so a new
leader's first lease needs no extra round.  Within one term at most one node
wins (one vote per voter per term, Raft's election safety), and the term is
part of every acting leader's identity.  The proof never uses message
delays, so it holds under any partition, loss or reordering.

A voter under a live promise *ignores* a RequestVote (refuses it without
adopting its term), and pre-votes are answered without changing any state:
a node that was cut off keeps asking in pre-votes that nobody grants, so its
term does not grow, and when the partition heals it simply follows the
leader's heartbeats instead of deposing it with a higher term.

Liveness bound.  Let the network be synchronous with one-way delay at most
``delta``, a quorum of voters be live and connected, and the leader vanish
(crash, or cut off from the quorum) at time t0.  Every follower received the
last heartbeat by t0 + delta, so every promise to the old leader has ended by
t0 + delta + lease_s, and the first follower's election timer fires by
t0 + delta + et_max (et_max = ``election_timeout_s[1]``; the config enforces
lease_s <= et_min, and with et_min >= lease_s + delta, as the defaults give for
delta <= 0.5 s, the first pre-vote finds every promise ended).  A pre-vote
round and a vote round take 2 delta each, so:

    new leader acting by  t0 + delta + et_max + 4 delta

unless two candidates fire within 4 delta of each other and split the votes;
each split costs at most one more et_max + 4 delta, and happens with
probability at most (voters - 1) * 4 delta / (et_max - et_min) per round
(timeouts are drawn uniformly from ``election_timeout_s`` with the seeded
RNG).  The old leader stops acting by t0 + lease' on its own clock, before
anyone else can be elected.

Two data nodes.  The quorum of 2 voters is 2.  If either crashes, or the two
are partitioned, nobody can renew a lease: there is no acting leader until
they can talk again (safe, not live).  Any rule that lets one side of a
2-node partition act alone (lowest id wins, the last leader keeps it) either
yields two leaders when the partition is symmetric or no leader when the
favoured node is the one that crashed; a third vote is the only way out.
Hence ``witnesses``: give 2 data nodes one witness (any long-lived node, for
example a relay the run owner runs) and the quorum is 2 of 3, tolerating one
failure.  One data node is its own quorum and is always the leader.

Membership of the voter set.  ``add_data_node`` adds one voter; heartbeats
carry the leader's list and followers merge it (the daemon first drops from
it every id it does not know as an admitted data node: runtime/authorize.py
``admitted_voters``).  Adding one voter at a time
is safe (any majority of n and any majority of n + 1 voters intersect, Raft
section 4.3) as long as a second addition waits until every voter knows the
first.  A voter that restarts (the same id) is the same voter: it
is never removed, so taking it back needs no change of the voter set; see
"Restarts" for its promises.  A data node that starts later must be given the current list (from
the run's DHT records), never only itself: a node whose list is just itself
is a quorum of one.  Voters are never removed (that needs joint consensus):
a run that loses a majority of its voters for good has no leader.

Refusals.  A refused Vote carries only ``granted = False`` and the voter's
term: a reason enum would need an entry in codec._ENUMS, which this change
does not touch.

Restarts.  A restarted node must not forget a promise: ``start`` refuses all
votes for ``lease_s``, and a node that persisted ``persistent_state()``
(term, voted_for) before sending each vote restores it through the
constructor; one that did not must use a fresh identity.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from .effects import CancelTimer, Effect, Send, SetTimer
from .messages import HeartbeatAck, LeaderHeartbeat, RequestVote, Vote

ELECTION_TIMER = "leader.election"
HEARTBEAT_TIMER = "leader.heartbeat"
NEVER = float("-inf")


class Role(enum.Enum):
    FOLLOWER = "follower"  # waiting for heartbeats, voting
    PRE_CANDIDATE = "pre-candidate"  # asking whether a quorum would vote for term + 1
    CANDIDATE = "candidate"  # asking for votes in its own term
    LEADER = "leader"  # won its term; acts only while its lease holds


@dataclass(frozen=True)
class LeaderConfig:
    node_id: str
    data_nodes: tuple[str, ...]
    witnesses: tuple[str, ...] = ()  # vote but never run (see "Two data nodes")
    lease_s: float = 2.0
    election_timeout_s: tuple[float, float] = (2.5, 4.0)
    heartbeat_s: float = 0.5
    max_clock_drift: float = 0.001  # bound on |clock rate - 1| between any two nodes

    def __post_init__(self) -> None:
        lo, hi = self.election_timeout_s
        if not 0 <= self.max_clock_drift < 0.25:
            raise ValueError(f"max_clock_drift is {self.max_clock_drift}: use a fraction below 0.25, e.g. 0.001")
        if not 0 < self.heartbeat_s < self.effective_lease_s:
            raise ValueError(
                f"heartbeat_s is {self.heartbeat_s} but the lease is {self.effective_lease_s:.3f} s: "
                "heartbeats must come well within a lease, e.g. heartbeat_s = lease_s / 4"
            )
        if not self.lease_s <= lo <= hi:
            raise ValueError(
                f"election_timeout_s is {self.election_timeout_s} with lease_s {self.lease_s}: "
                "need lease_s <= low <= high so that a follower's promise has ended when it runs"
            )
        if set(self.data_nodes) & set(self.witnesses):
            raise ValueError("a node is listed both as a data node and as a witness: list it once")

    @property
    def effective_lease_s(self) -> float:
        """How long a leader counts its lease, on its own clock (shortened for clock drift)."""
        return self.lease_s * (1 - 2 * self.max_clock_drift)


class LeaderMachine:
    """One voter's election state; a data node may become leader, a witness only votes."""

    def __init__(self, cfg: LeaderConfig, rng: random.Random, term: int = 0, voted_for: str | None = None) -> None:
        self.cfg = cfg
        self.rng = rng
        self.id = cfg.node_id
        self.data: set[str] = set(cfg.data_nodes)
        self.voters: set[str] = self.data | set(cfg.witnesses)
        if self.id not in self.voters:
            raise ValueError(f"{self.id} is neither a data node nor a witness of this election")
        self.term = term
        self.voted_for = voted_for
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None  # leader of `term` as far as we know
        self.promised_to: str | None = None  # None with a future promise_until: nobody (after a restart)
        self.promise_until = NEVER
        self.grants: set[str] = set()  # pre-votes or votes collected in this round
        self.round_sent_at = NEVER  # sent_at of our current RequestVote
        self.acked: dict[str, float] = {}  # leader: voter -> latest granted send time
        self.lease_end = NEVER

    # ---- queries ------------------------------------------------------------

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def is_leader(self, now: float) -> bool:
        """True while this node is the leader of `term` and holds a quorum lease: only then may it act."""
        return self.role is Role.LEADER and now < self.lease_end

    def leader(self, now: float) -> str | None:
        """The acting leader as far as this node knows, or None."""
        if self.is_leader(now):
            return self.id
        if self.role is Role.FOLLOWER and self.leader_id is not None and self.promised_to == self.leader_id \
                and now < self.promise_until:
            return self.leader_id
        return None

    def persistent_state(self) -> tuple[int, str | None]:
        """What a daemon must write to disk before sending a Vote, to restore after a crash."""
        return self.term, self.voted_for

    # ---- events -------------------------------------------------------------

    def start(self, now: float) -> list[Effect]:
        self.promised_to, self.promise_until = None, now + self.cfg.lease_s  # promises we may have forgotten
        return self._arm_election(now)

    def add_data_node(self, node_id: str) -> None:
        """A data node joined the run (one at a time, see the module docstring)."""
        self.data.add(node_id)
        self.voters.add(node_id)

    def on_timer(self, now: float, key: str) -> list[Effect]:
        if key == ELECTION_TIMER:
            return self._election_timeout(now)
        if key == HEARTBEAT_TIMER and self.role is Role.LEADER:
            return self._heartbeat(now)
        return []

    def on_message(self, now: float, sender: str, msg: object) -> list[Effect]:
        if type(msg) is RequestVote:
            return self._on_request_vote(now, sender, msg)
        if type(msg) is Vote:
            return self._on_vote(now, sender, msg)
        if type(msg) is LeaderHeartbeat:
            return self._on_heartbeat(now, sender, msg)
        if type(msg) is HeartbeatAck:
            return self._on_ack(now, sender, msg)
        return []

    # ---- running for election -----------------------------------------------

    def _arm_election(self, now: float) -> list[Effect]:
        if self.id not in self.data:
            return []  # witnesses never run
        lo, hi = self.cfg.election_timeout_s
        return [SetTimer(ELECTION_TIMER, now + self.rng.uniform(lo, hi))]

    def _promised_elsewhere(self, now: float, candidate: str) -> bool:
        return now < self.promise_until and self.promised_to != candidate

    def _election_timeout(self, now: float) -> list[Effect]:
        if self.role is Role.LEADER or self.id not in self.data:
            return []
        if self._promised_elsewhere(now, self.id):
            lo, hi = self.cfg.election_timeout_s
            return [SetTimer(ELECTION_TIMER, self.promise_until + self.rng.uniform(0, hi - lo))]
        self.role = Role.PRE_CANDIDATE
        self.grants = {self.id}
        self.round_sent_at = now
        effects: list[Effect] = self._arm_election(now)  # retry if this round fails
        effects += self._broadcast(RequestVote(term=self.term + 1, pre=True, sent_at=now))
        return effects + self._tally(now)

    def _become_candidate(self, now: float) -> list[Effect]:
        self.term += 1
        self.voted_for = self.id
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.grants = {self.id}
        self.round_sent_at = now
        self.promised_to, self.promise_until = self.id, now + self.cfg.lease_s
        effects: list[Effect] = self._arm_election(now)
        effects += self._broadcast(RequestVote(term=self.term, pre=False, sent_at=now))
        return effects + self._tally(now)

    def _tally(self, now: float) -> list[Effect]:
        if len(self.grants & self.voters) < self.quorum:
            return []
        if self.role is Role.PRE_CANDIDATE:
            return self._become_candidate(now)
        if self.role is Role.CANDIDATE:
            return self._become_leader(now)
        return []

    def _become_leader(self, now: float) -> list[Effect]:
        self.role = Role.LEADER
        self.leader_id = self.id
        self.acked = {v: self.round_sent_at for v in self.grants}
        self.lease_end = NEVER
        self._renew_lease()
        return [CancelTimer(ELECTION_TIMER), *self._heartbeat(now)]

    # ---- leading ------------------------------------------------------------

    def _heartbeat(self, now: float) -> list[Effect]:
        self.acked[self.id] = now
        self.promised_to, self.promise_until = self.id, now + self.cfg.lease_s
        self._renew_lease()
        hb = LeaderHeartbeat(term=self.term, sent_at=now, data_nodes=tuple(sorted(self.data)))
        return [*self._broadcast(hb), SetTimer(HEARTBEAT_TIMER, now + self.cfg.heartbeat_s)]

    def _renew_lease(self) -> None:
        times = sorted((self.acked[v] for v in self.voters if v in self.acked), reverse=True)
        if len(times) >= self.quorum:
            self.lease_end = max(self.lease_end, times[self.quorum - 1] + self.cfg.effective_lease_s)

    def _on_ack(self, now: float, sender: str, msg: HeartbeatAck) -> list[Effect]:
        if msg.term > self.term:
            return self._step_down(now, msg.term)
        if self.role is Role.LEADER and msg.ok and msg.term == self.term and sender in self.voters:
            self.acked[sender] = max(self.acked.get(sender, NEVER), msg.sent_at)
            self._renew_lease()
        return []

    # ---- voting and following -----------------------------------------------

    def _step_down(self, now: float, term: int) -> list[Effect]:
        """Adopt a higher term as a follower that does not know its leader yet."""
        was_leader = self.role is Role.LEADER
        self.term, self.voted_for = term, None
        self.role, self.leader_id = Role.FOLLOWER, None
        self.lease_end = NEVER
        effects: list[Effect] = [CancelTimer(HEARTBEAT_TIMER)] if was_leader else []
        return effects + self._arm_election(now)

    def _on_request_vote(self, now: float, sender: str, msg: RequestVote) -> list[Effect]:
        effects: list[Effect] = []
        if sender not in self.data or msg.term <= self.term - (0 if msg.pre else 1) \
                or self._promised_elsewhere(now, sender):
            granted = False  # unknown candidate, stale term, or a live promise to someone else
        elif msg.pre:
            granted = True  # a pre-vote changes nothing here
        else:
            if msg.term > self.term:
                effects += self._step_down(now, msg.term)
            granted = self.voted_for in (None, sender)
            if granted:
                self.voted_for = sender
                self.promised_to, self.promise_until = sender, now + self.cfg.lease_s
                effects += self._arm_election(now)
        term = msg.term if granted else self.term
        return [*effects, Send(sender, Vote(term=term, pre=msg.pre, granted=granted, sent_at=msg.sent_at))]

    def _on_vote(self, now: float, sender: str, msg: Vote) -> list[Effect]:
        if not msg.granted:
            return self._step_down(now, msg.term) if msg.term > self.term else []
        expected_term = self.term + 1 if msg.pre else self.term
        expected_role = Role.PRE_CANDIDATE if msg.pre else Role.CANDIDATE
        if self.role is expected_role and msg.term == expected_term and msg.sent_at == self.round_sent_at:
            self.grants.add(sender)
            return self._tally(now)
        return []

    def _on_heartbeat(self, now: float, sender: str, msg: LeaderHeartbeat) -> list[Effect]:
        if msg.term < self.term or sender == self.id:
            return [Send(sender, HeartbeatAck(term=self.term, sent_at=msg.sent_at, ok=False))]
        effects: list[Effect] = []
        if msg.term > self.term:
            effects += self._step_down(now, msg.term)
        elif self.role is Role.LEADER:  # two leaders in one term: impossible unless a peer lies
            return [Send(sender, HeartbeatAck(term=self.term, sent_at=msg.sent_at, ok=False))]
        self.role, self.leader_id = Role.FOLLOWER, sender
        self.promised_to, self.promise_until = sender, now + self.cfg.lease_s
        for node in msg.data_nodes:
            self.add_data_node(node)
        effects += self._arm_election(now)
        return [*effects, Send(sender, HeartbeatAck(term=self.term, sent_at=msg.sent_at, ok=True))]

    def _broadcast(self, msg: object) -> list[Effect]:
        return [Send(v, msg) for v in sorted(self.voters) if v != self.id]

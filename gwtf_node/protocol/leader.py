"""Leader election among the data nodes: terms, pre-votes, leases, witnesses and voter-set changes.

GWTF needs one data node to act as *leader*: it starts the aggregation phase
(BEGIN AGGREGATION, section V-E) and places joining nodes (section V-B).  The
paper only says the leader "can be elected in a robust way"; this module is
that way.  It is Raft's election (Ongaro and Ousterhout, 2014: terms, one
vote per term, pre-vote from Ongaro's thesis section 9.6) with *leases*, and
no replicated log: the leader holds no state that others must agree on, so
only the election and the lease matter.

Theory of operation
-------------------
*Voters* are the data nodes plus *witnesses* (relays that vote but never
run, see voters.py).  A quorum is a strict majority of the
voter set a node holds: ``len(voters) // 2 + 1``.

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

The rest of the theory sits with the code it governs: the liveness bound
with ``LeaderConfig`` (its timing constraints), leases sized from round
trips with ``LeaderMachine.set_lease``, refusals with ``_on_request_vote``,
restarts with ``LeaderMachine.restore``; the voter set (witnesses, its
changes and why one leader at a time still holds) in voters.py, and removals
from it with ``voters.next_change``.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from .effects import CancelTimer, Effect, Send, SetTimer
from .messages import HeartbeatAck, LeaderHeartbeat, RequestVote, Vote
from .voters import VOTER_GONE_S, VoterSet, next_change

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
    """The election's settings, checked on creation (the checks keep the bound below).

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
    """

    node_id: str
    data_nodes: tuple[str, ...]  # the initial voter set's data nodes (every data node starts from the same)
    witnesses: tuple[str, ...] = ()  # the initial set's witnesses (vote, never run: voters.py)
    lease_s: float = 2.0  # the floor of every lease; a promise lasts at least this long
    election_timeout_s: tuple[float, float] = (2.5, 4.0)
    heartbeat_s: float = 0.5  # at a lease of lease_s; a longer lease spaces heartbeats in proportion
    max_clock_drift: float = 0.001  # bound on |clock rate - 1| between any two nodes
    max_lease_s: float = 30.0  # the longest lease a voter promises (a request asking more is refused)
    witness: bool = False  # this node only votes: it never stands, even if listed as a data node
    voter_gone_s: float = VOTER_GONE_S  # the leader removes a voter not heard from for this long

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
        if not self.lease_s <= self.max_lease_s:
            raise ValueError(f"max_lease_s is {self.max_lease_s}, below the lease floor {self.lease_s}")
        if set(self.data_nodes) & set(self.witnesses):
            raise ValueError("a node is listed both as a data node and as a witness: list it once")

    @property
    def effective_lease_s(self) -> float:
        """How long a leader counts a lease of lease_s, on its own clock (shortened for clock drift)."""
        return self.lease_s * (1 - 2 * self.max_clock_drift)


class LeaderMachine:
    """One voter's election state; a data node may become leader, a witness only votes."""

    def __init__(self, cfg: LeaderConfig, rng: random.Random, term: int = 0, voted_for: str | None = None,
                 voter_set: VoterSet | None = None, promised_max: float | None = None) -> None:
        self.cfg = cfg
        self.rng = rng
        self.id = cfg.node_id
        self.cur = voter_set or VoterSet(frozenset(cfg.data_nodes), frozenset(cfg.witnesses))
        if self.id not in self.cur.voters and not cfg.witness:
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
        self.lease_s = cfg.lease_s  # the lease this node asks for when it runs or leads (`set_lease`)
        self.promised_max = cfg.lease_s if promised_max is None else min(cfg.max_lease_s, promised_max)
        self.known_data: set[str] = set(self.cur.data)  # admitted data nodes this node knows (may become voters)
        self.relays: set[str] = set()  # admitted relays that may be chosen as witnesses
        self.left: set[str] = set()  # said Goodbye: removed from the voter set, never added back
        self.last_heard: dict[str, float] = {}  # leader: node -> when its latest ack arrived (our clock)
        self.cfg_since = NEVER  # leader: sent_at of the first heartbeat carrying the current voter set
        self.ends: dict[str, float] = {}  # leader: voter -> when its latest promise to us ends (our clock)
        self._asked: dict[float, float] = {}  # leader: sent_at of our requests -> the lease each asked for

    # ---- queries ------------------------------------------------------------

    @property
    def data(self) -> frozenset[str]:
        return self.cur.data

    @property
    def voters(self) -> frozenset[str]:
        return self.cur.voters

    @property
    def quorum(self) -> int:
        return self.cur.quorum

    @property
    def may_lead(self) -> bool:
        return not self.cfg.witness and self.id in self.cur.data

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

    def committed(self) -> bool:
        """Leader: a quorum of the current voter set acknowledged a heartbeat carrying it, in this term."""
        return sum(1 for v in self.cur.voters if self.acked.get(v, NEVER) >= self.cfg_since) >= self.cur.quorum

    def persistent_state(self) -> dict:
        """What a daemon must write to disk before sending a Vote or HeartbeatAck, to restore after a crash
        (`restore`): the term, the vote, and the voter set with its stamp (Raft's persisted log)."""
        return {"term": self.term, "voted_for": self.voted_for, "data": sorted(self.cur.data),
                "witnesses": sorted(self.cur.witnesses), "cfg_term": self.cur.term, "cfg_version": self.cur.version,
                "promised_s": self.promised_max}

    @classmethod
    def restore(cls, cfg: LeaderConfig, rng: random.Random, saved: dict) -> "LeaderMachine":
        """A machine from `persistent_state()` (raises ValueError/KeyError/TypeError on a malformed one).

        Restarts.  A restarted node must not forget a promise: ``start`` refuses all
        votes for the longest lease it ever promised, and a node that persisted
        ``persistent_state()`` (term, vote, voter set) before sending each Vote or
        HeartbeatAck restores it with ``restore``; one that did not must use a fresh
        identity.
        """
        vs = None  # a file of (term, vote) only: the initial voter set
        if "data" in saved:
            vs = VoterSet(frozenset(map(str, saved["data"])), frozenset(map(str, saved["witnesses"])),
                          int(saved["cfg_term"]), int(saved["cfg_version"]))
        voted = saved.get("voted_for")
        return cls(cfg, rng, term=int(saved["term"]), voted_for=None if voted is None else str(voted), voter_set=vs,
                   promised_max=float(saved.get("promised_s", cfg.max_lease_s)))

    # ---- events -------------------------------------------------------------

    def start(self, now: float) -> list[Effect]:
        self.promised_to, self.promise_until = None, now + self.promised_max  # promises we may have forgotten
        return self._arm_election(now)

    def add_data_node(self, node_id: str, now: float | None = None) -> None:
        """An admitted data node is known (its Hello): the leader adds it to the voter set (one change at a
        time, voters.py); `now` counts as hearing from it."""
        self.known_data.add(node_id)
        self.left.discard(node_id)
        if now is not None and self.role is Role.LEADER:
            self.last_heard[node_id] = now

    def add_relay(self, node_id: str) -> None:
        """An admitted relay is known: it may be chosen as a witness."""
        self.relays.add(node_id)
        self.left.discard(node_id)

    def forget(self, node_id: str) -> None:
        """A peer this node no longer knows (gone from the peer table): no longer a candidate voter."""
        self.known_data.discard(node_id)
        self.relays.discard(node_id)

    def voter_left(self, node_id: str) -> None:
        """A peer said Goodbye: the leader removes it from the voter set."""
        self.left.add(node_id)
        self.forget(node_id)

    def set_lease(self, lease_s: float) -> None:
        """The lease to ask for from now on (`voters.lease_for_rtts`), within [cfg.lease_s, cfg.max_lease_s].

        Leases from round trips.  A request carries the lease it asks for
        (``lease_s``); a voter promises ``max(asked, cfg.lease_s)`` and refuses a
        request asking more than ``cfg.max_lease_s``; it persists the longest promise
        it gave, and ``start`` honours it after a restart.  The leader counts each
        grant with the lease that request asked (unknown: the floor), so it may
        change its lease at any time (``set_lease``, sized by
        ``voters.lease_for_rtts`` from measured round trips, never below
        ``cfg.lease_s``); heartbeats and election timeouts scale with it.
        """
        self.lease_s = min(self.cfg.max_lease_s, max(self.cfg.lease_s, lease_s))

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
        if not self.may_lead:
            return [CancelTimer(ELECTION_TIMER)]  # witnesses (and data nodes outside the voter set) never run
        lo, hi = self._timeouts()
        return [SetTimer(ELECTION_TIMER, now + self.rng.uniform(lo, hi))]

    def _timeouts(self) -> tuple[float, float]:
        """The election timeouts, scaled with the lease (a longer lease: longer rounds, as the round trips)."""
        k = self.lease_s / self.cfg.lease_s
        return self.cfg.election_timeout_s[0] * k, self.cfg.election_timeout_s[1] * k

    def _promised_elsewhere(self, now: float, candidate: str) -> bool:
        return now < self.promise_until and self.promised_to != candidate

    def _election_timeout(self, now: float) -> list[Effect]:
        if self.role is Role.LEADER or not self.may_lead:
            return []
        if self._promised_elsewhere(now, self.id):
            lo, hi = self._timeouts()
            return [SetTimer(ELECTION_TIMER, self.promise_until + self.rng.uniform(0, hi - lo))]
        self.role = Role.PRE_CANDIDATE
        self.grants = {self.id}
        self.round_sent_at = now
        effects: list[Effect] = self._arm_election(now)  # retry if this round fails
        effects += self._broadcast(self._request(self.term + 1, True, now))
        return effects + self._tally(now)

    def _request(self, term: int, pre: bool, now: float) -> RequestVote:
        return RequestVote(term=term, pre=pre, sent_at=now, cfg_term=self.cur.term, cfg_version=self.cur.version,
                           lease_s=self.lease_s)

    def _become_candidate(self, now: float) -> list[Effect]:
        self.term += 1
        self.voted_for = self.id
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.grants = {self.id}
        self.round_sent_at = now
        self.promised_to, self.promise_until = self.id, now + self.lease_s
        effects: list[Effect] = self._arm_election(now)
        effects += self._broadcast(self._request(self.term, False, now))
        return effects + self._tally(now)

    def _tally(self, now: float) -> list[Effect]:
        if len(self.grants & self.cur.voters) < self.cur.quorum:
            return []
        if self.role is Role.PRE_CANDIDATE:
            return self._become_candidate(now)
        if self.role is Role.CANDIDATE:
            return self._become_leader(now)
        return []

    def _become_leader(self, now: float) -> list[Effect]:
        self.role = Role.LEADER
        self.leader_id = self.id
        self.acked, self.ends = {}, {}
        for v in self.grants:
            self._granted(v, self.round_sent_at)
        self.lease_end = NEVER
        self._renew_lease()
        self.cur = VoterSet(self.cur.data, self.cur.witnesses, self.term, 0)  # Raft's no-op entry of the term
        self.last_heard = {v: now for v in self.cur.voters}
        self.cfg_since = now  # the first heartbeat below carries it
        return [CancelTimer(ELECTION_TIMER), *self._heartbeat(now)]

    # ---- leading ------------------------------------------------------------

    def _heartbeat(self, now: float) -> list[Effect]:
        if self.committed():
            self._change_voters(now)
        self._asked[now] = self.lease_s
        self._granted(self.id, now)
        self.promised_to, self.promise_until = self.id, now + self.lease_s
        self._renew_lease()
        hb = LeaderHeartbeat(term=self.term, sent_at=now, data_nodes=tuple(sorted(self.cur.data)),
                             witnesses=tuple(sorted(self.cur.witnesses)), cfg_version=self.cur.version,
                             lease_s=self.lease_s)
        targets = self.cur.voters | self.known_data  # data nodes outside the set hear it too: their acks re-add them
        period = self.cfg.heartbeat_s * self.lease_s / self.cfg.lease_s
        return [*(Send(v, hb) for v in sorted(targets) if v != self.id), SetTimer(HEARTBEAT_TIMER, now + period)]

    def _change_voters(self, now: float) -> None:
        """One change of the voter set, once the current one is committed (voters.py "Voter set")."""
        gone = {n for n, t in self.last_heard.items() if now - t > self.cfg.voter_gone_s}
        change = next_change(self.cur, self.id, self.known_data, self.relays, self.left, gone)
        if change is None:
            return
        data, witnesses = change
        for v in (data | witnesses) - self.cur.voters:
            self.last_heard[v] = now  # a new voter has voter_gone_s to answer
        for v in self.cur.voters - (data | witnesses) - gone:
            self.last_heard.pop(v, None)  # removed while live (a surplus witness): it may be chosen again
        self.cur = VoterSet(data, witnesses, self.term, self.cur.version + 1)
        self.cfg_since = now

    def _granted(self, voter: str, sent_at: float) -> None:
        """`voter` granted our request sent at `sent_at`: it promised for at least the lease that request asked."""
        asked = self._asked.get(sent_at, self.cfg.lease_s)  # unknown: the floor, which every voter promises
        self.acked[voter] = max(self.acked.get(voter, NEVER), sent_at)
        end = sent_at + asked * (1 - 2 * self.cfg.max_clock_drift)
        self.ends[voter] = max(self.ends.get(voter, NEVER), end)

    def _renew_lease(self) -> None:
        ends = sorted((self.ends[v] for v in self.cur.voters if v in self.ends), reverse=True)
        if len(ends) >= self.cur.quorum:
            self.lease_end = max(self.lease_end, ends[self.cur.quorum - 1])
        if len(self._asked) > 64:  # requests older than any live promise are of no use
            oldest = max(self._asked) - self.cfg.max_lease_s
            self._asked = {t: ls for t, ls in self._asked.items() if t >= oldest}

    def _on_ack(self, now: float, sender: str, msg: HeartbeatAck) -> list[Effect]:
        if msg.term > self.term:
            return self._step_down(now, msg.term)
        if self.role is Role.LEADER and msg.ok and msg.term == self.term:
            self.last_heard[sender] = now
            if sender in self.cur.voters:
                self._granted(sender, msg.sent_at)
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

    def _promise_s(self, asked: float) -> float | None:
        """How long a grant of a request asking `asked` promises; None: the request asks too much."""
        if not asked <= self.cfg.max_lease_s:  # also NaN
            return None
        promise = max(self.cfg.lease_s, asked)
        self.promised_max = max(self.promised_max, promise)  # persisted: a restart waits this long (`start`)
        return promise

    def _on_request_vote(self, now: float, sender: str, msg: RequestVote) -> list[Effect]:
        """A RequestVote or a pre-vote: granted, refused, or ignored under a live promise (module docstring).

        Refusals.  A refused Vote carries only ``granted = False`` and the voter's
        term: a reason enum would need an entry in codec._ENUMS, which this change
        does not touch.
        """
        effects: list[Effect] = []
        promise = self._promise_s(msg.lease_s)
        if sender not in self.cur.data or msg.term <= self.term - (0 if msg.pre else 1) or promise is None \
                or (msg.cfg_term, msg.cfg_version) < self.cur.stamp or self._promised_elsewhere(now, sender):
            granted = False  # not a data node of our set, stale term or set, or a live promise to someone else
        elif msg.pre:
            granted = True  # a pre-vote changes nothing here
        else:
            if msg.term > self.term:
                effects += self._step_down(now, msg.term)
            granted = self.voted_for in (None, sender)
            if granted:
                self.voted_for = sender
                self.promised_to, self.promise_until = sender, max(self.promise_until, now + promise)
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
        promise = self._promise_s(msg.lease_s)
        if msg.term < self.term or sender == self.id or promise is None:
            return [Send(sender, HeartbeatAck(term=self.term, sent_at=msg.sent_at, ok=False))]
        effects: list[Effect] = []
        if msg.term > self.term:
            effects += self._step_down(now, msg.term)
        elif self.role is Role.LEADER:  # two leaders in one term: impossible unless a peer lies
            return [Send(sender, HeartbeatAck(term=self.term, sent_at=msg.sent_at, ok=False))]
        self.role, self.leader_id = Role.FOLLOWER, sender
        self.promised_to, self.promise_until = sender, max(self.promise_until, now + promise)
        if (msg.term, msg.cfg_version) > self.cur.stamp and not set(msg.data_nodes) & set(msg.witnesses):
            self.cur = VoterSet(frozenset(msg.data_nodes), frozenset(msg.witnesses), msg.term, msg.cfg_version)
            self.known_data |= self.cur.data
        effects += self._arm_election(now)
        return [*effects, Send(sender, HeartbeatAck(term=self.term, sent_at=msg.sent_at, ok=True))]

    def _broadcast(self, msg: object) -> list[Effect]:
        return [Send(v, msg) for v in sorted(self.cur.voters) if v != self.id]

"""Who may send what: admission by certificate, roles checked on every message, revocation.

Theory of operation
-------------------
Noise authenticates the peer id of every frame (and the node checks that the
envelope's sender is that peer).  This module decides whether that peer may
send that message.  It is consulted in one place, `Node._on_frame`, before
any component sees a frame: every route of the dispatch table (node.py
`routes`) names what its message `Needs`, and a refusal carries a
`RefusalCode` that the wire counts per code (status.json "refused").

*Admission* (`Authorizer.check_hello`): in an owned run (a signed manifest,
certificates.py) a Hello that claims the data role must carry the owner's
certificate for that peer id, run and role; so must a relay's, unless the
manifest opens the run to any relay (`open_relays`).  A Hello that passes
makes the peer's role in the peer table trustworthy: every later check reads
the role from there.  A run opened for testing (`--insecure-unsigned`, no
owner) admits every Hello as it claims.

*Roles* (`decide`, a pure function over a snapshot):

=================  ===========================================================
Needs.NOTHING      anyone (addresses, round trips, state downloads, phases'
                   acknowledgements; the components check what they take)
Needs.DATA         an admitted data node: RequestVote (only data nodes
                   stand), IterationDone, Lend.
Needs.VOTER        an admitted data node or relay: Vote and HeartbeatAck
                   (a relay chosen as a witness votes; the election machine
                   counts only the voters of its set, leader.py).
Needs.LEADER       the leader of the message's term (`leader_of_term` has
                   the rule): LeaderHeartbeat, Assignment, UtilizationQuery,
                   and a BeginAggregation that a data node sends (a copy
                   of one this node took already, of no newer term, from
                   any admitted data node: it asks for the CAN TAKE that
                   data node misses, `duplicate_begin`).
Needs.UPSTREAM     BeginAggregation travels front to back: from the leader
                   (the rule above), at a data node from a relay placed in
                   a stage (the last stage passes it on; a stage left empty
                   is bridged), at a relay of stage k from a relay of a
                   stage before k.
Needs.NEIGHBOUR    flow messages: a peer placed in a stage adjacent to this
                   node's (or the same stage), on the ring data -> 0 -> ... ->
                   S-1 -> data.
Needs.PLACED       microbatch messages: a data node or a relay placed in a
                   stage (recovery may bridge a stage, so not only adjacent).
=================  ===========================================================

*Revocation*: the owner's signed list (certificates.py) from `--revocations`
and from the DHT record `run/<id>/revoked`; a revoked peer's frames are all
refused (REVOKED), and the node treats it as gone (`on_revoked`).
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Container

from ...model.certificates import AdmissionError, Problem, RevocationList, check_certificate, check_revocations
from ...protocol import messages as m
from ..net.peers import PeerInfo

log = logging.getLogger("gwtf.node")

RefusalCode = m.RefusalCode
_TERMED = (m.LeaderHeartbeat, m.Assignment, m.UtilizationQuery, m.BeginAggregation)  # they carry the leader's term


class Needs(enum.Enum):
    """What the sender of a message type must be (the table in the module docstring)."""

    NOTHING = "nothing"
    ADMISSION = "admission"  # the Hello: a certificate for the role it claims
    DATA = "data"
    VOTER = "voter"
    LEADER = "leader"
    UPSTREAM = "upstream"
    NEIGHBOUR = "neighbour"
    PLACED = "placed"


@dataclass(frozen=True)
class Refusal:
    code: RefusalCode
    why: str


@dataclass(frozen=True)
class Snapshot:
    """What `decide` looks at: this node's place and whom it takes for the leader of which term."""

    my_role: str
    my_stage: int | None  # None: a relay not placed yet
    n_stages: int
    leader: str | None  # the leader of `term` as far as this node knows (a data node: its election machine's;
    #                     a relay: the one it learned from the DHT or the leader's messages); None: unknown
    term: int | None  # the newest term this node knows; None: none yet
    begun: Container[int] = ()  # the iterations whose BEGIN AGGREGATION this node took (phases.py `begun`)


_PROBLEM_CODE = {
    Problem.EXPIRED: RefusalCode.CERTIFICATE_EXPIRED,
    Problem.REVOKED: RefusalCode.REVOKED,
    Problem.WRONG_ROLE: RefusalCode.WRONG_ROLE,
}


def _ring(role: str, stage: int | None, n_stages: int) -> int | None:
    """Position on the ring data(0) -> stage 0 (1) -> ... -> stage S-1 (S) -> data; None: not placed."""
    if role == "data":
        return 0
    if stage is None or not 0 <= stage < n_stages:
        return None
    return stage + 1


def message_term(msg: object) -> int | None:
    """The leader term a message of the leader carries (None: it carries none)."""
    return msg.term if isinstance(msg, _TERMED) else None


def leader_of_term(msg: object, sender: str, snap: Snapshot) -> Refusal | None:
    """Whether an admitted data node `sender` may send `msg` as the leader of the term it carries.

    Needs.LEADER (LeaderHeartbeat, Assignment, UtilizationQuery, and a BeginAggregation that a data node sends).
    Only an admitted data node leads.  Of the term this node knows, only that term's leader (a data node: its
    election machine's; a relay: the leader it learned); of an older term, nobody (a LeaderHeartbeat aside: the
    election machine answers it, so that a stale leader steps down); of a newer term, any admitted data node,
    and this node learns the term (Raft: a new leader's message may overtake the news of its election; a relay
    learns the sender as that term's leader, `Authorizer.observe`).  A data node that does not know who won its
    term (it restarted, or voted for another) takes that term's messages from any admitted data node.  The
    leader's driver stamps the term it led on every BEGIN it sends (aggregation.py); relays pass it on
    unchanged; a copy of a BEGIN this node took already comes from any admitted data node (`duplicate_begin`).
    The voter list of a heartbeat is filtered to the data nodes admitted here (`admitted_voters`,
    leadership.py).
    """
    name, term = type(msg).__name__, message_term(msg)
    if duplicate_begin(msg, snap):
        return None  # another data node asks for the CAN TAKE it misses: phases.py answers only that
    if term is None or snap.term is None or term > snap.term:
        return None  # this node follows no term yet, or a newer one: learn it (Raft)
    if term < snap.term:
        if isinstance(msg, m.LeaderHeartbeat):
            return None  # the election machine answers it (ok = False): the stale leader steps down
        return Refusal(RefusalCode.NOT_LEADER, f"{name} of term {term} from {sender[:16]}: this node is in term "
                                               f"{snap.term} already")
    if snap.leader is not None and snap.leader != sender:
        return Refusal(RefusalCode.NOT_LEADER, f"{name} of term {term}, whose leader is {snap.leader[:16]}, "
                                               f"from another data node {sender[:16]}")
    return None


def duplicate_begin(msg: object, snap: Snapshot) -> bool:
    """A BEGIN AGGREGATION of an iteration this node took already, of no newer term: a copy that a data node
    (not the leader, or the leader of an older term) sends again to ask for the CAN TAKE it misses
    (phasewaits.py).  It starts nothing (phases.py answers it with the CAN TAKE only), so it needs no leader."""
    return (isinstance(msg, m.BeginAggregation) and msg.iteration in snap.begun
            and (snap.term is None or msg.term <= snap.term))


def admitted_voters(listed: tuple[str, ...], is_admitted_data: Callable[[str], bool]) -> tuple[str, ...]:
    """The voters of a LeaderHeartbeat's list that this node knows as admitted data nodes (their Hello carried
    the owner's certificate for the data role): a leader's list is never merged as sent, since a voter added
    at will would let a hostile leader make the quorums of its choice.  A genuine data node missing here is
    added by its own Hello (leadership.py `on_peer_hello`)."""
    return tuple(p for p in listed if is_admitted_data(p))


def decide(needs: Needs, msg: object, sender: PeerInfo | None, snap: Snapshot) -> Refusal | None:
    """Whether `sender` may send `msg` (a route that `needs` this); None: it may."""
    if needs in (Needs.NOTHING, Needs.ADMISSION):
        return None
    name = type(msg).__name__
    if sender is None:
        return Refusal(RefusalCode.UNKNOWN_PEER, f"{name} from a peer that has not said Hello")
    is_data = sender.role == "data"
    if needs is Needs.VOTER:
        if sender.role not in ("data", "relay"):
            return Refusal(RefusalCode.WRONG_ROLE, f"{name} from a {sender.role} (only data nodes and relays vote)")
        return None
    if needs is Needs.DATA:
        if not is_data:
            return Refusal(RefusalCode.WRONG_ROLE, f"{name} from a {sender.role} (only admitted data nodes send it)")
        return None
    if needs is Needs.LEADER or (needs is Needs.UPSTREAM and is_data):
        if not is_data:
            code = RefusalCode.WRONG_ROLE if isinstance(msg, m.LeaderHeartbeat) else RefusalCode.NOT_LEADER
            return Refusal(code, f"{name} from a {sender.role}: only the leader, an admitted data node, sends it")
        return leader_of_term(msg, sender.peer_id, snap)
    if needs is Needs.UPSTREAM:
        if snap.my_role == "data":
            if _ring(sender.role, sender.stage, snap.n_stages) is None:
                return Refusal(RefusalCode.NOT_LEADER, f"{name} from a relay in no stage")
            return None
        if snap.my_stage is None or sender.stage < 0 or sender.stage >= snap.my_stage:
            return Refusal(RefusalCode.NOT_LEADER, f"{name} from a relay of stage {sender.stage}: it comes from "
                                                   f"the leader or a stage before {snap.my_stage}")
        return None
    theirs = _ring(sender.role, sender.stage, snap.n_stages)
    if theirs is None:
        return Refusal(RefusalCode.NOT_NEIGHBOUR, f"{name} from a relay placed in no stage")
    if needs is Needs.PLACED:
        return None
    mine = _ring(snap.my_role, snap.my_stage, snap.n_stages)
    if mine is None:
        return None  # not placed yet: no flows to protect
    d = abs(mine - theirs)
    if min(d, snap.n_stages + 1 - d) > 1:
        return Refusal(RefusalCode.NOT_NEIGHBOUR, f"{name} from stage {sender.stage}, not adjacent to this "
                                                  f"node's stage {snap.my_stage}")
    return None


class Authorizer:
    """The admission state of a node: the owner key, the verified roles, the revoked peers."""

    def __init__(self, *, run_id: str, owner_public_key: str, open_relays: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_id = run_id
        self.owner_public_key = owner_public_key  # "": a run open for testing (--insecure-unsigned)
        self.open_relays = open_relays
        self.clock = clock  # wall clock: certificates expire at a wall time
        self.revoked: frozenset[str] = frozenset()
        self.revocations_issued = -1
        self.revocations_raw: bytes | None = None  # the bytes of the list adopted (passed on as they came: spread.py)
        self.on_revoked: Callable[[str], None] = lambda peer: None
        self.on_adopted: Callable[[str | None], None] = lambda source: None  # a newer list, from that peer or None
        self._checked: dict[tuple[str, bytes, str], int] = {}  # (peer, certificate, role) -> expiry (0: none)
        self.begun: Callable[[], Container[int]] = lambda: ()  # the iterations begun here (node.py wires it)

    @classmethod
    def of_run(cls, manifest, *, revocations: Path | None = None) -> "Authorizer":
        """The authorizer of a node of `manifest` (signed, or run with --insecure-unsigned: said loudly)."""
        a = cls(run_id=manifest.run_id, owner_public_key=manifest.owner_public_key, open_relays=manifest.open_relays)
        if a.insecure:
            log.warning("INSECURE: run %s has no owner signature and is open for testing "
                        "(--insecure-unsigned): any peer may join it in any role", manifest.run_id)
        if revocations is not None:
            a.load_revocations_file(revocations)
        return a

    @property
    def insecure(self) -> bool:
        return not self.owner_public_key

    def check_hello(self, peer: str, msg: m.Hello) -> Refusal | None:
        """Whether `peer` may say this Hello: its certificate admits it as the role it claims."""
        if peer in self.revoked:
            return Refusal(RefusalCode.REVOKED, "the run owner revoked this peer's admission")
        if self.insecure or msg.role not in ("data", "relay"):
            return None  # an open run; an unknown role is refused by discovery with its own code
        if not msg.certificate:
            if msg.role == "relay" and self.open_relays:
                return None
            what = "data nodes" if msg.role == "data" else "relays (the run is not open to any relay)"
            return Refusal(RefusalCode.NOT_ADMITTED, f"Hello as a {msg.role} without a certificate: this run admits "
                                                     f"{what} by the owner's certificate (gwtf-node admit)")
        key = (peer, msg.certificate, msg.role)
        expires = self._checked.get(key)
        now = self.clock()
        if expires is not None and (expires == 0 or now < expires):
            return None
        try:
            c = check_certificate(msg.certificate, owner_public_key=self.owner_public_key, run_id=self.run_id,
                                  peer_id=peer, role=msg.role, now=now)
        except AdmissionError as e:
            return Refusal(_PROBLEM_CODE.get(e.problem, RefusalCode.BAD_CERTIFICATE), str(e))
        if len(self._checked) > 4096:  # a bound on the cache: one entry per peer and certificate seen
            self._checked.clear()
        self._checked[key] = c.expires
        return None

    def check_revoked(self, peer: str) -> Refusal | None:
        if peer in self.revoked:
            return Refusal(RefusalCode.REVOKED, "the run owner revoked this peer's admission")
        return None

    def take_revocations(self, raw: bytes, where: str, source: str | None = None) -> list[str]:
        """Adopt the revocation list in `raw` if the owner signed it and it is newer; the peers newly revoked.
        `source`: the peer that sent it (spread.py passes a list on to every other peer)."""
        if self.insecure:
            log.warning("revocation list from %s ignored: this run has no owner key to check it", where)
            return []
        try:
            rl: RevocationList = check_revocations(raw, owner_public_key=self.owner_public_key, run_id=self.run_id)
        except AdmissionError as e:
            log.warning("revocation list from %s refused: %s", where, e)
            raise
        if rl.issued <= self.revocations_issued:
            return []
        new = sorted(set(rl.peer_ids) - self.revoked)
        self.revoked = frozenset(rl.peer_ids)
        self.revocations_issued = rl.issued
        self.revocations_raw = bytes(raw)
        if new:
            log.warning("the run owner revoked %d peer(s) (list from %s): %s", len(new), where,
                        ", ".join(p[:16] for p in new))
        for peer in new:
            self.on_revoked(peer)
        self.on_adopted(source)
        return new

    def load_revocations_file(self, path: Path) -> None:
        self.take_revocations(Path(path).read_bytes(), str(path))

    def check(self, peer: str, msg: object, needs: Needs, peers, leadership) -> Refusal | None:
        """The refusal of `msg` from `peer` by what its route `needs`, or None (node.py `_on_frame`)."""
        if needs is Needs.ADMISSION:
            return self.check_hello(peer, msg)
        return decide(needs, msg, peers.get(peer), self._snapshot(msg, peers, leadership))

    def _snapshot(self, msg: object, peers, leadership) -> Snapshot:
        leader, term = leadership.leader_of_term()
        begun = self.begun() if isinstance(msg, m.BeginAggregation) else ()  # (only BEGIN asks: `duplicate_begin`)
        return Snapshot(peers.role, peers.stage, peers.n_stages, leader, term, begun)

    def observe(self, peer: str, msg: object, needs: Needs, peers, leadership) -> None:
        """A relay learns the leader of a term from the leader's messages it took (a data node learns terms in
        its election machine): the message of a newer term makes the sender that term's leader; a duplicate
        BEGIN (`duplicate_begin`) teaches nothing."""
        term = message_term(msg)
        if term is None or peers.role != "relay" or needs not in (Needs.LEADER, Needs.UPSTREAM):
            return
        if isinstance(msg, m.BeginAggregation) and duplicate_begin(msg, self._snapshot(msg, peers, leadership)):
            return
        sender = peers.get(peer)
        if sender is not None and sender.role == "data":
            leadership.learned_leader(peer, term)

    def screen(self, peer: str, wire) -> bool:
        """Whether a frame of `peer` is read at all: a banned peer's are dropped unread (counted, not logged),
        a revoked peer's refused."""
        if wire.bans.banned_until and wire.is_banned(peer):
            wire.count_refusal(RefusalCode.BANNED)
            return False
        revoked = self.check_revoked(peer)
        if revoked is not None:
            wire.refuse(peer, revoked.why, revoked.code)
            return False
        return True

    def allow(self, peer: str, msg: object, needs: Needs, peers, leadership, wire) -> bool:
        """Whether `peer` may send `msg`; if not, the frame is refused with its code (a refused Hello is
        answered with `Refused`: the sender stops if no peer accepted it yet, bootstrap.py)."""
        refusal = self.check(peer, msg, needs, peers, leadership)
        if refusal is None:
            self.observe(peer, msg, needs, peers, leadership)
            return True
        if isinstance(msg, m.Hello):
            wire.post(peer, m.Refused(refusal.code, refusal.why))
        wire.refuse(peer, f"{type(msg).__name__}: {refusal.why}", refusal.code)
        return False

    def status(self, wire) -> dict:
        """status.json's security fields: refusals per code, an insecure run, revoked and banned peers."""
        return {"refused": dict(sorted(wire.refused_by.items())), "insecure_unsigned": self.insecure,
                "revoked": sorted(self.revoked), "banned": sorted(wire.bans.banned_until)}


def read_certificate(given: Path | None, state_dir: Path) -> bytes:
    """This node's admission certificate (`--certificate`, else `<state_dir>/certificate.json`); b"": none."""
    from ...model.certificates import CERTIFICATE_FILE

    path = given if given is not None else Path(state_dir) / CERTIFICATE_FILE
    if not path.exists():
        if given is not None:
            raise FileNotFoundError(f"--certificate {path}: no such file")
        return b""
    return path.read_bytes().strip()


__all__ = ["Authorizer", "Needs", "Refusal", "RefusalCode", "Snapshot", "admitted_voters", "decide", "leader_of_term",
           "message_term", "read_certificate"]

"""BEGIN AGGREGATION's groups sent once: later copies name a stage's group by a digest where the receiver holds it.

Theory of operation
-------------------
BEGIN names every stage's members (`groups`, the leader's decision), pruned as it travels
(`phasewaits.begin_for`); as peer ids they are nearly all of its bytes (at 100 daemons 5.5 of its 6.0 kB
from the leader, 1.2-3.9 kB a copy from a relay) and, while nobody joins or leaves a stage, that stage's
group is the same every iteration.  So a sender names a group its receiver already holds by a digest of it
(`StageMembers.digest`, a BLAKE2b of the stage and its peers; `peers` left empty) and sends in full only the
groups that changed:

* the receiver keeps the groups it was sent in full, the newest `GROUPS_KEPT` (`expand` fills a copy's
  groups by digest from them);
* the sender counts a receiver as holding the groups of the last BEGIN it acknowledged (the copy that
  waited for the acknowledgement carries them in full: only frames leave groups out, `acked`), and names
  those by digest in what it sends that receiver next (`outgoing`; resends too);
* a receiver that lacks one (it restarted, or dropped it) does not apply the copy and answers
  `PhaseAck(GROUPS, iteration)` (phases.py `on_begin`); the sender drops what it thought the receiver
  held and sends the full copy at once (`missing`): a copy by digest costs at most one round trip more
  than a full one, and never a wrong group;
* a peer forgotten or back (`forget`) is sent every group in full again.

An empty stage's group (no peers, no digest) stays as it is.  Every node's phase tables hold BEGIN with
its groups (`Phases.begin_msgs`).  `Phases(groups_by_digest=False)` sends every copy in full
(`gwtf-node sim train --begin-groups full`).  Pure: a hash of the ids, no clock, no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from hashlib import blake2b

from .effects import Send
from .messages import BeginAggregation, StageMembers

GROUPS_KEPT = 1024  # a receiver keeps this many groups by digest (the least recently used goes first)
DIGEST_BYTES = 8  # BLAKE2b digest size of a group (bounds.py: a longer one is refused)


def group_digest(group: StageMembers) -> bytes:
    """The digest of one stage's group as BEGIN carries it (its stage and its peers, in their order)."""
    h = blake2b(f"{group.stage}\x00{len(group.peers)}\x00".encode(), digest_size=DIGEST_BYTES)
    for p in group.peers:
        h.update(p.encode() + b"\x00")
    return h.digest()


def by_digest(msg: BeginAggregation) -> bool:
    """`msg` names a group by digest that it does not carry (the receiver could not fill it in)."""
    return any(g.digest for g in msg.groups)


@dataclass(slots=True)
class DigestStats:
    full: int = 0  # BEGIN copies sent with every group in full
    by_digest: int = 0  # BEGIN copies sent with a group (or more) named by digest
    group_ids_sent: int = 0  # peer ids the groups of the copies sent named (each about 55 bytes on the wire)
    missing: int = 0  # copies by digest whose receiver lacked a group (sent again in full)


class GroupDigests:
    """One node's groups by digest: what it holds as a receiver and what each receiver holds (module doc)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.seen: dict[bytes, StageMembers] = {}  # digest -> a group received in full (the newest GROUPS_KEPT)
        self.held: dict[str, frozenset[bytes]] = {}  # receiver -> the digests of the groups it acknowledged
        self.stats = DigestStats()

    def outgoing(self, to: str, msg: object) -> object:
        """`msg` as it goes to `to`: a BEGIN's groups that `to` holds named by digest; anything else as it is."""
        if not isinstance(msg, BeginAggregation) or not msg.groups:
            return msg
        held = self.held.get(to) if self.enabled else None
        out = msg.groups if not held else tuple(self._named(g, held) for g in msg.groups)
        self.stats.group_ids_sent += sum(len(g.peers) for g in out)
        if out == msg.groups:
            self.stats.full += 1
            return msg
        self.stats.by_digest += 1
        return replace(msg, groups=out)

    @staticmethod
    def _named(g: StageMembers, held: frozenset[bytes]) -> StageMembers:
        """`g` by its digest if the receiver holds it (an empty stage's group stays as it is)."""
        d = group_digest(g) if g.peers else b""
        return StageMembers(g.stage, (), digest=d) if d in held else g

    def acked(self, sender: str, msg: object) -> None:
        """`sender` acknowledged `msg` (the copy this node sends it, groups in full): it holds those groups."""
        if isinstance(msg, BeginAggregation) and msg.groups:
            self.held[sender] = frozenset(group_digest(g) for g in msg.groups if g.peers)

    def missing(self, sender: str, msg: object) -> list[Send]:
        """`sender` lacks a group a copy by digest named: the full copy of `msg` (the BEGIN not acknowledged yet,
        None if it is), sent at once."""
        self.held.pop(sender, None)
        self.stats.missing += 1
        return [Send(sender, self.outgoing(sender, msg))] if isinstance(msg, BeginAggregation) else []

    def expand(self, msg: BeginAggregation) -> BeginAggregation:
        """A BEGIN received: its groups in full are kept by their digests, those named by digest filled in from
        what this node keeps (a group it does not keep stays by digest: `by_digest`, the caller asks for it)."""
        out = tuple(self._fill(g) for g in msg.groups)
        while len(self.seen) > GROUPS_KEPT:
            del self.seen[next(iter(self.seen))]
        return msg if out == msg.groups else replace(msg, groups=out)

    def _fill(self, g: StageMembers) -> StageMembers:
        if g.peers or not g.digest:  # in full (a digest beside the peers means nothing), or an empty stage
            g = StageMembers(g.stage, g.peers)
            if g.peers:
                self._keep(group_digest(g), g)
            return g
        kept = self.seen.get(g.digest)
        if kept is None or kept.stage != g.stage:
            return g
        self._keep(g.digest, kept)
        return kept

    def _keep(self, d: bytes, g: StageMembers) -> None:
        self.seen.pop(d, None)
        self.seen[d] = g

    def forget(self, peer: str) -> None:
        """`peer` was forgotten or is back: it is sent every group in full again."""
        self.held.pop(peer, None)

"""Recent events of a node: crashes detected, reroutes, joins, leaves, elections (the dashboard's event list).

`EventLog` is a bounded ring (the newest `EVENTS_KEPT`) plus a count per
kind since the node started (Prometheus counters, metrics.py).  An event is
plain data: when (wall time, for a person), what kind, one line of text and
the peer it is about.

`EventFeed` turns what the status component reads once a second (status.py
`observe`) into events, by comparing it with what it read the time before:

* the peers table (`peers_seen`): a peer that appears is a join (or is back,
  if it was gone); a relay whose stage changes is placed; a peer whose Hello
  says it is leaving starts its leave; a peer with another incarnation
  restarted; a peer that disappears crashed if the liveness check presumed
  it dead, else it left (it said Goodbye);
* who leads and in which term (`leader_seen`): a change is an election,
  kept also in the list of recent elections;
* the recovery machine's counters (`recovery_counters`): reroutes,
  microbatches deferred, stage forwards recomputed and gradients resent
  since the last round, one event per kind that moved.

Reading snapshots instead of hooking every component keeps the daemon's
code paths as they are; an event is then stamped within a second of when it
happened, and something undone within the second (a peer presumed dead and
back at once) shows as what it left behind (its new incarnation: a restart).

Nothing here does I/O or reads a clock of its own: the callers hand in the
wall time (`time.time()` in node.py and status.py), so the feed is tested
with plain numbers.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Iterable

EVENTS_KEPT = 64  # events in the ring
ELECTIONS_KEPT = 8  # recent elections listed


class EventKind(enum.Enum):
    """What happened (the dashboard colours each kind; Prometheus counts each kind)."""

    JOIN = "join"  # a peer was met, or came back after it was gone
    PLACED = "placed"  # a relay took a stage (placed by the leader, or resumed)
    LEAVE = "leave"  # a peer announced its leave, or said Goodbye
    CRASH = "crash"  # a peer presumed dead (silent), or restarted before it was found dead
    ELECTION = "election"  # the leader or its term changed, or no leader acts any more
    REROUTE = "reroute"  # microbatches rerouted around a dead or full hop
    DEFER = "defer"  # microbatches deferred to the next iteration
    RECOVERY = "recovery"  # stage forwards recomputed from a stash, or gradients resent


@dataclass(frozen=True, slots=True)
class PeerSeen:
    """What the feed compares of a peer from one round to the next (its Hello's fields)."""

    role: str
    stage: int  # the Hello's: below 0 a data node, or a relay not placed yet
    leaving: bool
    incarnation: int


@dataclass(frozen=True, slots=True)
class Event:
    at: float  # wall time (time.time())
    kind: EventKind
    text: str
    peer: str | None = None

    def to_json(self) -> dict:
        return {"at": round(self.at, 3), "kind": self.kind.value, "text": self.text, "peer": self.peer}


@dataclass(frozen=True, slots=True)
class Election:
    """A leader (or none) in a term, as this node saw it begin."""

    at: float
    term: int | None
    leader: str | None

    def to_json(self, name_of) -> dict:
        return {"at": round(self.at, 3), "term": self.term, "leader": self.leader,
                "leader_name": name_of(self.leader) if self.leader else None}


class EventLog:
    """The newest events (a ring of `size`) and how many of each kind happened since start."""

    def __init__(self, size: int = EVENTS_KEPT) -> None:
        self.ring: deque[Event] = deque(maxlen=size)
        self.counts: dict[EventKind, int] = {k: 0 for k in EventKind}

    def add(self, at: float, kind: EventKind, text: str, peer: str | None = None, count: int = 1) -> Event:
        ev = Event(at, kind, text, peer)
        self.ring.append(ev)
        self.counts[kind] += count
        return ev

    def recent(self, n: int | None = None) -> list[Event]:
        """The newest `n` events (all kept if None), oldest first."""
        items = list(self.ring)
        return items if n is None else items[-n:]


def short_id(peer_id: str) -> str:
    """A peer id as a person reads it: its last 6 characters.  Every Ed25519 peer id starts with `12D3KooW`,
    so the prefix tells nodes apart no better than nothing; the tail of the base58 text does."""
    return peer_id[-6:]


def default_name(role: str, peer_id: str) -> str:
    """The name of a node started without --name: its role and `short_id`, e.g. `relay-M3uMoe`; the same
    after every restart (the peer id comes from the state directory's key)."""
    return f"{role}-{short_id(peer_id)}"


class EventFeed:
    """Events from what the components report (see the module doc); `names` gives a peer's readable name."""

    RECOVERY_COUNTERS = (("reroutes", EventKind.REROUTE, "microbatch(es) rerouted"),
                         ("deferred", EventKind.DEFER, "microbatch(es) deferred to the next iteration"),
                         ("recovers", EventKind.RECOVERY, "stage forward(s) recomputed from a stash"),
                         ("resends", EventKind.RECOVERY, "gradient(s) resent"),
                         ("restarts", EventKind.RECOVERY, "pipeline restart(s) (SWARM)"))

    def __init__(self, log: EventLog, names) -> None:
        self.log = log
        self.name_of = names  # peer id -> readable name
        self.known: dict[str, PeerSeen] = {}  # the peers table of the last round
        self.names: dict[str, str] = {}  # and their names
        self.gone: set[str] = set()
        self.elections: deque[Election] = deque(maxlen=ELECTIONS_KEPT)
        self._leader: tuple[str | None, int | None] | None = None
        self._counters: dict[str, int] = {}

    # ------------------------------------------------------------------ peers
    def peers_seen(self, at: float, table: dict[str, PeerSeen], presumed_dead: set[str]) -> None:
        """The peers table now; `presumed_dead`: the peers the liveness check presumes dead."""
        for peer in sorted(table):
            new, old = table[peer], self.known.get(peer)
            who = self.name_of(peer)
            placed = new.role == "relay" and new.stage >= 0
            if old is None:
                where = f"relay of stage {new.stage}" if placed else \
                    "relay, not placed yet" if new.role == "relay" else "data node"
                verb = "is back" if peer in self.gone else "joined"
                self.log.add(at, EventKind.JOIN, f"{who} {verb} ({where})", peer)
            else:
                if old.incarnation and new.incarnation and old.incarnation != new.incarnation:
                    self.log.add(at, EventKind.CRASH, f"{who} restarted (a new process, same identity)", peer)
                if placed and old.stage != new.stage:
                    self.log.add(at, EventKind.PLACED, f"{who} serves stage {new.stage}", peer)
            if new.leaving and not (old is not None and old.leaving):
                self.log.add(at, EventKind.LEAVE, f"{who} announced its leave", peer)
            self.gone.discard(peer)
        for peer in sorted(set(self.known) - set(table)):
            who = self.names.get(peer) or self.name_of(peer)  # (forgotten by now: the name it had)
            if peer in presumed_dead:
                self.log.add(at, EventKind.CRASH, f"{who} presumed dead", peer)
            else:
                self.log.add(at, EventKind.LEAVE, f"{who} left", peer)
            self.gone.add(peer)
        self.known = dict(table)
        self.names = {p: self.name_of(p) for p in table}

    def me_placed(self, at: float, stage: int) -> None:
        self.log.add(at, EventKind.PLACED, f"this node serves stage {stage}")

    # ------------------------------------------------------------------ leadership
    def leader_seen(self, at: float, leader: str | None, term: int | None) -> None:
        """Who leads now as this node knows it; a change of leader or term is an election."""
        now_seen = (leader, term)
        if now_seen == self._leader:
            return
        had_leader = self._leader is not None and self._leader[0] is not None
        self._leader = now_seen
        if leader is None and not had_leader:
            return  # still no leader (a term number moving before anyone wins is not news)
        self.elections.append(Election(at, term, leader))
        if leader is None:
            text = f"no acting leader (term {term})" if term is not None else "no acting leader"
        else:
            text = f"{self.name_of(leader)} leads" + (f" in term {term}" if term is not None else "")
        self.log.add(at, EventKind.ELECTION, text, leader)

    # ------------------------------------------------------------------ microbatches
    def recovery_counters(self, at: float, counters: dict[str, int]) -> None:
        """The recovery machine's counters now (RecoveryStats); an event for each that moved since last time."""
        for key, kind, what in self.RECOVERY_COUNTERS:
            v = int(counters.get(key, 0))
            before = self._counters.get(key, 0)
            if v > before:
                self.log.add(at, kind, f"{v - before} {what}", count=v - before)
            self._counters[key] = v

    def recent_elections(self) -> Iterable[Election]:
        return list(self.elections)

"""Recent events of a node: crashes detected, reroutes, joins, leaves, elections (the dashboard's event list).

`EventLog` is a bounded ring (the newest `EVENTS_KEPT`) plus a count per
kind since the node started (Prometheus counters, metrics.py).  An event is
plain data: when (wall time, for a person), what kind, one line of text and
the peer it is about.

`EventFeed` turns what the node's components report into events and
remembers what it needs to tell news from repeats:

* a peer's Hello (`peer_hello`): a peer first met or back after it was gone
  is a join; a relay that takes a stage is placed; a peer whose Hello says it
  is leaving starts its leave;
* a peer presumed dead by the liveness check (`peer_crashed`), a peer that
  said Goodbye (`peer_left`), a peer that restarted before it was found dead
  (`peer_restarted`);
* who leads and in which term (`leader_seen`, called whenever leadership may
  have changed and once per status round): a change is an election, kept
  also in the list of recent elections;
* the recovery machine's counters (`recovery_counters`, once per status
  round): reroutes, microbatches deferred, stage forwards recomputed and
  gradients resent since the last round, one event per kind that moved.
  The machine counts these inside pure code that has no event hook; reading
  its counters once a second gives the same totals, grouped by second.

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


class GoneHow(enum.Enum):
    """Why the node forgets a peer (node.py `_peer_gone`)."""

    CRASHED = "crashed"  # presumed dead by the liveness check
    LEFT = "left"  # it said Goodbye
    FORGOTTEN = "forgotten"  # its old incarnation, when it restarted (`peer_restarted` said so)


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
        self.known: dict[str, tuple[str, int, bool]] = {}  # peer -> (role, stage, leaving) as last heard
        self.gone: set[str] = set()
        self.elections: deque[Election] = deque(maxlen=ELECTIONS_KEPT)
        self._leader: tuple[str | None, int | None] | None = None
        self._counters: dict[str, int] = {}

    # ------------------------------------------------------------------ peers
    def peer_hello(self, at: float, peer: str, role: str, stage: int, leaving: bool) -> None:
        """A Hello from `peer` (stage: the Hello's; below 0 a data node or a relay not placed yet)."""
        who = self.name_of(peer)
        old = self.known.get(peer)
        placed = role == "relay" and stage >= 0
        where = f"relay of stage {stage}" if placed else "relay, not placed yet" if role == "relay" else "data node"
        if old is None or peer in self.gone:
            self.log.add(at, EventKind.JOIN, f"{who} {'is back' if peer in self.gone else 'joined'} ({where})", peer)
        elif placed and old[1] != stage:
            self.log.add(at, EventKind.PLACED, f"{who} serves stage {stage}", peer)
        if leaving and not (old is not None and old[2] and peer not in self.gone):
            self.log.add(at, EventKind.LEAVE, f"{who} announced its leave", peer)
        self.gone.discard(peer)
        self.known[peer] = (role, stage, leaving)

    def peer_gone(self, at: float, peer: str, how: GoneHow) -> None:
        if how is GoneHow.CRASHED:
            self.peer_crashed(at, peer)
        elif how is GoneHow.LEFT:
            self.peer_left(at, peer)

    def peer_crashed(self, at: float, peer: str, silent_s: float | None = None) -> None:
        detail = f" (silent for {silent_s:.1f} s)" if silent_s is not None else ""
        self.log.add(at, EventKind.CRASH, f"{self.name_of(peer)} presumed dead{detail}", peer)
        self.gone.add(peer)

    def peer_left(self, at: float, peer: str, after_iteration: int | None = None) -> None:
        after = f" after iteration {after_iteration}" if after_iteration is not None else ""
        self.log.add(at, EventKind.LEAVE, f"{self.name_of(peer)} left{after}", peer)
        self.gone.add(peer)

    def peer_restarted(self, at: float, peer: str) -> None:
        self.log.add(at, EventKind.CRASH, f"{self.name_of(peer)} restarted (a new process, same identity)", peer)

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

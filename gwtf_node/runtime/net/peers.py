"""Peers: who this node knows in its run, where each sits, and this node's own place among them.

The table is filled from `Hello` frames (`discovery.py`) and emptied by
`forget` when a peer crashes (`liveness.py`) or says Goodbye (`joining.py`).
A forgotten peer is remembered as *gone* until it says Hello again (a
restarted node keeps its peer id), so that its last frames in flight are
ignored instead of refused and nothing is sent to it any more.

Coming back.  Every process draws an `incarnation` at start and its Hello
carries it.  `arrival` sorts a Hello: from a peer never seen (NEW), from the
peer as we know it (SAME), from a peer that is gone (BACK: it crashed or said
Goodbye, and was forgotten), or from a known peer with another incarnation
(RESTARTED: it crashed and came back before the liveness check noticed).  A
peer BACK or RESTARTED is a new join of the same identity: the node checks it
(`readmission_refusal`) and, for RESTARTED, first forgets the old incarnation
everywhere, as if it had been presumed dead.

`AddressBook` keeps the addresses of the peers met, in the state directory,
so that a node restarted with it (maybe on another port, maybe with no
bootstrap address) dials them and is taken back.

`Place` is this node's own entry, the fields of the Hello it sends: role,
stage (None while a `--stage auto` relay waits for the leader), capacity and
its standing (joining and ready from which iteration, leaving after which
iteration).  Only the joining-and-leaving component changes the standing and
the stage; everyone reads them here.

Everything here but `AddressBook` is plain data with queries over it: no
I/O, no timers.
Neighbour lists are sorted by peer id so every node and every run sees them
in the same order.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("gwtf.node")


@dataclass
class PeerInfo:
    peer_id: str
    role: str = "?"
    stage: int = -2
    name: str = ""
    capacity: int = 0
    addrs: tuple[str, ...] = ()
    rtt_ms: float | None = None
    joining: bool = False
    ready_from: int = 0
    leaving: bool = False
    leave_after: int = 0
    steps: int = 0  # optimizer steps applied to its part, as of its last Hello
    incarnation: int = 0  # drawn by its process at start (its Hello): another value is the node restarted


class Arrival(enum.Enum):
    """What a Hello means for the table (`Peers.arrival`)."""

    NEW = "new"  # a peer never seen
    SAME = "same"  # the peer as known: a Hello with news (stage, standing) or a repeat
    BACK = "back"  # a peer that is gone (presumed dead or said Goodbye) says Hello again
    RESTARTED = "restarted"  # a known peer with another incarnation: it restarted before it was found dead
    FORGOT_US = "forgot us"  # a known peer that presumed this node dead (a partition, a stall): both start over


@dataclass
class Place:
    """This node's own place in the run (what its Hello says)."""

    role: str  # "data" | "relay"
    stage: int | None  # -1: a data node; None: a relay waiting to be placed
    capacity: int
    joining: bool = False
    ready_from: int = 0
    leaving: bool = False
    leave_after: int = 0


@dataclass
class Peers:
    me: str
    name: str
    n_stages: int
    place: Place
    peers: dict[str, PeerInfo] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # crashed or said Goodbye, not back since
    former_names: dict[str, str] = field(default_factory=dict)  # forgotten peers' names, for the logs
    former_incarnations: dict[str, int] = field(default_factory=dict)  # forgotten peers' incarnations (a return)
    last_heard: dict[str, float] = field(default_factory=dict)
    last_change: float = 0.0  # when a peer last appeared or changed role or stage
    # this node's standing changed (`set_standing`): the node wires it to the microbatch machine
    on_standing: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    # ------------------------------------------------------------------ own place
    @property
    def role(self) -> str:
        return self.place.role

    @property
    def stage(self) -> int | None:
        return self.place.stage

    @property
    def capacity(self) -> int:
        return self.place.capacity

    def take_stage(self, stage: int) -> None:
        self.place.stage = stage

    def set_capacity(self, capacity: int) -> None:
        self.place.capacity = capacity

    def set_standing(self, *, joining: bool | None = None, ready_from: int | None = None,
                     leaving: bool | None = None, leave_after: int | None = None) -> None:
        p = self.place
        p.joining = p.joining if joining is None else joining
        p.ready_from = p.ready_from if ready_from is None else ready_from
        p.leaving = p.leaving if leaving is None else leaving
        p.leave_after = p.leave_after if leave_after is None else leave_after
        self.on_standing()

    # ------------------------------------------------------------------ the table
    def __contains__(self, peer: str) -> bool:
        return peer in self.peers

    def get(self, peer: str) -> PeerInfo | None:
        return self.peers.get(peer)

    def ids_known(self) -> list[str]:
        return list(self.peers)

    def infos(self) -> list[PeerInfo]:
        return list(self.peers.values())

    def arrival(self, peer: str, incarnation: int) -> Arrival:
        """How a Hello from `peer` carrying `incarnation` arrives (see the module doc)."""
        if peer in self.gone:
            return Arrival.BACK
        old = self.peers.get(peer)
        if old is None:
            return Arrival.NEW
        if incarnation and old.incarnation and incarnation != old.incarnation:
            return Arrival.RESTARTED
        return Arrival.SAME

    def upsert(self, info: PeerInfo, now: float) -> tuple[PeerInfo | None, bool]:
        """A Hello from `info.peer_id`: (the entry it replaces, whether its role or stage changed)."""
        old = self.peers.get(info.peer_id)
        self.gone.discard(info.peer_id)  # back (a restart keeps its peer id)
        if old is not None and info.rtt_ms is None:
            info.rtt_ms = old.rtt_ms
        changed = old is None or (old.role, old.stage) != (info.role, info.stage)
        self.peers[info.peer_id] = info
        if changed:
            self.last_change = now
        return old, changed

    def set_rtt(self, peer: str, rtt_ms: float | None) -> None:
        if peer in self.peers:  # (it may have died meanwhile)
            self.peers[peer].rtt_ms = rtt_ms

    def forget(self, peer: str) -> None:
        info = self.peers.pop(peer, None)
        if info is not None and info.name:
            self.former_names[peer] = info.name  # (logs keep calling it by its name: `who`)
        if info is not None and info.incarnation:
            self.former_incarnations[peer] = info.incarnation
        self.gone.add(peer)
        self.last_heard.pop(peer, None)

    def drop(self, peer: str) -> None:
        """Out of the table without being gone: a peer this node does not work with (fanout.py).  A Hello from it
        later is a first meeting, not a return."""
        self.peers.pop(peer, None)
        self.last_heard.pop(peer, None)

    def is_gone(self, peer: str) -> bool:
        return peer in self.gone

    def seen_before(self, peer: str) -> bool:
        """`peer` is in the table or gone: a Hello from it is not a first meeting."""
        return peer in self.peers or peer in self.gone

    def heard(self, peer: str, now: float) -> None:
        self.last_heard[peer] = now

    def silent_for(self, peer: str, now: float) -> float:
        """Seconds since `peer` was last heard (a peer never heard counts from now on)."""
        return now - self.last_heard.setdefault(peer, now)

    def heard_within(self, within_s: float, now: float) -> list[str]:
        """Peers in the table, not gone, that sent anything in the last `within_s` seconds."""
        return [p for p in self.peers if p not in self.gone
                and now - self.last_heard.get(p, -within_s) < within_s]

    def who(self, peer: str) -> str:
        p = self.peers.get(peer)
        return p.name if p and p.name else self.former_names.get(peer, peer[:16])

    # ------------------------------------------------------------------ neighbours
    def ids(self, role: str, stage: int | None = None) -> list[str]:
        return sorted(p.peer_id for p in self.peers.values()
                      if p.role == role and (stage is None or p.stage == stage))

    def data_nodes(self) -> list[str]:
        return sorted(self.ids("data") + ([self.me] if self.role == "data" else []))

    def data_nodes_ready(self, iteration: int) -> list[str]:
        """Data nodes whose part is ready for `iteration` (this node included): those the leader waits for and
        counts in the aggregation of `iteration`.  A data node back after a restart says Hello joining while it
        settles the run's step, then ready from the iteration it opens first."""
        mine = [self.me] if self.role == "data" and not self.place.joining and self.place.ready_from <= iteration \
            else []
        return sorted(mine + [p.peer_id for p in self.peers.values() if p.role == "data" and not p.joining
                              and p.ready_from <= iteration])

    def next_stage_ids(self) -> list[str]:
        if self.role == "data":
            return self.ids("relay", 0)
        if self.stage == self.n_stages - 1:
            return self.data_nodes()
        return self.ids("relay", self.stage + 1)

    def prev_stage_ids(self) -> list[str]:
        if self.role == "data":
            return self.ids("relay", self.n_stages - 1)
        if self.stage == 0:
            return self.data_nodes()
        return self.ids("relay", self.stage - 1)

    def stage_group(self) -> list[str]:
        if self.role == "data":
            return self.data_nodes()
        return sorted(self.ids("relay", self.stage) + [self.me])

    def watches_loosely(self, pid: str) -> bool:
        """`pid` is a data node and this node a relay of a middle stage: they work together only through the
        stages between them, so its liveness check gives that peer the loose deadline (liveness.py)."""
        p = self.peers.get(pid)
        return (p is not None and p.role == "data" and self.role == "relay" and self.stage is not None
                and 0 < self.stage < self.n_stages - 1)

    def watched(self) -> set[str]:
        """The peers this node works with: its stage, the stages before and after, the data nodes."""
        if self.stage is None:
            return set()
        ids = set(self.data_nodes()) | set(self.next_stage_ids()) | set(self.prev_stage_ids())
        if self.role == "relay":
            ids |= set(self.ids("relay", self.stage))
        ids.discard(self.me)
        return {p for p in ids if p in self.peers}

    def flow_side(self, stage: int) -> str | None:
        """Where a relay of `stage` sits for this node's flow machine: "next", "prev", "peer" or nowhere."""
        last = self.n_stages - 1
        if self.role == "data":
            return "next" if stage == 0 else "prev" if stage == last else None
        if stage == self.stage:
            return "peer"
        return "next" if stage == self.stage + 1 else "prev" if stage == self.stage - 1 else None

    def usable(self, iteration: int) -> set[str]:
        """Next hops that may take a microbatch of `iteration` (not joining, not gone by then)."""
        return {p.peer_id for p in self.peers.values()
                if not p.joining and not (p.leaving and p.leave_after < iteration)}

    def groups(self, iteration: int) -> dict[int, list[str]]:
        """Who takes part in each stage's aggregation of `iteration`: relays and data nodes ready for it."""
        groups: dict[int, list[str]] = {-1: self.data_nodes_ready(iteration)}
        for k in range(self.n_stages):
            groups[k] = sorted(p.peer_id for p in self.peers.values()
                               if p.role == "relay" and p.stage == k and not p.joining and p.ready_from <= iteration
                               and not (p.leaving and p.leave_after < iteration))
        return groups


def readmission_refusal(info: PeerInfo, *, n_stages: int) -> str | None:
    """Why a peer coming back (BACK or RESTARTED) is not taken back now, or None to take it back.

    Run and role were checked with every Hello (discovery.py).  A relay must
    name a stage of the run, or -2 (a `--stage auto` relay waiting to be
    placed).  Steps apart are no reason to refuse: a peer behind catches
    up as a joiner does (its Hello says from which iteration it is ready,
    `ready_from`), and a stage peer ahead by more than one aggregation means
    that this node was cut off (a partition) while the stage stepped: this
    node catches up from it (`Joining.catch_up`; the state it downloads is
    checked against the stage's other members, handover.py), and takes no
    part in the stage's all-reduce until then.
    """
    if info.role == "relay" and not (info.stage == -2 or 0 <= info.stage < n_stages):
        return f"it comes back as a relay of stage {info.stage}, the run has stages 0..{n_stages - 1}"
    return None


class AddressBook:
    """The addresses of the peers met in a run, kept in the state directory (`peers.json`):
    {"run_id": ..., "peers": {peer id: [multiaddr]}}.

    A node restarted with its state directory dials them (its old peers know
    its peer id and take it back), so it needs neither its old port nor a
    bootstrap address.  A book of another run is not used (its peers would
    refuse this node)."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.known: dict[str, list[str]] = {}

    def load(self) -> dict[str, list[str]]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict) or raw.get("run_id") != self.run_id or not isinstance(raw.get("peers"), dict):
            return {}
        self.known = {str(p): [str(a) for a in addrs if isinstance(a, str)] for p, addrs in raw["peers"].items()
                      if isinstance(addrs, list)}
        return dict(self.known)

    def dial_addrs(self, me: str) -> list[str]:
        """One multiaddr per peer in the book (ending in /p2p/<peer id>), this node excluded."""
        out = []
        for pid, addrs in sorted(self.known.items()):
            if pid != me and addrs:
                a = addrs[0]
                out.append(a if "/p2p/" in a else f"{a}/p2p/{pid}")
        return out

    def note(self, peer: str, addrs: tuple[str, ...]) -> None:
        """`peer` said Hello from `addrs`: written down when that is news (replaced atomically)."""
        if not addrs or self.known.get(peer) == list(addrs):
            return
        self.known[peer] = list(addrs)
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"run_id": self.run_id, "peers": self.known}, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:  # (a full disk costs the address book, not the run)
            log.warning("could not write the address book %s: %s", self.path, e)

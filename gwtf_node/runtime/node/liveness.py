"""Liveness: who is alive is decided by our own messages, never by the DHT.

Every `PING_EVERY_S` a node looks at the peers it works with (its stage, the
stages before and after, the data nodes): it pings a peer silent for a third
of that peer's deadline (`PING_AFTER`: at least `PING_EVERY_S`), and presumes
dead a peer it heard nothing from for longer than the deadline (any frame
counts, `Peers.heard`).  A peer that sends anything is not pinged, and one
side's Ping is heard by the other, so a quiet pair exchanges one Ping and its
Pong per third of a deadline.  A dead peer goes to `on_dead`, which forgets
it everywhere (routing, flow machine, aggregation groups, recovery machine,
all-reduce in flight).  The simulator models this check with the same
constants (`sim/train/setting.py`, DAEMON_DETECT_S and the others).

Watching follows the work (`loose`).  A relay watches another relay closely only while it works with it (`at_work`,
asked once per check: the flows through this node, its microbatches in flight, the aggregation's groups and waits,
node.py; a relay's stage-mates from its second aggregation on, protocol/phasewaits.py `peers_at_work`), or while its
last connection to this node is closed, not opened again and it was not heard since (`connection_lost`,
`connection_back`: a process that ends closes its connections, and a dial to it is refused).  The other relays of
its stage and the stages next to it, and a data node watched from a middle stage (its microbatches' passes count as
hearing it, microbatches.py), get the loose floor `loose_floor_s`: 30 s, or 2.5 s per peer watched loosely when more
than 12 (a Ping after a third), so that a node's Pings grow with its work, not with the relays per stage.  A peer
watched closely from now has its silence counted, for its Ping as for the close deadline, only from then
(`close_since`): an aggregation's stage-mates, silent since the last one, are heard in its all-reduce, not pinged at
its start (one whose connection closed is pinged at once).  A data node watches the first and last stages' relays
closely.  A crashed relay process is found within 7 s by every relay connected to it (not a data node by the middle
relays: 77 relays pinging a saturated data node every 2 s is the likely cause of a 100-daemon stall); a machine that
goes away without closing its connections, by the nodes working with it within 7 s, by the others within the loose
floor plus a second (the simulator's `idle_detect_s`, `middle_data_detect_s`).

Busy is not dead.  Compute, steps and checkpoint writes run in worker
threads (stage.py, allreduce.py, checkpoints.py), but on a loaded machine a
loop still runs late (looplag.py), so a deadline scales with the work measured
(`dead_after_s`): max(DEAD_AFTER_S, BUSY_FACTOR x max(peer's work, own work)),
the peer's work being what its Pongs tell (`compute_ms`, Equation 1's c_j, and
`busy_ms`, its longest work or event-loop lag), this node's own its longest
work (`LocalStage.busiest_s`: a compute, a step, a checkpoint, an all-reduce)
or loop lag: stage-mates hold parts of about the same size.  Floor 6 s,
factor 2, ceiling MAX_DEADLINE_S (600 s): a model of a few MB stays at the
floor, and a crash is found as quickly as ever.

Slow is not dead either: a peer's deadline grows with its round trips
(`RoundTrips`).

Silence counts only while this node's own loop ran: when the check wakes
more than `SELF_STALL_S` late, every peer's silence restarts then
(`resumed_at`): the frames that came meanwhile are unread in the sockets.

A peer presumed dead that is heard again says Hello (a restarted node keeps
its peer id): `peer_back` takes it off the presumed-dead list; the node
re-admits it everywhere (node.py).  A restarted one whose Hello did not
reach this node answers its Pings all the same: a Pong says its incarnation,
and one from another than the Hello's is not heard (the old process is found
dead in time) and asks for the new one's Hello (`Discovery.ask_restarted`).
A relay with no live data node says so when that starts and every
`WAITING_LOG_EVERY_S` (`waiting_for_data_since` in status.json).  `exchange`
sends one Ping (or a LinkProbe) and waits for its Pong; `measure_rtt` takes
the best of three round trips (Equation 1's latency term, a joiner's cost to
each stage).
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

from ...protocol import messages as m
from ..ops.looplag import LoopLag
from .waits import wait_entry
from ..net.peers import Peers
from ..net.wire import Wire, now
from .snapshots import LivenessStatus

log = logging.getLogger("gwtf.node")

PING_EVERY_S = 1.0  # the check's period
PING_AFTER = 1.0 / 3.0  # a peer silent for this fraction of its deadline is pinged (module doc)
DEAD_AFTER_S = 6.0  # the deadline's floor (module doc)
LOOSE_DEAD_AFTER_S = 30.0  # ... for a peer watched loosely (module doc) ...
LOOSE_S_PER_PEER = 2.5  # ... or this many seconds per peer watched loosely, when more (`loose_floor_s`)
BUSY_FACTOR = 2.0  # ... and its factor over the longest work measured
MAX_DEADLINE_S = 600.0  # ... and its ceiling (a peer cannot buy itself a longer one by what it tells)
SELF_STALL_S = 1.0  # the check woke this much later than its period: silence counts again from then
PONG_WAIT_S = 5.0  # a round trip sample is given up after this long
RTT_FACTOR = 3.0  # a peer's deadline is at least this many of its retransmission timeouts (module doc)
PINGS_KEPT = 8  # liveness Pings awaiting their Pong, kept per peer to time their round trips
WAITING_LOG_EVERY_S = 30.0  # a relay with no live data node says so this often


class RoundTrips:
    """One peer's smoothed round trip (RFC 6298's srtt and rttvar, in seconds).

    Slow is not dead.  Each liveness Ping's round trip is timed (at most `PINGS_KEPT` nonces per peer) and smoothed
    as TCP does (RFC 6298: srtt, rttvar, gains 1/8 and 1/4); a peer's deadline is at least `RTT_FACTOR` x its
    retransmission timeout (srtt + 4 x rttvar): a Ping goes after a third of the deadline, so its Pong has two
    timeouts.  Round trips grow when a path or a peer is overloaded (on a machine with more daemons than cores:
    loopback round trips of 0.3-4.5 s with 50 daemons on 2 cores, each loop's own lag under 2.1 s), and the deadline
    with them.  A peer not timed yet gets the longest timeout of the peers timed (a data node that every relay greets
    at once answers its first Pings as late as any).
    """

    __slots__ = ("srtt", "rttvar")

    def __init__(self, first_s: float) -> None:
        self.srtt, self.rttvar = first_s, first_s / 2.0

    def add(self, rtt_s: float) -> None:
        self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt_s)
        self.srtt = 0.875 * self.srtt + 0.125 * rtt_s

    def rto_s(self) -> float:
        """The retransmission timeout: srtt + 4 x rttvar."""
        return self.srtt + 4.0 * self.rttvar


def dead_after_s(peer_work_s: float, own_work_s: float, *, floor_s: float = DEAD_AFTER_S,
                 factor: float = BUSY_FACTOR) -> float:
    """A peer's deadline: silent longer than this, it is presumed dead (module doc: floor, factor, the works)."""
    return min(MAX_DEADLINE_S, max(floor_s, factor * max(peer_work_s, own_work_s, 0.0)))


def loose_floor_s(loose_peers: int) -> float:
    """The deadline's floor of a peer watched loosely, when this node watches `loose_peers` peers loosely: it
    pings each after a third of it, so its loose Pings stay under 3 / LOOSE_S_PER_PEER a second (1.2), however
    many relays its stage and the stages next to it have (module doc)."""
    return max(LOOSE_DEAD_AFTER_S, LOOSE_S_PER_PEER * loose_peers)


class Liveness:
    def __init__(self, wire: Wire, peers: Peers, on_dead: Callable[[str], None],
                 compute_ms: Callable[[], float] = lambda: 0.0, work_s: Callable[[], float] = lambda: 0.0,
                 at_work: Callable[[], set[str]] = set, incarnation: int = 0) -> None:
        self.wire = wire
        self.incarnation = incarnation  # this process's (its Hello's), told in each Pong
        self.peers = peers
        self.on_dead = on_dead
        self.compute_ms = compute_ms  # this node's compute per microbatch, told in each Pong (linkmeter.py)
        self.work_s = work_s  # the longest piece of work this node measured (LocalStage.busiest_s)
        self.peer_compute_ms: dict[str, float] = {}  # each peer's compute per microbatch, from its last Pong
        self.peer_busy_ms: dict[str, float] = {}  # each peer's longest work or loop lag, from its last Pong
        self.resumed_at = float("-inf")  # when this node's loop last came back from a stall (trio clock)
        self._last_check = 0.0  # when `check` last ran
        self.pongs: dict[int, tuple[trio.Event, list]] = {}  # nonce -> (answered, [the Pong])
        self.waiting_for_data_since: float | None = None  # a relay: no data node alive since then (trio clock)
        self.data_back_at: float | None = None  # ... and when the last such wait ended
        self.dead_at: dict[str, float] = {}  # peers presumed dead by this check (and not back since) -> when
        self._waiting_logged_at: float | None = None
        self.lag = LoopLag()  # this node's event-loop lag (looplag.py), probed while the check runs
        self.round_trips: dict[str, RoundTrips] = {}  # each peer's smoothed liveness round trip (module doc)
        self.pinged: dict[str, dict[int, float]] = {}  # peer -> its Pings awaiting a Pong: nonce -> sent at
        self._nonces = 0  # the last nonce given (`new_nonce`)
        self.at_work = at_work  # the peers this node works with now (module doc), asked once per check
        self.close_since: dict[str, float] = {}  # relays watched closely (at work) at the last check -> since when
        self.lost_at: dict[str, float] = {}  # peers whose last connection closed, not heard since -> when
        self.loose_peers = 0  # the peers watched loosely at the last check (`loose_floor_s`)

    @property
    def crashed(self):
        """The peers presumed dead by this check and not back since."""
        return self.dead_at.keys()

    async def loop(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.lag.loop)
            await self._check_loop()

    def deadline_s(self, peer: str) -> float:
        """`peer`'s deadline now (`dead_after_s`); this node's own work counts its event loop's longest lag
        (`lag.max_lag_s`): a machine whose loops run seconds late (more daemons than cores) answers pings as late,
        and a peer's silence then is not its death.  A data node watched by a relay of a middle stage has the
        loose floor (module doc)."""
        told = max(self.peer_compute_ms.get(peer, 0.0), self.peer_busy_ms.get(peer, 0.0)) / 1000.0
        rtts = self.round_trips.get(peer)
        rto = rtts.rto_s() if rtts is not None else max((r.rto_s() for r in self.round_trips.values()), default=0.0)
        floor = max(loose_floor_s(self.loose_peers) if self.loose(peer) else DEAD_AFTER_S, RTT_FACTOR * rto)
        return dead_after_s(told, self.busy_s(), floor_s=min(floor, MAX_DEADLINE_S))

    def loose(self, peer: str) -> bool:
        """`peer` gets the loose floor (module doc): a data node watched by a relay of a middle stage (only the relays
        of the first and last stages exchange microbatches with it: at 100 daemons, 1 + 11 x 9, a data node answered
        166-220 Pongs an iteration with every relay at the close floor), or a relay watched by a relay that does not
        work with it (as of the last check) and whose last connection did not close since it was last heard."""
        if self.peers.watches_loosely(peer):
            return True
        p = self.peers.get(peer)
        return (self.peers.role == "relay" and p is not None and p.role == "relay"
                and peer not in self.close_since)

    def _watch_work(self, watched: set[str], t: float) -> None:
        """Which relays are watched closely from this check on (`at_work`); one that comes to work now is
        watched closely from `t` (`close_since`)."""
        if self.peers.role != "relay":
            self.close_since.clear()
            return
        heard = self.peers.last_heard
        self.lost_at = {p: t0 for p, t0 in self.lost_at.items() if p in watched and heard.get(p, t0) <= t0}
        working = (self.at_work() | self.lost_at.keys()) & watched
        self.close_since = {p: self.close_since.get(p, t) for p in working}

    def connection_lost(self, peer: str) -> None:
        """`peer`'s last connection to this node closed (runtime/net/limits.py's `ConnectionLoss`): watched
        closely until it is heard again (module doc)."""
        self.lost_at[peer] = now()

    def connection_back(self, peer: str) -> None:
        """A libp2p connection to `peer` opened again (either side dialled, and its process answered the handshake:
        it lives): no longer watched closely for its lost one.  A connection also closes while both ends live (one
        closed as stale by a busy end, host.py; one reset under load), and a live peer watched closely then on a
        saturated machine misses the close deadline."""
        self.lost_at.pop(peer, None)

    def busy_s(self) -> float:
        """This node's longest work or event-loop lag (module doc), in seconds: told in every Pong."""
        return max(self.work_s(), self.lag.max_lag_s)

    def pong(self, nonce: int) -> m.Pong:
        """The Pong answering `nonce` (a Ping's or a LinkProbe's): this node's compute and busiest work."""
        return m.Pong(nonce, self.compute_ms(), round(min(self.busy_s(), MAX_DEADLINE_S) * 1000.0, 3),
                      self.incarnation)

    def other_incarnation(self, peer: str, msg: m.Pong) -> bool:
        """`msg` comes from another process than the one whose Hello this node holds for `peer`: the peer
        restarted with its peer id and its new Hello did not reach this node (module doc)."""
        info = self.peers.get(peer)
        return bool(msg.incarnation and info is not None and info.incarnation and msg.incarnation != info.incarnation)

    async def _check_loop(self) -> None:
        self._last_check = now()
        while True:
            await trio.sleep(PING_EVERY_S)
            self.check(now())

    def check(self, t: float) -> None:
        """One round of the check at time `t`: ping the quiet peers, presume dead those past their deadline."""
        if t - self._last_check > PING_EVERY_S + SELF_STALL_S:
            log.info("liveness check %.1f s late (this node's loop was held): silence counts from now",
                     t - self._last_check - PING_EVERY_S)
            self.resumed_at = t
        self._last_check = t
        self._check_data_nodes(t)
        if len(self.round_trips) > len(self.peers.peers):  # (peers forgotten for good: their round trips go)
            for pid in [p for p in self.round_trips if p not in self.peers.peers]:
                self.round_trips.pop(pid)
                self.pinged.pop(pid, None)
        watched = self.peers.watched()
        self._watch_work(watched, t)
        self.loose_peers = sum(1 for p in watched if self.loose(p))
        for pid in sorted(watched):
            silent = self.peers.silent_for(pid, t)
            deadline = self.deadline_s(pid)
            since = self.close_since.get(pid, float("-inf"))
            if min(silent, t - max(self.resumed_at, since)) > deadline:
                self._presume_dead(pid, silent, deadline)
                continue
            quiet = silent if pid in self.lost_at else min(silent, t - since)  # (module doc: from `close_since`)
            if quiet >= max(PING_EVERY_S, PING_AFTER * deadline):
                self._ping(pid, t)

    def _ping(self, peer: str, t: float) -> None:
        """Post a liveness Ping to `peer`, its nonce kept to time the round trip (module doc)."""
        nonce = self.new_nonce()
        out = self.pinged.setdefault(peer, {})
        if len(out) >= PINGS_KEPT:
            del out[min(out, key=out.__getitem__)]  # (the oldest: its Pong is lost, or late past any use)
        out[nonce] = t
        self.wire.post(peer, m.Ping(nonce))

    def new_nonce(self) -> int:
        """A Ping's or LinkProbe's nonce: a counter, unique within this process and a byte or two on the wire."""
        self._nonces += 1
        return self._nonces

    def _presume_dead(self, peer: str, silent_s: float, deadline_s: float = DEAD_AFTER_S) -> None:
        log.warning("peer %s presumed dead: silent for %.1f s (deadline %.1f s)", self.peers.who(peer), silent_s,
                    deadline_s)
        self.dead_at[peer] = now()
        self.pinged.pop(peer, None)  # (its round trips are kept: the deadline it comes back to)
        self.on_dead(peer)
        self.wire.spawn(self.wire.disconnect, peer)  # (alive after all: the redial opens new connections)

    def peer_back(self, peer: str) -> float | None:
        """`peer` said Hello after it was forgotten: not presumed dead any more, heard now.  Returns when this
        check presumed it dead (None: it did not, e.g. the peer left or forgot this node)."""
        self.peers.heard(peer, now())
        return self.dead_at.pop(peer, None)

    def cut_off_since(self, t: float) -> bool:
        """This relay was without any data node at some time since `t` (trio clock): it was the one cut off."""
        return self.waiting_for_data_since is not None or (self.data_back_at is not None and self.data_back_at >= t)

    def _check_data_nodes(self, t: float) -> None:
        """A placed relay with no data node in its table waits for one: it says so, then every 30 s."""
        if self.peers.role != "relay" or self.peers.stage is None or self.peers.data_nodes():
            if self.waiting_for_data_since is not None:
                log.info("a data node is back after %.0f s without one", t - self.waiting_for_data_since)
                self.data_back_at = t
            self.waiting_for_data_since = self._waiting_logged_at = None
            return
        if self.waiting_for_data_since is None:
            self.waiting_for_data_since = t
        if self._waiting_logged_at is None or t - self._waiting_logged_at >= WAITING_LOG_EVERY_S:
            self._waiting_logged_at = t
            log.warning("waiting for a data node: none alive for %.0f s (training resumes when one comes back)",
                        t - self.waiting_for_data_since)

    def recently_heard(self) -> list[str]:
        """Peers that the check would not presume dead now."""
        t = now()
        return [p for p in self.peers.heard_within(float("inf"), t)
                if self.peers.silent_for(p, t) < self.deadline_s(p)]

    def hears(self, peer: str) -> bool:
        """`peer` is in the table, not gone, and the check would not presume it dead now."""
        t = now()
        return (peer in self.peers and not self.peers.is_gone(peer)
                and t - self.peers.last_heard.get(peer, t) < self.deadline_s(peer))

    async def on_ping(self, peer: str, msg: m.Ping) -> None:
        await self.wire.send(peer, self.pong(msg.nonce))

    def on_pong(self, peer: str, msg: m.Pong) -> None:
        self.peer_compute_ms[peer] = msg.compute_ms  # (finite and bounded: protocol/bounds.py)
        self.peer_busy_ms[peer] = msg.busy_ms
        sent = self.pinged.get(peer, {}).pop(msg.nonce, None)
        if sent is not None:
            rtt = max(0.0, now() - sent)
            rtts = self.round_trips.get(peer)
            if rtts is None:
                self.round_trips[peer] = RoundTrips(rtt)
            else:
                rtts.add(rtt)
        waiting = self.pongs.get(msg.nonce)
        if waiting is not None:
            waiting[1].append(msg)
            waiting[0].set()

    async def exchange(self, peer: str, msg: m.Ping | m.LinkProbe, payload: bytes = b"",
                       wait_s: float = PONG_WAIT_S) -> tuple[float, m.Pong] | None:
        """Send `msg` (with `payload`) and wait for its Pong: (seconds it took, the Pong), or None."""
        ev, box = trio.Event(), []
        self.pongs[msg.nonce] = (ev, box)
        try:
            t0 = now()
            if not await self.wire.send(peer, msg, payload):
                return None
            with trio.move_on_after(wait_s):
                await ev.wait()
                return now() - t0, box[0]
            return None
        finally:
            self.pongs.pop(msg.nonce, None)

    def round_trip_s(self, peer: str) -> float | None:
        """`peer`'s smoothed round trip over the liveness Pings (RFC 6298's srtt), once one was timed."""
        rtts = self.round_trips.get(peer)
        return None if rtts is None else rtts.srtt

    async def measure_rtt(self, peer: str, tries: int = 3) -> float | None:
        """Best of `tries` round trips to `peer`, in ms (None: no answer)."""
        samples = []
        for _ in range(tries):
            got = await self.exchange(peer, m.Ping(self.new_nonce()))
            if got is None:
                break
            samples.append(got[0] * 1000.0)
        return min(samples) if samples else None

    def waits(self, t: float) -> list[dict]:
        """status.json's `waiting_for` here: a relay with no live data node waits for one."""
        since = self.waiting_for_data_since
        return [] if since is None else [wait_entry("data_node", since, t)]

    def status(self) -> LivenessStatus:
        """What the status shows of liveness (snapshots.py): copies, built now."""
        return LivenessStatus(frozenset(self.crashed), frozenset(self.recently_heard()),
                              {p: self.deadline_s(p) for p in self.peers.watched()}, self.waiting_for_data_since,
                              self.lag.snapshot())

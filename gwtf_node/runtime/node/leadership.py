"""Leadership: the election among data nodes and witnesses, and the acting leader's placement of joiners.

Every data node runs the pure `protocol.leader.LeaderMachine` (terms,
pre-votes, leases, the voter set; a leader acts only while a quorum of the
voter set granted its lease).  A relay runs the same machine as a *witness*
(`LeaderConfig.witness`: it votes and acknowledges heartbeats, never stands),
started on the first RequestVote or LeaderHeartbeat of an admitted data node:
with two data nodes the leader takes the admitted relay with the lowest peer
id as the third voter, so the run keeps a leader when either data node dies
(protocol/voters.py "Two data nodes: witnesses", "Voter set").  Every node's
`(term, vote, voter set, longest promise)` is saved in the state directory
(`leader.json`) before any message leaves the node, so a restarted data node
or witness cannot vote twice in a term.  The lease each node asks for is
sized from the round trips measured to the voters (`voters.lease_for_rtts`,
never below `--lease`).  The acting leader publishes `run/<id>/leader` in the
DHT (signed, with its term and its data-node certificate: records.py), opens
the aggregation phase (aggregation.py) and places joiners with its
`MembershipMachine` (section V-B: utilization queries through the stages,
then the local search of `protocol/placement.py` over the link costs the
members and candidates reported).  The search evaluates exact min-cost flows
in pure Python (seconds of CPU for a hundred members), so every call into the
placement machine runs in a worker thread, one at a time and in order
(`_placement_call`): the node's event loop, and with it the election's
heartbeats, never waits for a search.  The status reads `placement_view`, a
copy taken on the event loop after each call.

The leader learns the candidates for the voter set from the peer table: every
admitted data node (its Hello, `on_peer_hello`) and every admitted relay (a
possible witness); a peer that said Goodbye is removed at once, one gone from
the peer table is no longer a candidate, and a voter not heard for
`VOTER_GONE_S` is removed by the leader.  A data node that comes back
(restarted with its state directory, the same peer id) is added back.

A relay takes no part in electing beyond its vote: the leader it knows is
the one a joiner found in the DHT or whose messages it took
(`learned_leader`).  Whenever leadership may have changed, `on_change` is
called: a data node whose iteration is done reports it to whoever leads now.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import trio

from ...protocol import messages as m
from ..trust.authorize import admitted_voters
from ...protocol.leader import LeaderConfig, LeaderMachine
from ...protocol.voters import lease_for_rtts
from ...protocol.membership import MembershipConfig, MembershipMachine
from ..net.peers import PeerInfo, Peers
from .driver import Drivers, Owner
from ..net.wire import Wire, now
from .snapshots import ElectionStatus, LeadershipStatus

log = logging.getLogger("gwtf.node")

LEADER_MSGS = (m.RequestVote, m.Vote, m.LeaderHeartbeat, m.HeartbeatAck)
PLACEMENT_MSGS = (m.JoinRequest, m.UtilizationReport)
QUERY_INTERVAL_S = 2.0  # the acting leader's utilization rounds
PUBLISH_WAIT_S = 10.0


class Leadership:
    def __init__(self, wire: Wire, peers: Peers, host: Any, drivers: Drivers, state_dir: Path, run_id: str,
                 iteration_now: Callable[[], int], on_change: Callable[[], None], certificate: bytes = b"",
                 records: Any = None, lease_s: float = 2.0,
                 round_trip_s: Callable[[str], float | None] = lambda peer: None) -> None:
        self.wire = wire
        self.peers = peers
        self.host = host
        self.election_driver = drivers.make(Owner.LEADER, self.on_election_timer)
        self.placement_driver = drivers.make(Owner.PLACEMENT, self.on_placement_timer)
        self._published_term: int | None = None  # the term whose leader record this node last published
        self.round_trip_s = round_trip_s  # a peer's smoothed round trip over the liveness Pings (liveness.py)
        self.state_path = state_dir / "leader.json"
        self.run_id = run_id
        self.iteration_now = iteration_now
        self.on_change = on_change
        self.election: LeaderMachine | None = None  # data nodes, once the data nodes are known
        self.placement: MembershipMachine | None = None  # the acting leader; touched only by _placement_call
        self.placement_view: tuple[dict, dict] = ({}, {})  # (reports, members) after its last call
        self._placement_queue: list[tuple[MembershipMachine, Callable[[MembershipMachine], list]]] = []
        self._placement_busy = False
        self.known_leader: str | None = None  # a relay: the leader found in the DHT or heard in its queries
        self.known_term: int | None = None  # a relay: that leader's term (its UtilizationQuery says it)
        self.known_at: float | None = None  # a relay: when it last heard who leads (now())
        self._persisted: dict = {}
        self._was_leader = False
        self.led_term = 0  # the last term this node led: its BEGINs carry it (aggregation.py), resends too
        self.certificate = certificate  # this data node's admission: the leader record carries it (records.py)
        self.records = records  # signed DHT records (records.py)
        self.admitted: dict[str, str] = {}  # peer -> the role its Hello was admitted as (kept when it is gone)
        self.lease_floor_s = lease_s  # --lease: the shortest lease (measured round trips may lengthen it)
        self.answer_rtt_s: dict[str, float] = {}  # voter -> round trip of its Votes and HeartbeatAcks (`_answered`)

    # ------------------------------------------------------------------ reading
    @property
    def started(self) -> bool:
        return self.election is not None

    def leader(self) -> str | None:
        if self.peers.role == "data" and self.election is not None:
            return self.election.leader(now())
        return self.known_leader

    def is_leader(self) -> bool:
        return self.peers.role == "data" and self.election is not None and self.election.is_leader(now())

    def leader_of_term(self) -> tuple[str | None, int | None]:
        """(the leader of the newest term this node knows, that term), each None when unknown; a data node
        reads its election machine (not its lease: who won the term, authorize.py), a relay what it learned."""
        if self.peers.role == "data" and self.election is not None:
            return self.election.leader_id, self.election.term
        return self.known_leader, self.known_term

    def term(self) -> int | None:
        return self.election.term if self.peers.role == "data" and self.election is not None else self.known_term

    def voters(self) -> dict:
        """status.json: the voter set this node holds (data nodes, witnesses, its stamp) and the lease it asks."""
        e = self.election
        if e is None:
            return {}
        return {"data_nodes": sorted(e.cur.data), "witnesses": sorted(e.cur.witnesses),
                "stamp": list(e.cur.stamp), "lease_s": round(e.lease_s, 3), "witness": e.cfg.witness}

    # ------------------------------------------------------------------ the election
    def start(self) -> None:
        """A data node that knows every data node starts its election machine."""
        me = self.wire.me
        self._start_machine(LeaderConfig(me, tuple(self.peers.data_nodes()), lease_s=self.lease_floor_s,
                                         **_timings(self.lease_floor_s)))

    def start_witness(self) -> None:
        """A relay asked to vote by an admitted data node runs the election as a witness (never stands)."""
        cfg = LeaderConfig(self.wire.me, tuple(self.peers.data_nodes()), lease_s=self.lease_floor_s, witness=True,
                           **_timings(self.lease_floor_s))
        log.info("taking part in the leader election as a witness")
        self._start_machine(cfg)

    def _start_machine(self, cfg: LeaderConfig) -> None:
        """The election machine of `cfg`, restored from `leader.json` (its term, vote and voter set) if saved."""
        rng = random.Random(f"{cfg.node_id}:leader")
        self.election = LeaderMachine(cfg, rng)
        for p in self.peers.infos():
            if p.role == "relay":
                self.election.add_relay(p.peer_id)
            elif p.role == "data":
                self.election.add_data_node(p.peer_id)
        if self.state_path.exists():
            try:
                restored = LeaderMachine.restore(cfg, rng, json.loads(self.state_path.read_text()))
                restored.known_data |= self.election.known_data
                restored.relays |= self.election.relays
                self.election = restored
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                log.warning("ignoring unreadable %s", self.state_path)
        self._persisted = self.election.persistent_state()
        self._was_leader = False
        self._apply(self.election.start(now()))

    def _apply(self, effects: list) -> None:
        """Persist (term, vote, voter set) before any message leaves, then act on leadership changes."""
        state = self.election.persistent_state()
        if state != self._persisted:
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_path)
            self._persisted = state
        self.election_driver.carry(effects)
        if self.peers.role != "data":
            return  # a witness: it votes, and learns who leads from the leader's messages (authorize.py)
        self._size_lease()
        t = now()
        leading = self.election.is_leader(t)
        if leading and not self._was_leader:
            log.info("leader of term %d", self.election.term)
            self.led_term = self.election.term
            machine = MembershipMachine(
                MembershipConfig(self.wire.me, self.peers.n_stages, query_interval_s=QUERY_INTERVAL_S,
                                 data_nodes=tuple(self.peers.data_nodes())),
                self.election.term, self.iteration_now())
            for p in self.peers.infos():
                if p.role == "relay" and p.stage >= 0 and not p.joining:
                    machine.add_member(p.peer_id, p.stage)
            self.placement = machine
            self._placement_call(lambda pm: pm.start(t))
            if self._published_term != self.election.term:  # (once a term: a lease that lapsed and came back
                self._published_term = self.election.term   # is the same leader, and each put walks the DHT)
                self.wire.spawn(self._publish, self.election.term)
        if not leading and self._was_leader:
            log.info("no longer leader (term %d)", self.election.term)
            self.placement = None
            self.placement_view = ({}, {})
        self._was_leader = leading
        self.on_change()

    def _size_lease(self) -> None:
        """The lease to ask for: from the round trips measured to the voters, at least --lease.  Of a voter's
        measures the longest counts: its link's (peers.py, measured when the link is costed: once, for a peer on
        this machine), the liveness Pings' smoothed round trip, which follows the load (on a machine whose
        cores are all busy, loopback round trips of seconds; a lease sized from the link's milliseconds lapsed
        before the acknowledgements came back, and the leader lost and won its term every few seconds), and its
        answers' to our votes and heartbeats (`_answered`: a voter we hear from all the time is never pinged)."""
        e = self.election
        rtts: dict[str, float] = {}
        for p in e.cur.voters:
            info = self.peers.get(p)
            measured = [x for x in (None if info is None or info.rtt_ms is None else info.rtt_ms / 1000,
                                    self.round_trip_s(p), self.answer_rtt_s.get(p)) if x is not None]
            if measured:
                rtts[p] = max(measured)
        e.set_lease(lease_for_rtts(rtts, e.cur.voters, self.wire.me, self.lease_floor_s, e.cfg.max_lease_s))

    async def _publish(self, term: int) -> None:
        rec = {"peer_id": self.wire.me, "term": term, "name": self.peers.name,
               "certificate": self.certificate.decode()}
        done = False
        try:
            with trio.move_on_after(PUBLISH_WAIT_S):
                await self.records.put(f"run/{self.run_id}/leader", rec)
                done = True
        except Exception as e:  # noqa: BLE001 - discovery is best effort
            log.debug("publishing the leader failed: %s", e)
        if not done and self._published_term == term:
            self._published_term = None  # (published again when this node next wins its lease)

    def learned_leader(self, peer: str, term: int | None = None) -> None:
        """A relay found the acting leader (the DHT record of a joiner's lookup, or a message of the leader's
        that authorize.py took: it names its term); an older term than the one known is ignored, and so is
        another leader of the term known (only the first one heard is that term's: authorize.py refuses the
        other's messages)."""
        if term is not None and self.known_term is not None and term <= self.known_term \
                and not (term == self.known_term and self.known_leader is None):
            if term == self.known_term and peer == self.known_leader:
                self.known_at = now()
            return
        self.known_leader = peer
        self.known_at = now()
        if term is not None:
            self.known_term = term

    # ------------------------------------------------------------------ events
    def on_leader_msg(self, peer: str, msg: Any) -> None:
        if self.election is None:
            if self.peers.role != "relay" or not isinstance(msg, (m.RequestVote, m.LeaderHeartbeat)):
                return  # a data node not started yet: the sender retries
            self.start_witness()
        if isinstance(msg, m.LeaderHeartbeat):
            kept = admitted_voters(msg.data_nodes, self._admitted_data)
            kept_w = admitted_voters(msg.witnesses, self._admitted_relay)
            if len(kept) < len(msg.data_nodes) or len(kept_w) < len(msg.witnesses):
                dropped = (set(msg.data_nodes) - set(kept)) | (set(msg.witnesses) - set(kept_w))
                log.warning("leader %s lists %d voter(s) not admitted here in that role: not merged (%s)",
                            self.peers.who(peer), len(dropped), ", ".join(p[:16] for p in sorted(dropped)))
                msg = replace(msg, data_nodes=kept, witnesses=kept_w)
        if isinstance(msg, (m.HeartbeatAck, m.Vote)) and self.peers.role == "data":
            self._answered(peer, now() - msg.sent_at)
        self._apply(self.election.on_message(now(), peer, msg))

    def _answered(self, peer: str, rtt_s: float) -> None:
        """A voter's answer echoed the `sent_at` of our request `rtt_s` ago: its round trip, which the lease is
        sized from, rises at once and falls by an eighth of the difference per answer.  Two data nodes that talk
        all the time send each other no liveness Ping, so without it the lease stayed at its floor (2 s), which
        a loop held for seconds on a loaded machine could not renew: the leader won and lost its term about 15
        times a minute while the other data node still held it for the leader."""
        if not 0.0 <= rtt_s <= self.election.cfg.max_lease_s:
            return  # (an echo of no request of ours, or older than any lease)
        old = self.answer_rtt_s.get(peer)
        self.answer_rtt_s[peer] = rtt_s if old is None else max(rtt_s, old + (rtt_s - old) / 8)

    def _admitted_data(self, peer: str) -> bool:
        """A peer this node knows as an admitted data node (its Hello passed authorize.py, also if it is gone
        since), or itself."""
        if peer == self.wire.me:
            return True
        info = self.peers.get(peer)
        return (info.role if info is not None else self.admitted.get(peer)) == "data"

    def _admitted_relay(self, peer: str) -> bool:
        """A peer this node knows as an admitted relay, or itself (a witness)."""
        if peer == self.wire.me:
            return self.peers.role == "relay"
        info = self.peers.get(peer)
        return (info.role if info is not None else self.admitted.get(peer)) == "relay"

    def on_placement_msg(self, peer: str, msg: Any) -> None:
        if self.placement is not None and self.is_leader():
            t = now()
            self._placement_call(lambda pm: pm.on_message(t, peer, msg))

    def on_election_timer(self, key: str) -> None:
        if self.election is not None:
            self._apply(self.election.on_timer(now(), key))

    def on_placement_timer(self, key: str) -> None:
        if self.placement is not None:
            t = now()
            self._placement_call(lambda pm: pm.on_timer(t, key))

    def _placement_call(self, call: Callable[[MembershipMachine], list]) -> None:
        """Run `call(machine)` on the current placement machine in a worker thread, after the calls before it;
        its effects are applied on the event loop unless the machine was replaced meanwhile (a new term)."""
        if self.placement is None:
            return
        self._placement_queue.append((self.placement, call))
        if not self._placement_busy:
            self._placement_busy = True
            self.wire.spawn(self._drain_placement)

    async def _drain_placement(self) -> None:
        try:
            while self._placement_queue:
                machine, call = self._placement_queue.pop(0)
                if machine is not self.placement:
                    continue  # a machine of an earlier term: nobody acts on it any more
                before = machine.swarm_placed
                effects = await trio.to_thread.run_sync(call, machine, abandon_on_cancel=True)
                if machine.swarm_placed > before:
                    log.info("placed %d relay(s) as a whole swarm (none serving yet): each stage by the links "
                             "they told", machine.swarm_placed - before)
                if machine is self.placement:
                    self.placement_view = (dict(machine.reports), dict(machine.members))
                    self.placement_driver.carry(effects)
        finally:
            self._placement_busy = False

    def on_peer_hello(self, info: PeerInfo) -> None:
        self.admitted[info.peer_id] = info.role  # a voter that is gone now is still listed until removed
        if self.election is not None:
            if info.role == "data":
                self.election.add_data_node(info.peer_id, now())
            elif info.role == "relay":
                self.election.add_relay(info.peer_id)
        if self.placement is not None and info.role == "relay" and info.stage >= 0 and not info.joining:
            self._placement_call(lambda pm: pm.add_member(info.peer_id, info.stage) or [])

    def on_peer_gone(self, peer: str) -> None:
        if self.election is not None:
            self.election.forget(peer)  # no longer a candidate voter; a voter stays until VOTER_GONE_S
        if self.placement is not None:
            self._placement_call(lambda pm: pm.remove_member(peer) or [])

    def on_goodbye(self, peer: str) -> None:
        """A peer left the run: out of the voter set at once (the leader's next change)."""
        if self.election is not None:
            self.election.voter_left(peer)

    def iteration_aggregating(self, iteration: int) -> None:
        """The acting leader opens the aggregation of `iteration`: joiners are placed for the next one."""
        if self.placement is not None:
            self._placement_call(lambda pm: pm.set_iteration(iteration + 1) or [])

    def status(self) -> LeadershipStatus:
        """What the status shows of the election and the placement (snapshots.py): copies, built now."""
        el, placing = self.election, self.is_leader() and self.placement is not None
        election = None if el is None else ElectionStatus(
            el.role.value, el.id in el.voters, el.cfg.witness, el.voted_for, el.quorum, tuple(sorted(el.voters)),
            el.is_leader(now()), el.lease_end, el.promised_to, el.promise_until)
        reports, members = self.placement_view if placing else ({}, {})
        return LeadershipStatus(self.leader(), self.term(), self.is_leader(), self.voters(), self.known_at, election,
                                placing, {n: (r.flows, r.capacity) for n, r in reports.items()}, frozenset(members))



def _timings(lease_s: float) -> dict:
    """Heartbeat and election timeouts for a lease floor of `lease_s` (the defaults' ratios to 2 s)."""
    return {"heartbeat_s": lease_s / 4, "election_timeout_s": (lease_s * 1.25, lease_s * 2.0),
            "max_lease_s": max(30.0, lease_s)}

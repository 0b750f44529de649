"""What this node is doing: status.json (rewritten every second, less often when slow) and the dashboard's view.

It writes no component, and reads none of their fields: it is handed the
node's tables (the wire, the host, the peers, the bootstrap; `StatusSources`)
and the components, and each round it takes one snapshot of each component,
its `status()` (snapshots.py: frozen, plain data, built on the call), that
all the round's parts share (`Snapshots`).  It is built from three things:
the path of status.json, those sources, and the run's facts (`RunFacts`).
Two documents come out of it:

* `snapshot()`: status.json, the raw figures other tools and the tests read
  (place and standing, peers and their round trips, flows and link costs,
  the iteration and its ledger, the recovery machine's counters, what a relay
  holds, the leader and its term, how long a relay has waited for a data
  node).  Replaced atomically (written beside, then renamed).
* `view()`: what `gwtf-node status` shows and Prometheus exports
  (control.py, metrics.py): this node (its state a `NodeState`, its
  reachability: `_reachability`, also in status.json), the
  election, the stages with their members and utilization, the flows
  through this node with their costs, the iteration and its phase, the loss,
  the microbatches (tally.py), the neighbours' links and the recent events
  (events.py).  It holds no internal sentinel: a data node has no stage
  (`stage: null`, `role: "data"`), a relay not placed yet has `stage: null`,
  and every peer carries a readable `name` (its --name, else the last
  characters of its peer id, `events.short_id`; a node without --name is
  called `events.default_name`, and a forgotten peer keeps its name).

`serve` runs it all in the node's nursery: the control socket (control.py),
the Prometheus exporter when the node has a metrics port (metrics.py, a
thread of its own), and once a second: the event feed's round (`observe`:
the peers table, who leads, the recovery machine's counters, this node's
stage), status.json, and with an exporter the view it reads (`latest_view`:
a new dict each round, so a reader in another thread never sees one
half-built).
"""

from __future__ import annotations

import enum
import json
import os
import resource
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import trio

from ..net import conninfo

from ..ops import control
from .aggregation import Aggregation
from ..net.bootstrap import Bootstrap, BootstrapState
from ..ops.events import EventFeed, EventLog, PeerSeen, short_id
from .flows import DEFAULT_BANDWIDTH_MBPS, Flows
from .leadership import Leadership
from .liveness import Liveness
from .microbatches import Microbatches
from ..net.peers import Peers
from ..net.relay import looks_natted, routable
from .snapshots import (AggregationStatus, FlowsStatus, LeadershipStatus, LivenessStatus, MicrobatchesStatus,
                        StageStatus)
from .stage import LocalStage
from ..net.wire import Wire, now

STATUS_EVERY_S = 1.0
STATUS_LOOP_SHARE = 0.02  # a round takes at most this share of the event loop: a slow one waits longer (`round_wait_s`)


def round_wait_s(took_s: float) -> float:
    """The wait after a round of `loop` that took `took_s` of the event loop: `STATUS_EVERY_S`, or longer when the
    round took more than `STATUS_LOOP_SHARE` of it (a data node of a 50-node swarm on a loaded machine: 40 ms a
    round, a twentieth of its loop, spent writing a status.json nobody read)."""
    return max(STATUS_EVERY_S, took_s / STATUS_LOOP_SHARE)
VIEW_SCHEMA = 1  # the view's layout version (`gwtf-node status --json`, the control socket)
EVENTS_SHOWN = 30


class NodeState(enum.Enum):
    """What the node is doing, as the dashboard says it."""

    CONNECTING = "connecting"  # no peer of the run accepted it yet (dialling its bootstrap peers, or waiting)
    JOINING = "joining"  # waiting for a stage, fetching its stage's state, or forming its flows
    TRAINING = "training"  # microbatches of the iteration in flight
    AGGREGATING = "aggregating"  # the iteration's microbatches are settled: all-reduce and optimizer step
    PAUSED = "paused"  # a data node: a stage has no relay ready, the next iteration waits
    WAITING = "waiting"  # a relay: no data node is alive (waiting for one), so no iteration can run
    LEAVING = "leaving"  # finishing its last iteration and aggregation before Goodbye


def derive_state(*, leaving: bool, connecting: bool, joining: bool, paused: bool, waiting_for_data: bool,
                 aggregating: bool) -> NodeState:
    """What the node is doing now, from what it knows now, the first that holds in this order: a relay whose data
    nodes are all gone is waiting for one (not training, whatever its last iteration was doing)."""
    if leaving:
        return NodeState.LEAVING
    if connecting:
        return NodeState.CONNECTING
    if joining:
        return NodeState.JOINING
    if paused:
        return NodeState.PAUSED
    if waiting_for_data:
        return NodeState.WAITING
    if aggregating:
        return NodeState.AGGREGATING
    return NodeState.TRAINING


@dataclass(frozen=True)
class StatusSources:
    """What the status reads.  The node's tables (`wire`, `host`, `peers`, `bootstrap`) through their own
    accessors; the components through `status()` only, each a snapshot of plain data (snapshots.py); and what
    other parts tell through callables: a relay back with a checkpoint, what it decided and why (resume.py), a
    relay back from a cut at its stage's step, its parameters compared (cutcheck.py), frames refused per
    value-bounds code (values.py), refusals per code, revoked and banned peers, an insecure run (authorize.py),
    and what the node waits for now: what, since when, from whom (waits.py)."""

    wire: Wire
    host: Any
    peers: Peers
    liveness: Liveness
    stage: LocalStage
    flows: Flows
    microbatches: Microbatches
    aggregation: Aggregation
    leadership: Leadership
    bootstrap: Bootstrap | None = None  # how the node reaches the swarm at start
    resume_status: Callable[[], dict | None] = lambda: None
    cut_checks: Callable[[], list] = list
    refused_values: Callable[[], dict[str, int]] = dict
    security: Callable[[], dict] = dict
    waiting_for: Callable[[], list] = list


@dataclass(frozen=True)
class RunFacts:
    """What the node was started with that the status shows: the run, the routing policy, and whether it was
    told the address peers reach it at (--announce)."""

    run_id: str
    policy: str
    announced: bool = False


class Snapshots(NamedTuple):
    """One round's snapshots of the components (snapshots.py), read once and shared by the round's parts."""

    stage: StageStatus
    flows: FlowsStatus
    liveness: LivenessStatus
    aggregation: AggregationStatus
    microbatches: MicrobatchesStatus
    leadership: LeadershipStatus


class Status:
    def __init__(self, path: Path, sources: StatusSources, run: RunFacts) -> None:
        self.path = path
        self.src = sources
        self.wire, self.host, self.peers, self.bootstrap = sources.wire, sources.host, sources.peers, sources.bootstrap
        self.run_id, self.policy, self.announced = run.run_id, run.policy, run.announced
        self.events = EventLog()  # recent events (events.py), fed by `observe`
        self.feed = EventFeed(self.events, self.name_of)
        self.started_at = time.time()
        self.latest_view: dict | None = None  # the view of the last round (metrics.py reads it from its thread)
        self._metrics_file = path.parent / "metrics.jsonl"
        self._record_cache: tuple[int, dict | None] = (-1, None)  # (metrics.jsonl size, its last record)
        self._my_stage = self.peers.stage
        self._reports: dict[str, tuple[int, int]] = {}  # the acting leader: each member's last (flows, capacity)

    def snapshots(self) -> Snapshots:
        """Every component's `status()`, now."""
        s = self.src
        return Snapshots(s.stage.status(), s.flows.status(), s.liveness.status(), s.aggregation.status(),
                         s.microbatches.status(), s.leadership.status())

    # ------------------------------------------------------------------ status.json
    def snapshot(self) -> dict:
        place, sn = self.peers.place, self.snapshots()
        st, fl, lv, agg, mb, ld = sn
        cur = mb.in_flight
        waiting = lv.waiting_for_data_since
        conns = connection_kinds(self.host)
        return {
            "peer_id": self.wire.me, "name": self.peers.name, "role": place.role, "stage": place.stage,
            "run_id": self.run_id, "addrs": self.host.addrs, "refused_frames": self.wire.refused,
            "handler_faults": dict(self.wire.handler_faults),  # message type -> frames whose handling failed here
            "sent": self.wire.sent_totals(),  # lane -> message type -> [frames, bytes] (wire.py)
            "compute_s": round(st.compute_s, 6), "compute_calls": st.compute_calls,
            "leader": ld.leader, "term": ld.term, "voters": ld.voters,
            "steps_applied": st.applied_steps, "joining": place.joining, "leaving": place.leaving,
            "state": self._state(sn).value,
            "peers": {p.peer_id: {"name": p.name, "role": p.role, "stage": p.stage, "rtt_ms": p.rtt_ms,
                                  "connection": conns.get(p.peer_id, "none")} for p in self.peers.infos()},
            "connections": len(conns),  # peers with a libp2p connection, whether this node works with them or not
            "flows": fl.out,
            "flow_machine": fl.machine,  # per data node: its wave here, what a unit waits for (FlowNode.progress)
            "link_costs": fl.link_costs,
            "compute_ms_per_microbatch": round(st.compute_ms, 3),
            "event_loop": lv.event_loop,  # how late the event loop ran (looplag.py)
            # the work measured here (stage.py), the last aggregation's parts, each watched peer's deadline
            "work_s": {k: round(v, 3) for k, v in st.work_s.items()},
            "compute_cpu_s": round(st.compute_cpu_s, 6),  # the torch worker's CPU time: compute, other work
            "work_cpu_s": {k: round(v, 4) for k, v in st.work_cpu_s.items()},
            "aggregation_cpu_s": round(st.aggregation_cpu_s, 4),  # the process's, all threads (aggregation.py)
            "aggregation_parts": {k: round(v, 3) for k, v in agg.parts.items()},
            "last_all_reduce": agg.last_all_reduce,  # its time, tensor work, MB sent
            "dead_after_s": {p: round(d, 1) for p, d in sorted(lv.deadlines_s.items())},
            "links_recosted": fl.links_recosted,
            "reachability": self._reachability(),
            "link_measurements": fl.link_measurements,
            "iteration": cur if cur is not None else agg.last_iteration,
            "ledger": mb.ledger if cur is not None else {},
            "policy": self.policy, "presumed_dead": sorted(lv.presumed_dead),
            # a relay with no live data node: seconds it has waited for one (None: not waiting)
            "waiting_for_data_node_s": None if waiting is None else round(now() - waiting, 1),
            "lost_contributions": {str(k): v for k, v in agg.lost_contributions.items()},
            **mb.counters,  # recovery, holding, computed_off_step, compression, paused (microbatches.py)
            "resume": self.src.resume_status(),
            "waiting_for": self.src.waiting_for(),
            "cut_checks": self.src.cut_checks(),
            "refused_values": self.src.refused_values(),
            "resources": resources(st.device),  # peak memory and CPU seconds of this process
            "pid": os.getpid(), "time": time.time(),
            "bootstrap": self.bootstrap.snapshot() if self.bootstrap is not None else None,
        } | self.src.security()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot(), separators=(",", ":")))  # (indented: the slower Python encoder)
        os.replace(tmp, self.path)

    async def serve(self, leave: Callable[[], dict], metrics_host: str, metrics_port: int | None, *,
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The control socket, the exporter and the rounds of `loop` (the module doc); `started` once the
        socket and the exporter listen."""
        exporter = None
        if metrics_port is not None:
            from ..ops.metrics import MetricsServer

            exporter = MetricsServer(lambda: self.latest_view, metrics_host, metrics_port,
                                     states=[s.value for s in NodeState])
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(control.serve, self.path.parent, self.view, leave)
                task_status.started()
                await self.loop(publish=exporter is not None)
        finally:
            if exporter is not None:
                exporter.close()

    async def loop(self, publish: bool = False) -> None:
        """Once a second (`round_wait_s`): the event feed's round, status.json, and (`publish`: for the exporter)
        the view."""
        while True:
            t0 = time.perf_counter()
            self.observe()
            self.write()
            if publish:
                self.latest_view = self.view()
            await trio.sleep(round_wait_s(time.perf_counter() - t0))

    def observe(self) -> None:
        """Hand the event feed what it compares from round to round (events.py)."""
        t, sn = time.time(), self.snapshots()
        self.feed.peers_seen(t, {p.peer_id: PeerSeen(p.role, p.stage, p.leaving, p.incarnation)
                                 for p in self.peers.infos()}, set(sn.liveness.presumed_dead))
        self.feed.leader_seen(t, sn.leadership.leader, sn.leadership.term)
        self.feed.recovery_counters(t, sn.microbatches.recovery)
        if self.peers.stage is not None and self.peers.role == "relay" and self.peers.stage != self._my_stage:
            self.feed.me_placed(t, self.peers.stage)
        self._my_stage = self.peers.stage

    # ------------------------------------------------------------------ the view
    def name_of(self, peer: str) -> str:
        return name_of(self.peers, peer)

    def state(self) -> NodeState:
        return self._state(self.snapshots())

    def _state(self, sn: Snapshots) -> NodeState:
        place, mb = self.peers.place, sn.microbatches
        return derive_state(
            leaving=place.leaving,
            connecting=self.bootstrap is not None and self.bootstrap.state is not BootstrapState.CONNECTED,
            joining=place.stage is None or place.joining or not mb.started,
            paused=mb.paused is not None,
            waiting_for_data=place.role == "relay" and sn.liveness.waiting_for_data_since is not None,
            # a phase begun and not stepped; or a data node whose microbatches are settled waits for the step
            aggregating=sn.aggregation.aggregating or (mb.in_flight is not None and mb.settled))

    def view(self) -> dict:
        """The dashboard's document (the module doc); JSON-ready."""
        sn = self.snapshots()
        state, mb = self._state(sn), sn.microbatches
        return {
            "schema": VIEW_SCHEMA,
            "time": time.time(),
            "node": self._node(state, sn),
            "election": self._election(sn),
            "stages": self._stages(sn),
            "data_nodes": [{"peer_id": d, "name": self.name_of(d), "me": d == self.wire.me}
                           for d in self.peers.data_nodes()],
            "flows": self._flows(sn.flows),
            "iteration": self._iteration(state, sn),
            "loss": self._loss(mb),
            "microbatches": {**mb.tally, "holding": mb.holding, "recovery": mb.recovery,
                             "lost_contributions": sum(sn.aggregation.lost_contributions.values())},
            "neighbours": self._neighbours(sn),
            "events": [e.to_json() for e in self.events.recent(EVENTS_SHOWN)],
            "event_counts": {k.value: v for k, v in self.events.counts.items()},
            "notes": self._notes(sn),
        }

    def _node(self, state: NodeState, sn: Snapshots) -> dict:
        place = self.peers.place
        return {
            "peer_id": self.wire.me, "short_id": short_id(self.wire.me), "name": self.name_of(self.wire.me),
            "role": place.role, "stage": place.stage if place.role == "relay" else None,
            "capacity": place.capacity, "state": state.value, "run_id": self.run_id, "policy": self.policy,
            "hold_limit": sn.stage.hold_limit if place.role == "relay" else None,  # (0: not built yet)
            "addrs": self.host.addrs, "pid": os.getpid(), "uptime_s": round(time.time() - self.started_at, 1),
            "steps_applied": sn.stage.applied_steps, "compute_s": round(sn.stage.compute_s, 4),
            "refused_frames": self.wire.refused, "is_leader": sn.leadership.is_leader,
            "handler_faults": sum(self.wire.handler_faults.values()),  # frames whose handling failed here (routes.py)
            "leave_after": place.leave_after if place.leaving else None,
            "reachability": self._reachability(),
        }

    def _election(self, sn: Snapshots) -> dict:
        ld, t = sn.leadership, now()
        leader = ld.leader
        heard = set(sn.liveness.recently_heard) | {self.wire.me}
        out: dict[str, Any] = {
            "leader": leader, "leader_name": self.name_of(leader) if leader else None, "term": ld.term,
            "is_leader": ld.is_leader,
            "recent": [e.to_json(self.name_of) for e in self.feed.recent_elections()],
        }
        el = ld.election
        if el is None:  # a relay (or a data node before its election starts): it only hears who leads
            out |= {"role": None, "voter": False, "voted_for": None, "voted_for_name": None,
                    "lease_remaining_s": None, "quorum": None,
                    "leader_heard_s_ago": None if ld.known_at is None else round(t - ld.known_at, 1),
                    "voters": [{"peer_id": d, "name": self.name_of(d), "reachable": d in heard, "me": False}
                               for d in self.peers.data_nodes()]}
            return out
        if el.leads:
            lease = el.lease_end - t
        elif leader is not None and el.promised_to == leader:
            lease = el.promise_until - t  # the follower's promise to the leader it follows
        else:
            lease = None
        out |= {"role": el.role, "voter": el.voter, "witness": el.witness,
                "voted_for": el.voted_for,
                "voted_for_name": self.name_of(el.voted_for) if el.voted_for else None,
                "lease_remaining_s": None if lease is None else round(max(0.0, lease), 2), "quorum": el.quorum,
                "leader_heard_s_ago": None,
                "voters": [{"peer_id": v, "name": self.name_of(v), "reachable": v in heard, "me": v == self.wire.me}
                           for v in el.voters]}
        return out

    def _stages(self, sn: Snapshots) -> list[dict]:
        """Each stage's members as this node knows them; flows and capacity from the leader's utilization
        reports when this node leads (protocol/membership.py), else only this relay's own."""
        ld = sn.leadership
        if not ld.placing:
            self._reports = {}
        else:  # the newest report of each member (a round starts empty: the last round's stand until then)
            self._reports = {n: r for n, r in {**self._reports, **ld.reports}.items() if n in ld.members}
        reports = self._reports
        out = []
        for k in range(self.peers.n_stages):
            members = [p for p in self.peers.infos() if p.role == "relay" and p.stage == k]
            rows = []
            for p in sorted(members, key=lambda p: p.peer_id):
                r = reports.get(p.peer_id)
                rows.append({"peer_id": p.peer_id, "name": self.name_of(p.peer_id),
                             "state": "leaving" if p.leaving else "joining" if p.joining else "serving",
                             "flows": r[0] if r is not None else None,
                             "capacity": r[1] if r is not None else p.capacity, "me": False})
            if self.peers.role == "relay" and self.peers.stage == k:
                place = self.peers.place
                rows.append({"peer_id": self.wire.me, "name": self.name_of(self.wire.me),
                             "state": "leaving" if place.leaving else "joining" if place.joining else "serving",
                             "flows": sn.flows.units_through, "capacity": place.capacity, "me": True})
                rows.sort(key=lambda r: r["peer_id"])
            known = [r for r in rows if r["flows"] is not None and r["state"] == "serving"]
            cap = sum(r["capacity"] for r in known)
            util = round(sum(r["flows"] for r in known) / cap, 3) if cap and (reports or len(known) == len(rows)) \
                else None
            out.append({"stage": k, "members": rows, "utilization": util,
                        "capacity": sum(r["capacity"] for r in rows)})
        return out

    def _flows(self, fl: FlowsStatus) -> list[dict]:
        rows = []
        for direction, table, costs in (("in", fl.units_in, fl.prev_costs), ("out", fl.out, fl.next_costs)):
            for d in sorted(table):
                for hop, units in sorted(table[d].items()):
                    if units:
                        rows.append({"data_node": d, "data_node_name": self.name_of(d), "direction": direction,
                                     "peer": hop, "peer_name": self.name_of(hop), "units": units,
                                     "cost": costs.get(hop)})
        return rows

    def _iteration(self, state: NodeState, sn: Snapshots) -> dict:
        mb, agg = sn.microbatches, sn.aggregation
        cur = mb.in_flight
        number = cur if cur is not None else (
            agg.last_iteration + 1 if agg.last_iteration is not None else sn.stage.applied_steps)
        phase = {NodeState.TRAINING: "microbatches", NodeState.AGGREGATING: "aggregation",
                 NodeState.PAUSED: "paused", NodeState.LEAVING: "leaving"}.get(state)
        return {"number": number if state not in (NodeState.CONNECTING, NodeState.JOINING) else None,
                "phase": phase, "last_completed": agg.last_iteration, "steps_applied": sn.stage.applied_steps,
                "seconds": round(mb.in_flight_s, 2) if cur is not None else None,
                "ledger": mb.ledger if cur is not None else None}

    def _run_record(self) -> dict | None:
        """The leader's last per-iteration record (metrics.jsonl), re-read only when the file grew."""
        try:
            size = self._metrics_file.stat().st_size
        except OSError:
            return None
        if size != self._record_cache[0]:
            with open(self._metrics_file, "rb") as f:
                f.seek(max(0, size - 4096))
                lines = [ln for ln in f.read().splitlines() if ln.strip()]
            try:
                rec = json.loads(lines[-1]) if lines else None
            except ValueError:  # a line being written
                rec = self._record_cache[1]
            self._record_cache = (size, rec)
        return self._record_cache[1]

    def _loss(self, mb: MicrobatchesStatus) -> dict:
        run = self._run_record() if self.peers.role == "data" else None
        last_loss, last_iteration, losses = mb.last_loss, mb.last_loss_iteration, mb.losses
        return {"this_node": last_loss, "this_node_iteration": last_iteration if self.peers.role == "data" else None,
                "run": run.get("loss") if run else None, "run_iteration": run.get("iteration") if run else None,
                "run_record": run, "recent": {str(k): v for k, v in sorted(losses.items())}}

    def _reachability(self) -> dict:
        """Whether peers outside reach this node (dialback.py, relay.py): `public` (a peer dialled it back, or
        the node was told its public address with --announce and no dial-back said otherwise yet: it does not
        reserve relays then), `firewalled` (its public address is not reached: it is reached through relays),
        `behind NAT` (private addresses only), `local` (loopback: a swarm on one machine) or `unknown` (a public
        address of its own interfaces, not checked yet).  `basis` says which: "dial-back", "announced",
        "addresses" (what its addresses are) or None."""
        r = getattr(self.host, "relaying", None)
        addrs = [a for a in self.host.addrs if "/p2p-circuit" not in a]
        basis: str | None = "addresses"
        if r is None or not routable(addrs or self.host.addrs):
            kind, basis = ("local", "addresses") if r is None else ("unknown", None)
        elif r.reachable is not None:
            kind, basis = ("public" if r.reachable else "firewalled"), "dial-back"
        elif looks_natted(addrs):
            kind = "behind NAT"
        else:
            kind, basis = ("public", "announced") if self.announced else ("unknown", None)
        punch = getattr(r, "holepunch", None)  # (holepunch.py: runs on a node that needs a relay)
        checker = r.reachable_by if r is not None else None
        return {"kind": kind, "basis": basis, "checked_by": checker,
                "checked_by_name": self.name_of(checker) if checker else None,
                "relays": sorted(r.reserved) if r is not None else [],
                "relay_names": [self.name_of(p) for p in sorted(r.reserved)] if r is not None else [],
                "hole_punch": punch.snapshot() if punch is not None else None}

    def _neighbours(self, sn: Snapshots) -> list[dict]:
        conns = connection_kinds(self.host)
        fl, heard = sn.flows, set(sn.liveness.recently_heard)
        side_costs = {**{p: ("prev", c) for p, c in fl.prev_costs.items()},
                      **{p: ("next", c) for p, c in fl.next_costs.items()}}
        rows = []
        for pid in sorted(self.peers.watched() | set(side_costs) - {self.wire.me}):
            info = self.peers.get(pid)
            if info is None:
                continue
            shaped = fl.links.get((self.peers.name, info.name)) if info.name else None
            side, cost = side_costs.get(pid, ("peer" if info.role == "relay" and info.stage == self.peers.stage
                                              else None, None))
            sample = fl.samples.get(pid)  # a next-stage link's measurement (linkmeter.py)
            rtt = sample.rtt_ms if sample is not None else info.rtt_ms
            bw = sample.bandwidth_mbps if sample is not None else None
            rows.append({
                "peer_id": pid, "name": self.name_of(pid), "role": info.role,
                "stage": info.stage if info.role == "relay" and info.stage >= 0 else None,
                "side": side, "rtt_ms": None if rtt is None else round(rtt, 2),
                "latency_ms": round(shaped[0], 2) if shaped else (None if rtt is None else round(rtt / 2, 2)),
                "latency_source": "emulated" if shaped else "measured" if rtt is not None else None,
                "bandwidth_mbps": shaped[1] if shaped else round(bw, 1) if bw is not None else DEFAULT_BANDWIDTH_MBPS,
                "bandwidth_source": "emulated" if shaped else "measured" if bw is not None else "assumed",
                "peer_compute_ms": None if sample is None else round(sample.peer_compute_ms, 2),
                "connection": conns.get(pid, "none"), "alive": pid in heard, "link_cost": cost,
            })
        return rows

    def _notes(self, sn: Snapshots) -> list[str]:
        """What the node waits for, one line each: an empty stage, its bootstrap peers, a data node, its state."""
        notes = []
        paused = sn.microbatches.paused
        if paused:
            stages = ", ".join(str(k) for k in paused["empty_stages"])
            notes.append(f"paused for {paused['seconds']} s: stage {stages} has no relay ready; iteration "
                         f"{paused['iteration']} opens when a node with that stage's state joins")
        boot = self.bootstrap.snapshot() if self.bootstrap is not None else {}
        if boot.get("state") not in (None, BootstrapState.CONNECTED.value):
            detail = f", attempt {boot['attempts']}, next in {boot['next_retry_in_s']} s" if boot.get("attempts") \
                else ""
            last = f": {boot['last_error']}" if boot.get("last_error") else ""
            notes.append(f"bootstrap: {boot['state']}{detail}{last}")
        waiting = sn.liveness.waiting_for_data_since
        if waiting is not None:
            notes.append(f"waiting for a data node for {now() - waiting:.0f} s")
        resume = self.src.resume_status()
        if resume and resume.get("decision") == "wait":
            notes.append(f"resume: waiting {resume.get('waiting_s')} s: {resume.get('reason')}")
        return notes


def resources(device: str = "cpu") -> dict:
    """status.json's `resources`: what this process holds and has spent.

    `peak_rss_mb` is the resident set's high-water mark since the process
    started (`getrusage` ru_maxrss, kilobytes on Linux), `rss_mb` the resident
    set now (/proc/self/statm; None where there is none), `cpu_s` the user and
    system CPU seconds of all its threads, and `torch_peak_mb` the most memory
    torch's CUDA allocator has held on a `cuda` device (None on CPU, or before
    CUDA is initialized).
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss = None
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        pass
    torch_peak = None
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_initialized():
        torch_peak = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return {"peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "rss_mb": None if rss is None else round(rss, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "torch_peak_mb": torch_peak}


def name_of(peers: Peers, peer: str) -> str:
    """A peer's readable name: the name its Hello carried (its --name, or `events.default_name`), also after it
    was forgotten (a leader that left is still shown by its name); else the last characters of its peer id
    (`events.short_id`)."""
    if peer == peers.me:
        return peers.name or short_id(peer)
    info = peers.get(peer)
    if info is not None and info.name:
        return info.name
    return peers.former_names.get(peer) or short_id(peer)


def connection_kinds(host: Any) -> dict[str, str]:
    """How this host reaches each connected peer (conninfo.py): "direct" (we dialled it), "inbound" (it dialled
    us: a peer behind NAT), "relayed" (through a circuit relay), "hole-punched" (a direct connection that
    replaced a relayed one: holepunch.py); "+libp2p" when its payloads go over that connection because its
    tensor channel cannot be dialled."""
    libp2p = getattr(host, "libp2p", None)
    if libp2p is None:
        return {}
    out = {}
    for pid in libp2p.get_network().get_connections_map():
        peer = pid.to_base58()
        kind = conninfo.connection_kind(libp2p, peer)
        if kind is not None:
            out[peer] = kind + ("+libp2p" if host.payload_path(peer) == "libp2p" else "")
    return out

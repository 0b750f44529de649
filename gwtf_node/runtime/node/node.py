"""The daemon: one gwtf-node process, the pure machines of `protocol/` driven for real.

Theory of operation
-------------------
A node is a libp2p host (`host.py`: Noise, Yamux, Kademlia) and a set of components, each owning its
state and handed its collaborators (`Parts` names them and their modules).

This module holds what they share: the host and the nursery, `routes` (routes.py: the
one table from message type to the component that handles it) and the machines'
drivers with their timers (driver.py, `Drivers`: keyed by component).  Each
component owns its machines and carries out their effects itself through its
driver; no effect comes back here.  The node wires the components' events to
each other (a peer gone, a peer's Hello, a peer back: a gone peer, or a known
one with a new incarnation, is checked and taken back everywhere as a new join
of the same identity, `_peer_back`; a frame heard; the phase opening an
iteration; a step applied) and runs the node's lifecycle:

1. *Discovery.*  The node locks its state directory (statedir.py), dials its
   bootstrap peers and the peers of its address book (`peers.json` in the
   state directory: a restarted node finds its old peers on any port) until
   one accepts it, or gives up after the bootstrap timeout (bootstrap.py),
   and greets every peer it meets; a peer of another run is refused and told
   why, and a node refused before any peer accepted it stops with that
   reason (`run_node` returns it).  Data nodes start their election once
   they know every data node.  A relay started with `--stage auto`
   asks the elected leader for a stage (`joining.py`) and downloads the
   stage's state from a stage peer.  A relay that holds a checkpoint (its
   state directory's newest, or `--restore FILE`) goes back to that stage
   instead, joining until `resume.py` decides which state it takes.
2. *Flow formation.*  Once membership has been quiet for `settle_s` and the
   node knows a peer on each side, it measures its links and starts its flow
   machine (`flows.py`).  Relays that become ready later are added to the
   running flow machines of their neighbours; peers that crash or leave are
   removed from them.
3. *Training.*  A data node opens iteration 0 (a restarted one: the run's
   step, `data_resume.py`) once its flows are formed and pushes its
   microbatches (`microbatches.py`); after each iteration comes the
   aggregation phase (`aggregation.py`), whose CAN TAKE opens the next one,
   unless a stage has no relay ready for it: then the run pauses until one is.
4. *Metrics.*  The elected leader appends one JSON object per iteration to
   `metrics.jsonl` in its state directory; every node writes `status.json`
   and a checkpoint.

Bad input: every frame is decoded by `codec.decode` (size limit first), its
values checked against their bounds (values.py, `protocol/bounds.py`: counted
per code), its tensor against the stage's shape and dtype.  A refused frame is
logged with its sender and reason and dropped; the node keeps running.
"""

from __future__ import annotations

import inspect
import logging
import secrets
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ...protocol import codec
from ...protocol import messages as m
from ..ops import control, taskdump
from . import data_resume, waits
from .aggregation import Aggregation
from .driver import Drivers
from ..trust.authorize import Authorizer, read_certificate
from ..trust.spread import RevocationSpread
from ..net.bootstrap import DEFAULT_TIMEOUT_S, Bootstrap
from .cutcheck import CutCheck
from ..net.discovery import Discovery
from ..ops.events import default_name
from .faults import Faults
from .flows import Flows
from ..net.host import DHT_NAMESPACE
from .joining import Joining
from .leadership import Leadership
from .liveness import Liveness
from ..net.limits import ConnectionLoss
from .microbatches import Microbatches
from .routes import Admit, Route, handler_fault, routes
from ..net.peers import AddressBook, Arrival, PeerInfo, Peers, Place, readmission_refusal
from .sdnotify import node_ready, node_status, serve_from_env
from ..trust.records import RunRecords, SignedRecordValidator
from .stage import LocalStage
from ..net.addresses import listen_endpoints
from ..ops.startup import NodeExit, check_port_free
from ..ops.statedir import StateDirLock, lock_state_dir
from .status import RunFacts, Status, StatusSources
from ..trust.values import Values
from ..net.wire import FrameRefused, Wire, now

log = logging.getLogger("gwtf.node")

SETTLE_POLL_S = 0.25
GOODBYE_AT_EXIT_S = 2.0  # a data node that finished tells its peers, for this long at most
# ... and then keeps its host open this long: closing the connections right after the last write can reset a
# stream whose frame the peer has not read yet (py-libp2p drops what a reset stream still buffers), and the
# peer would then presume this node dead instead of reading its Goodbye.
GOODBYE_LINGER_S = 0.5


@dataclass
class NodeOptions:
    run_path: Path
    role: str  # "data" | "relay"
    stage: int | None  # None: placed by the leader (--stage auto)
    state_dir: Path
    bootstrap: list[str] = field(default_factory=list)
    name: str = ""
    port: int = 0
    listen_host: str = "127.0.0.1"
    listen: list[str] = field(default_factory=list)  # libp2p endpoints (multiaddr or host:port; none: listen_host:port)
    announce: list[str] = field(default_factory=list)  # the addresses told to peers (none: the listen ones)
    tensor_port: int | None = None  # the tensor channel's port (None: the libp2p port + 1; addresses.py)
    relay_service: bool = False  # serve as a circuit relay for nodes behind NAT (relay.py)
    capacity: int = 0  # 0: a data node's microbatches per iteration; a relay the same unless placed (measured)
    iterations: int = 0  # data nodes: stop after this many (0: run forever)
    data_index: int = 0
    data_nodes: int = 1
    links: Path | None = None  # scenario file shaping the links between named nodes
    flow_neighbours: int | None = None  # next-stage relays a relay links its flows to (0: all; None: auto)
    pooled_formation: bool = False  # several data nodes: form the flows pooled, then home them (pooling.py)
    scaled_formation: bool | None = None  # one data node: form the flows by cost scaling first (None: auto)
    settle_s: float = 1.5
    device: str = "cpu"
    checkpoint_every: int = 1
    policy: str = "gwtf"  # microbatch routing and recovery: "gwtf" or "swarm" (the baseline; protocol/recovery/)
    lend: bool = True  # gwtf, several data nodes: a data node with nothing left to launch lends its units (Lend)
    bootstrap_timeout_s: float = DEFAULT_TIMEOUT_S  # stop if no peer accepted us by then (0: retry forever)
    restore: Path | None = None  # relays: a checkpoint file to resume from, as from the state directory's newest
    keep_checkpoints: int = 3  # checkpoints kept in the state directory
    metrics_port: int | None = None  # Prometheus metrics on this port (status.py, metrics.py; 0: any free port)
    metrics_host: str = "127.0.0.1"
    certificate: Path | None = None  # the owner's admission certificate (None: <state_dir>/certificate.json if any)
    insecure_unsigned: bool = False  # join a run without an owner (open for testing: nobody's admission is checked)
    revocations: Path | None = None  # the owner's signed revocation list (also read from the DHT)
    lease_s: float = 2.0  # the shortest leader lease (leadership.py: measured round trips may lengthen it)


@dataclass
class Parts:
    """The components of a running node (built once the host and the nursery exist), a module each:

    ==============  ===============================================================
    peers.py        who is in the run and where (PeerInfo), this node's own place
    liveness.py     Ping/Pong: round trips, and peers presumed dead after silence
    discovery.py    Hello / PeerList and the DHT records of the run
    bootstrap.py    reaching the swarm at start: retries with backoff, a refused Hello
    flows.py        link costs (Equation 1, LinkCost) and the flow machine (V-C)
    microbatches.py the recovery machine (V-D) with torch; tensors in tensorstore.py
    aggregation.py  the phase (V-E: BEGIN AGGREGATION, CAN TAKE), all-reduce, step,
                    checkpoints, metrics
    leadership.py   the election among data nodes, the leader's placement of joiners
    joining.py      a relay placed by the leader, state hand-over, leave, Goodbye
    resume.py       a relay back with a checkpoint: its own state, a download, or a wait
    data_resume.py  a data node restarted with its state directory: checkpoint, the run's step
    authorize.py    who may send what (each route's `Needs`, asked in `_on_frame`), revocation
    spread.py       the owner's revocation list passed on to every peer (Revocations)
    records.py      the signed DHT records (writer's signature, who may write which key)
    status.py       status.json, the dashboard's view: control.py socket, metrics.py, events.py
    ==============  ===============================================================

    Beside them: `checkpoints.py` (the state directory's checkpoint files), `statedir.py` (the lock on the
    state directory) and `startup.py` (start-up errors: a port in use, why a node stopped by itself).
    """

    wire: Wire
    liveness: Liveness
    discovery: Discovery
    flows: Flows
    microbatches: Microbatches
    leadership: Leadership
    aggregation: Aggregation
    joining: Joining
    cutcheck: CutCheck
    status: Status
    bootstrap: Bootstrap
    spread: RevocationSpread


class Node:
    def __init__(self, opts: NodeOptions) -> None:
        from ...model.manifest import load_manifest, require_signed

        self.opts = opts
        # relays hold no data: only a data node needs the run's data files
        self.manifest = load_manifest(opts.run_path, check_files=opts.role == "data")
        require_signed(self.manifest, insecure_unsigned=opts.insecure_unsigned)
        self.run_id = self.manifest.run_id
        self.authorizer = Authorizer.of_run(self.manifest, revocations=opts.revocations)
        self.certificate = read_certificate(opts.certificate, opts.state_dir)
        self.stage = LocalStage(self.manifest, opts.role, opts.device, opts.data_index, opts.data_nodes)
        self.faults = Faults.from_env(opts.state_dir)
        self.incarnation = secrets.randbits(63) | 1  # this process's (Hello): peers tell a restart by it
        self.book = AddressBook(opts.state_dir / "peers.json", self.run_id)
        self._returning: dict[str, bool] = {}  # peers back whose Hello is being taken (`_peer_hello`): as they were?
        self.resumed = False  # a data node that loaded its checkpoint (data_resume.py)
        self.done_event = trio.Event()
        self.links_cfg: dict[tuple[str, str], tuple[float, float]] = {}
        self.parts: Parts | None = None
        self.values: Values | None = None  # the value checks of every frame (values.py), once assembled
        self.exit: NodeExit | None = None  # why the node stopped by itself before it joined (bootstrap.py)
        self.peers: Peers | None = None
        self.routes: dict[type, Route] = {}
        self.drivers: Drivers | None = None  # the machines' drivers and their timers (driver.py), once assembled
        self.resume_from = self._checkpoint_to_resume()  # a relay coming back to its stage (resume.py)

    def _checkpoint_to_resume(self):
        """A relay's checkpoint to resume from: `--restore FILE` (a bad file raises CheckpointError), else the
        newest of its state directory; only one of its stage (`--stage K`), and never a data node's."""
        from . import checkpoints

        o = self.opts
        if o.role != "relay":
            return None
        ck = (checkpoints.load(o.restore, run_id=self.run_id) if o.restore is not None
              else checkpoints.newest(o.state_dir, run_id=self.run_id))
        if ck is None:
            return None
        if ck.role != "relay" or ck.stage is None or not 0 <= ck.stage < len(self.manifest.stages):
            err = f"{ck.path}: a checkpoint of a data node's part, not of a stage of this run"
            if o.restore is not None:
                raise checkpoints.CheckpointError(err)
            log.warning("ignoring checkpoint: %s", err)
            return None
        if o.stage is not None and o.stage != ck.stage:
            log.info("ignoring checkpoint %s: this node serves stage %d (--stage)", ck.describe(), o.stage)
            return None
        log.info("resuming from checkpoint %s", ck.describe())
        return ck

    # ------------------------------------------------------------------ assembly
    def _max_payload(self) -> int:
        """The largest payload this node takes in one frame: the default, or the largest part's state of this run
        (memory.py `largest_state_bytes`) where that is larger: a bound on the run's frames (a state comes in
        64-MiB chunks, statechunks.py; an all-reduce part is at most a stage's gradient, a third of its state)."""
        from ...model.memory import largest_state_bytes
        from ..net.frames import DEFAULT_MAX_PAYLOAD_BYTES

        return max(DEFAULT_MAX_PAYLOAD_BYTES, largest_state_bytes(self.manifest))

    def _assemble(self, host: Any, nursery: trio.Nursery) -> Parts:
        o = self.opts
        capacity = o.capacity or self.manifest.data.microbatches_per_iteration
        ck = self.resume_from
        # a data node restarted from a checkpoint is not counted in any aggregation until it settled the run's
        # step; a relay back with a checkpoint is not ready before resume.py says
        place = Place(o.role, -1 if o.role == "data" else ck.stage if ck is not None else o.stage, capacity,
                      joining=self.resumed if o.role == "data" else ck is not None)
        peers = Peers(host.peer_id, o.name, len(self.manifest.stages), place)
        self.peers = peers
        wire = Wire(host.peer_id, host, nursery, peers)
        self.drivers = drivers = Drivers(wire)
        self.authorizer.on_revoked = wire.on_ban = self._drop_peer
        records = RunRecords(host, self.run_id, self.manifest.owner_public_key,
                             on_refused=lambda why: wire.count_refusal(m.RefusalCode.BAD_RECORD))
        from .allreduce import AllReducer

        liveness = Liveness(wire, peers, lambda peer: self._peer_gone(peer, presumed=True), self.stage.compute_ms,
                            self.stage.busiest_s, at_work=self._at_work, incarnation=self.incarnation)
        host.libp2p.get_network().register_notifee(ConnectionLoss(liveness.connection_lost, liveness.connection_back))
        discovery = Discovery(wire, peers, host, self.manifest, self.links_cfg, on_peer_hello=self._peer_hello,
                              applied_steps=lambda: self.stage.applied_steps, incarnation=self.incarnation,
                              on_peer_back=self._peer_back, certificate=self.certificate,
                              authorizer=self.authorizer, records=records)
        flows = Flows(wire, peers, liveness, self.stage, drivers, self.links_cfg, on_changed=self._flows_changed,
                      neighbours=self.opts.flow_neighbours if self.opts.policy == "gwtf" else 0,  # (SWARM: all)
                      pooled=self.opts.pooled_formation and self.opts.policy == "gwtf",
                      scaled=self.opts.scaled_formation if self.opts.policy == "gwtf" else False, faults=self.faults)
        microbatches = Microbatches(wire, peers, liveness, flows, self.stage, drivers, self.faults,
                                    policy=o.policy, lend=o.lend, iterations=o.iterations,
                                    on_settled=self._iteration_settled, on_finished=self.done_event.set)
        leadership = Leadership(wire, peers, host, drivers, o.state_dir, self.run_id,
                                iteration_now=microbatches.iteration_now, on_change=self._leadership_changed,
                                certificate=self.certificate, records=records, lease_s=o.lease_s,
                                round_trip_s=liveness.round_trip_s)
        aggregation = Aggregation(wire, peers, self.stage, microbatches.view, microbatches.begin_aggregation,
                                  microbatches.aggregation_done, leadership, AllReducer(host), drivers,
                                  self.faults, state_dir=o.state_dir, checkpoint_every=o.checkpoint_every,
                                  checkpoint_keep=o.keep_checkpoints, on_stepped=self._stepped)
        self.authorizer.begun = lambda: aggregation.phases.begun if aggregation.phases is not None else ()
        joining = Joining(wire, peers, liveness, discovery, self.stage, flows, leadership, aggregation, drivers,
                          host, capacity_flag=o.capacity, data_nodes=o.data_nodes, on_gone=self._peer_gone,
                          on_left=self.stop, records=records)
        self.book.load()
        known = [a for a in self.book.dial_addrs(host.peer_id) if a not in o.bootstrap]
        # the address book alone (a restarted node without --bootstrap) is retried without end: its peers may be
        # down for a while, and others can still dial this node
        bootstrap = Bootstrap(wire, peers, discovery, host, list(o.bootstrap) + known,
                              timeout_s=o.bootstrap_timeout_s if o.bootstrap else 0.0, on_exit=self._exit)
        cutcheck = CutCheck(wire, peers, self.stage, liveness, joining, rounds=lambda: aggregation.rounds)
        aggregation.on_parted = cutcheck.parted
        peers.on_standing = microbatches.standing_changed
        aggregation.on_open, aggregation.on_left_out = microbatches.open_iteration, joining.resync
        self.values = values = Values(wire, peers, self.stage, flows, microbatches, leadership, aggregation)
        status = Status(o.state_dir / "status.json", StatusSources(
            wire, host, peers, liveness, self.stage, flows, microbatches, aggregation, leadership, bootstrap,
            resume_status=lambda: joining.resume_status, cut_checks=lambda: cutcheck.checks,
            refused_values=values.snapshot, security=lambda: self.authorizer.status(wire),
            waiting_for=lambda: waits.waiting_for(peers, aggregation, microbatches, joining, liveness)),
            RunFacts(self.run_id, o.policy, announced=bool(o.announce)))
        parts = Parts(wire, liveness, discovery, flows, microbatches, leadership, aggregation, joining, cutcheck,
                      status, bootstrap, RevocationSpread(self.authorizer, wire, peers))
        self.routes = routes(parts)
        return parts

    # ------------------------------------------------------------------ events between components
    def _peer_back(self, info: PeerInfo, arrival: Arrival) -> bool:
        """A peer that is gone, or a known peer with a new incarnation, says Hello: a new join of the same identity.

        It is checked (`readmission_refusal`; run and role were checked with
        the Hello) and refused with the reason if it does not fit; a restarted
        peer's old incarnation is forgotten everywhere first, as if it had been
        presumed dead (its microbatches, contributions and flows died with it).
        A gone peer whose Hello says it is leaving is not coming back: that
        Hello is a late frame of its leave (sent before its Goodbye, overtaken
        by it), ignored."""
        name = info.name or info.peer_id[:16]
        if arrival is Arrival.BACK and info.leaving:
            log.debug("Hello of %s, which left, saying it leaves: ignored", name)
            return False
        why = readmission_refusal(info, n_stages=self.peers.n_stages)
        if why is not None:
            raise FrameRefused(f"{name} is not taken back: {why}")
        if arrival is Arrival.RESTARTED:
            log.warning("peer %s restarted (a new incarnation): forgetting the old one", name)
            self._peer_gone(info.peer_id)
        elif arrival is Arrival.FORGOT_US:
            log.warning("peer %s had presumed this node dead (or never got its Hello): forgetting it too, both start "
                        "over", name)
            self._peer_gone(info.peer_id, presumed=True)
        # back as it was (a false death on either side): what it held is not lost (regroup.py)
        same = arrival is Arrival.FORGOT_US or (
            arrival is Arrival.BACK and bool(info.incarnation)
            and info.incarnation == self.peers.former_incarnations.get(info.peer_id))
        log.info("peer %s is back (%s stage %d, %d steps, ready from iteration %d): taken back", name, info.role,
                 info.stage, info.steps, info.ready_from)
        self._returning[info.peer_id] = same
        return True

    def _peer_hello(self, info: PeerInfo) -> None:
        p = self.parts
        p.bootstrap.on_peer_hello()
        p.spread.on_peer_hello(info.peer_id)
        self.book.note(info.peer_id, info.addrs)
        if info.peer_id in self._returning:
            same = self._returning.pop(info.peer_id)  # back as it was: what it held did not die (regroup.py)
            p.aggregation.returned(info.peer_id, same_incarnation=same)
            dead_since = p.liveness.peer_back(info.peer_id)
            p.cutcheck.peer_back(info, dead_since)  # (a stage peer at this node's step: the parameters compared)
            p.microbatches.peer_back(info.peer_id, same=same)  # (a data node's contributions held here count if
            # its report names this relay as their holder: protocol/completions.py)
            p.flows.peer_back(info)
        p.aggregation.peer_back(info.peer_id)
        p.joining.catch_up(info)  # a peer far ahead: this node was cut off while the run stepped
        p.leadership.on_peer_hello(info)
        p.flows.on_peer_hello(info)
        p.microbatches.neighbours_changed()  # (a newcomer, a capacity, a peer's standing)
        p.microbatches.recheck_paused()  # a relay ready for the stage the run waits for

    def _peer_gone(self, peer: str, *, presumed: bool = False) -> None:
        """A peer crashed (`presumed` dead) or left: out of routing, flows, aggregation groups and the recovery
        machine."""
        p = self.parts
        self.peers.forget(peer)
        p.discovery.peer_forgotten(peer)  # if it comes back, it is greeted again
        p.spread.peer_forgotten(peer)  # (it may come back restarted, without the list)
        p.flows.on_peer_gone(peer, presumed)  # the flow machines rebuild the flows through it
        p.leadership.on_peer_gone(peer)
        p.aggregation.forget(peer, presumed=presumed)
        p.microbatches.peer_gone(peer)
        p.aggregation.after_gone(peer)

    def _at_work(self) -> set[str]:
        """The peers this node works with now: its flows, its microbatches in flight, its aggregation's groups
        and waits (liveness.py watches them closely)."""
        p = self.parts
        if p is None:
            return set()
        return p.flows.peers_with_units() | p.microbatches.peers_in_flight() | p.aggregation.peers_at_work(now())

    def _drop_peer(self, peer: str) -> None:
        """A banned or revoked peer: gone everywhere, disconnected (its frames are refused from now on)."""
        if self.parts is not None and (peer in self.peers or not self.peers.is_gone(peer)):
            log.warning("dropping peer %s (banned or revoked)", self.peers.who(peer))
            self._peer_gone(peer)
        if self.parts is not None:
            self.parts.wire.spawn(self.parts.wire.disconnect, peer)

    def _flows_changed(self) -> None:
        self.parts.microbatches.flows_changed()

    def _iteration_settled(self, iteration: int) -> None:
        self.parts.aggregation.iteration_settled(iteration)

    def _leadership_changed(self) -> None:
        self.parts.aggregation.leader_changed()

    def _stepped(self, iteration: int) -> None:
        self.parts.joining.on_stepped(iteration)

    # ------------------------------------------------------------------ frames
    async def _on_frame(self, peer: str, envelope: bytes, payload) -> None:
        wire = self.parts.wire
        if wire.closed:  # the node has stopped; its host is closing
            return
        try:
            sender, msg = codec.decode(envelope)
        except codec.DecodeError as e:
            wire.refuse(peer, str(e))
            return
        if sender and sender != peer:  # (left out, the connection's authenticated peer is the sender: codec.py)
            wire.refuse(peer, f"envelope claims sender {sender[:16]}, the authenticated peer is {peer[:16]}")
            return
        if not self.authorizer.screen(peer, wire):  # a banned or revoked peer (counted there)
            return
        if self.values is not None and self.values.refused(peer, msg, payload):  # out of bounds (bounds.py)
            return
        if isinstance(msg, m.Pong) and self.parts.liveness.other_incarnation(peer, msg):
            self.parts.discovery.ask_restarted(peer)  # (not heard: the process this node knows is not this one)
            return
        gone = self.peers.is_gone(peer)
        if not gone:
            self.peers.heard(peer, now())
            self.parts.microbatches.peer_heard(peer)
        route = self.routes.get(type(msg))
        admit = route.admit if route is not None else Admit.KNOWN
        if admit is Admit.KNOWN or (admit is Admit.NOT_GONE and gone):
            if peer not in self.peers:
                if gone or isinstance(msg, m.Goodbye):  # crashed or left: its last frames may still be on their way
                    log.debug("%s from %s, which is gone or unknown: ignored", type(msg).__name__, peer[:16])
                else:
                    wire.refuse(peer, f"{type(msg).__name__} from a peer that has not said Hello",
                                m.RefusalCode.UNKNOWN_PEER)
                    self.parts.discovery.ask_hello(peer)
                return
        if route is not None and not self.authorizer.allow(peer, msg, route.needs, self.peers,
                                                           self.parts.leadership, wire):
            return  # refused and counted there
        try:
            if route is None:
                raise FrameRefused(f"unexpected {type(msg).__name__}")
            res = route.handler(peer, msg, payload) if route.payload else route.handler(peer, msg)
            if inspect.isawaitable(res):
                await res
        except FrameRefused as e:
            wire.refuse(peer, str(e), e.code, ban=e.ban)
        except Exception:  # noqa: BLE001 - a fault of this node: logged, counted, the node runs on (routes.py)
            handler_fault(route.component, msg, self.peers.who(peer), wire.handler_faults)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        from ..net.host import open_host

        self.opts.state_dir.mkdir(parents=True, exist_ok=True)
        if self.opts.links is not None:
            from ..net.linkspec import load_links

            self.links_cfg.update(load_links(self.opts.links))
        ck = self.resume_from
        if ck is not None:
            def build_and_load() -> None:
                self.stage.build(ck.stage)
                self.stage.install(ck.state, ck.steps)

            await trio.to_thread.run_sync(build_and_load)
        elif self.opts.stage is not None or self.opts.role == "data":  # an auto relay builds its part once placed
            await trio.to_thread.run_sync(self.stage.build, self.opts.stage)
        if self.opts.role == "data":
            self.resumed = await trio.to_thread.run_sync(data_resume.load_checkpoint, self.stage, self.opts.state_dir)
        async with open_host(self.opts.state_dir, self.opts.listen_host, self.opts.port, listen=self.opts.listen,
                             announce=self.opts.announce, tensor_port=self.opts.tensor_port,
                             relay_service=self.opts.relay_service, max_payload=self._max_payload()) as host:
            async with trio.open_nursery() as nursery:
                if host.dht is not None:  # holders keep only records their writers may write (records.py)
                    host.dht.register_validator(DHT_NAMESPACE, SignedRecordValidator(
                        self.run_id, self.manifest.owner_public_key))
                self.opts.name = self.opts.name or default_name(self.opts.role, host.peer_id)  # (no --name)
                self.parts = p = self._assemble(host, nursery)
                host.set_handler(self._on_frame)
                (self.opts.state_dir / "addr").write_text("\n".join(host.addrs) + "\n")
                log.info("node %s (%s) peer id %s listening on %s", self.opts.name,
                         self.opts.role, host.peer_id, host.addrs)
                nursery.start_soon(p.bootstrap.run)  # dials the bootstrap peers, with retries
                nursery.start_soon(p.discovery.loop)
                nursery.start_soon(p.discovery.redial_loop, lambda: set(p.liveness.crashed),
                                   lambda pid: self.book.known.get(pid, []))
                nursery.start_soon(self.drivers.timers.loop)
                await nursery.start(p.status.serve, lambda: control.leave(self), self.opts.metrics_host,
                                    self.opts.metrics_port)  # status.json, the control socket, Prometheus
                nursery.start_soon(self._formation)
                nursery.start_soon(p.liveness.loop)
                nursery.start_soon(p.flows.remeasure_loop)
                await self.done_event.wait()
                if self.opts.role == "data" and self.exit is None:  # relays waiting for our aggregation need not wait
                    await p.joining.goodbye_all(max(0, self.stage.applied_steps - 1), GOODBYE_AT_EXIT_S)
                    await trio.sleep(GOODBYE_LINGER_S)
                nursery.cancel_scope.cancel()
            p.wire.closed = True  # the host delivers frames until it closes: they are dropped from now on
            p.status.write()
        if self.exit is None:  # a node that never joined has nothing to checkpoint
            p.aggregation.checkpoint()

    async def _formation(self) -> None:
        """Wait for the swarm to settle, get a stage if placed by the leader, form flows, start training."""
        p, peers, role = self.parts, self.peers, self.opts.role
        ck = self.resume_from
        if ck is not None:
            self.parts.wire.spawn(p.joining.resume, ck.stage, ck.steps, ck.params_sha256)
        while True:
            await trio.sleep(SETTLE_POLL_S)
            quiet = now() - peers.last_change >= self.opts.settle_s
            if not quiet or not peers.ids_known():
                continue
            if role == "data" and not p.leadership.started and len(peers.data_nodes()) >= self.opts.data_nodes:
                p.leadership.start()
                self.parts.wire.spawn(p.aggregation.leader_loop)
            if peers.stage is None:
                if peers.data_nodes():
                    await p.joining.join()  # returns once the leader placed us; the state download goes on
                continue
            if not self.stage.built:
                continue  # a joiner is still building its stage
            if not p.aggregation.has_phases():
                if role == "data" and not (peers.next_stage_ids() and peers.prev_stage_ids()):
                    continue  # the run's step is the relays' and the other data nodes' (their Hellos say it)
                p.aggregation.new_phases()
                if role == "data":
                    if self.resumed:
                        await data_resume.take_run_step(peers, self.stage, p.joining, p.aggregation, p.discovery)
            nxt, prv = peers.next_stage_ids(), peers.prev_stage_ids()
            ready = p.leadership.started if role == "data" else bool(peers.data_nodes())  # (flows.py `form`)
            if nxt and prv and ready and await p.flows.form(nxt, prv, joined=p.joining.joined):
                break
        if role == "data":
            await p.flows.wait_formed()
        first = self.stage.applied_steps  # the run's step: 0, or where a restarted data node resumes
        p.microbatches.start(first)
        if role == "data":
            p.microbatches.open_iteration(first)

    def stop(self) -> None:
        self.done_event.set()

    def _exit(self, why: NodeExit) -> None:
        """Stop by itself before it joined (no bootstrap peer answered, or a peer refused us); `run_node` returns it."""
        self.exit = self.exit or why  # the first reason stands
        self.done_event.set()

    def can_leave_gracefully(self) -> bool:
        return self.parts is not None and self.parts.joining.can_leave_gracefully()

    async def leave(self) -> None:
        await self.parts.joining.leave()


async def run_node(opts: NodeOptions, state_lock: StateDirLock | None = None) -> NodeExit | None:
    """Run a node until it finishes or is stopped; why it stopped by itself before it joined, if it did.

    The state directory is locked first (statedir.py: `StateDirLocked` if
    another node holds it), unless the caller holds its lock already
    (`state_lock`, released here on return); a port in use raises
    `PortInUse` (startup.py).
    """
    with state_lock if state_lock is not None else lock_state_dir(opts.state_dir):
        for ep in listen_endpoints(opts.listen, opts.listen_host, opts.port):  # before the model is built: fail fast
            check_port_free(ep.host, ep.port)  # (open_host checks again)
        return await _run_locked(opts)


async def _run_locked(opts: NodeOptions) -> NodeExit | None:
    node = Node(opts)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                first = True
                async for _ in signals:
                    if first and node.can_leave_gracefully():
                        first = False
                        log.info("signal received: leaving gracefully (signal again to stop at once)")
                        nursery.start_soon(node.leave)
                        continue
                    log.info("signal received: shutting down")
                    node.stop()
                    return

            nursery.start_soon(watch)
            await nursery.start(taskdump.answer_signals)  # kill -USR1: what every task waits on, to the log
            service = serve_from_env(ready=lambda: node_ready(node), status=lambda: node_status(node))
            if service is not None:  # started by systemd (Type=notify): READY, STATUS and watchdog pings
                nursery.start_soon(service)
            await node.run()
            nursery.cancel_scope.cancel()
    return node.exit

"""The daemon: one gwtf-node process, driving the protocol machines for real.

Theory of operation
-------------------
A node is a libp2p host (`host.py`: Noise, Yamux, Kademlia) plus the pure
machines of `protocol/`: the flow machine (`flow.py`) that decides how many
microbatch slots go through which next hop, and the phase bookkeeping
(`pipeline.py`) of BEGIN AGGREGATION / CAN TAKE.  The node turns frames into
machine events and machine effects into frames and timers; torch work runs in
one worker thread (`trio.to_thread`, limiter of 1: a stage's tensors are not
thread-safe) so that the event loop keeps answering while a stage computes.

Lifecycle:

1. *Discovery.*  The node connects to its bootstrap peers, starts the DHT,
   provides the key of its run, and greets every peer it meets with `Hello`
   (run id, role, stage, name, capacity, addresses).  Peers exchange the
   addresses they know (`PeerList`), so a swarm of any shape finds itself from
   one bootstrap address; the DHT's provider records are the second way in.
   A peer of another run is refused.  A `--stage auto` relay waits for the
   swarm to settle and takes the stage with the fewest relays (until the
   leader-driven insertion of the membership issue replaces this).
2. *Flow formation.*  Once membership has been quiet for `settle_s` and the
   node knows a peer on each side, it measures a round trip to each adjacent
   peer (`Ping`/`Pong`), computes the link costs of Equation 1 (latency from
   the round trip, or from `--links`; bandwidth from `--links` or a nominal
   figure; the activation size of the run) and starts its flow machine.
   Frames for the flow machine that arrive before it exists wait in a queue.
   Peers that appear later are not added to the flows of a running machine
   (joining is the membership issue's work) but do take part in aggregation.
3. *Training.*  A data node opens iteration 0 once its flows are formed (its
   demand is placed, or flows stopped changing) and pushes its microbatches:
   embed, `Forward` (tensor follows) to the next hop chosen among its
   outflows; relays run their stage forward, send `Complete` upstream and
   `Forward` on; the data node computes the loss and returns the gradient
   (`Backward`) along the same path in reverse; the embedding backward
   closes the microbatch.  Then the aggregation phase (`pipeline.Phases`).
   Every relay of a stage, and every data node, takes part in the all-reduce
   of its group, whether or not it carried a microbatch, so all copies of a
   stage stay identical.  The update is the gradient sum divided by the number
   of microbatches completed end to end (`BeginAggregation.microbatches`).
4. *Metrics.*  The leader (lowest data-node peer id, until elections exist)
   appends one JSON object per iteration to `metrics.jsonl` in its state
   directory; every node writes `status.json` and a checkpoint.

Bad input: every frame is decoded by `codec.decode` (size limit first) and
every tensor by `model.tensors.unpack` against the shape and dtype the stage
expects, finite values only.  A refused frame is logged with its sender and
reason and dropped; the node keeps running.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..protocol import codec
from ..protocol import messages as m
from ..protocol.cost import link_cost
from ..protocol.effects import CancelTimer, Send, SetTimer
from ..protocol.flow import FlowConfig, FlowNode
from ..protocol.pipeline import (
    LeftOut, Ledger, OpenIteration, Phases, StartStep,
)
from .membership import LEADER_MSGS, MembershipMixin
from .training import MB_MSGS, TIMER_PREFIX, TrainingMixin

log = logging.getLogger("gwtf.node")

DEFAULT_BANDWIDTH_MBPS = 1000.0  # assumed when no --links gives one
FLOW_MSGS = (
    m.CostAnnounce, m.RequestFlow, m.FlowReply, m.Deny, m.Withdraw, m.QueryFlows, m.FlowReport,
    m.RequestChange, m.RequestRedirect, m.MoveReply, m.Reroute, m.LaunchBid, m.Relabel,
    m.RelabelCost,
)


@dataclass
class NodeOptions:
    run_path: Path
    role: str  # "data" | "relay"
    stage: int | None  # None: auto
    state_dir: Path
    bootstrap: list[str] = field(default_factory=list)
    name: str = ""
    port: int = 0
    listen_host: str = "127.0.0.1"
    capacity: int = 0  # 0: relays take the per-iteration demand of one data node
    iterations: int = 0  # data nodes: stop after this many (0: run forever)
    data_index: int = 0
    data_nodes: int = 1
    links: Path | None = None  # scenario file shaping the links between named nodes
    settle_s: float = 1.5
    device: str = "cpu"
    checkpoint_every: int = 1
    policy: str = "gwtf"  # microbatch routing and recovery: "gwtf" or "swarm" (the baseline; recovery.py)
    lend: bool = True  # gwtf, several data nodes: a data node with nothing left to launch lends its units (Lend)


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


MEMBERSHIP_MSGS = LEADER_MSGS + (m.JoinRequest, m.UtilizationQuery, m.UtilizationReport, m.Assignment)


class Node(MembershipMixin, TrainingMixin):
    def __init__(self, opts: NodeOptions) -> None:
        from ..model.manifest import load_manifest, verify_manifest

        self.opts = opts
        # relays hold no data: only a data node needs the run's data files
        self.manifest = load_manifest(opts.run_path, check_files=opts.role == "data")
        verify_manifest(self.manifest)
        self.run_id = self.manifest.run_id
        self.role = opts.role
        self.stage = -1 if opts.role == "data" else opts.stage
        self.n_stages = len(self.manifest.stages)
        self.name = opts.name
        self.mb_per_it = self.manifest.data.microbatches_per_iteration
        self.capacity = opts.capacity or (self.mb_per_it if opts.role == "data" else self.mb_per_it)
        self.peers: dict[str, PeerInfo] = {}
        self.last_peer_change = 0.0
        self.flow: FlowNode | None = None
        self.flow_queue: list[tuple[str, Any]] = []
        self.flow_costs_next: dict[str, float] = {}
        self.flow_costs_prev: dict[str, float] = {}
        # the cost the upstream end of each of our incoming flow links uses (LinkCost): ours, so both ends agree
        self.agreed_costs: dict[str, float] = {}
        self.link_costs_used: dict[str, dict[str, float]] = {"next": {}, "prev": {}}  # the last cost of every link
        self.timers: dict[str, float] = {}
        self.timer_wake = trio.Event()
        self.torch_limiter = trio.CapacityLimiter(1)
        self.pongs: dict[int, trio.Event] = {}
        self.refused = 0
        self.stage_model = None
        self.source = None
        self.targets: dict[int, Any] = {}
        self.losses: dict[int, float] = {}
        self.current: DataIteration | None = None
        self.ledger = Ledger()
        self.phases: Phases | None = None
        self.iter_started = 0.0
        self.done_event = trio.Event()
        self.links_cfg: dict[tuple[str, str], tuple[float, float]] = {}
        self.step_counts: dict[int, int] = {}
        self.hellos_sent: set[str] = set()
        self.status: dict[str, Any] = {}
        self.leader_m = None  # data nodes: the election (protocol/leader.py)
        self.member_m = None  # the acting leader: placement of joiners (protocol/membership.py)
        self.joiner = None  # --stage auto relays until placed
        self.known_leader: str | None = None
        self.joining = False
        self.ready_from = 0
        self.applied_steps = 0  # optimizer steps applied to this node's part
        self.want_after = 0  # a joiner: the fewest steps the state it downloads must have
        self.adding: set[str] = set()  # peers being added to the flow machine
        self.gone: set[str] = set()  # peers that said Goodbye
        self.leaving = False  # leaving gracefully (SIGTERM, `gwtf-node leave`)
        self.leave_after = 0
        self.steps_changed = trio.Event()
        self.state_loaded = trio.Event()
        self.done_sent: dict[int, str] = {}
        self.compute_s = 0.0  # time inside stage forward/backward/embed/head (not the optimizer step)
        self.compute_calls = 0
        self.pipeline_s: dict[int, float] = {}  # leader: iteration -> open to last microbatch done
        self._init_training()

    # ------------------------------------------------------------------ set-up
    def _load_model(self) -> None:
        from ..model.data import MicrobatchSource
        from ..model.stages import build_stage

        self.stage_model = build_stage(self.manifest, self.role, None if self.role == "data" else self.stage,
                                       device=self.opts.device)
        if self.role == "data":
            self.source = MicrobatchSource.for_manifest(self.manifest, self.opts.data_index, self.opts.data_nodes)

    def _load_links(self) -> None:
        if self.opts.links is None:
            return
        from .linkspec import load_links

        self.links_cfg = load_links(self.opts.links)

    # ------------------------------------------------------------------ main
    async def run(self) -> None:
        from .host import open_host

        self.opts.state_dir.mkdir(parents=True, exist_ok=True)
        self._load_links()
        if self.stage is not None:  # an auto relay builds its part once it picked a stage
            await trio.to_thread.run_sync(self._load_model)
        from .allreduce import AllReducer

        async with open_host(self.opts.state_dir, self.opts.listen_host, self.opts.port,
                             bootstrap=self.opts.bootstrap) as host:
            self.host = host
            self.me = host.peer_id
            self.allreducer = AllReducer(host)
            host.set_handler(self._on_frame)
            (self.opts.state_dir / "addr").write_text("\n".join(host.addrs) + "\n")
            log.info("node %s (%s) peer id %s listening on %s", self.name, self.role, self.me, host.addrs)
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                for addr in self.opts.bootstrap:
                    nursery.start_soon(self._dial, addr)
                nursery.start_soon(self._discovery_loop)
                nursery.start_soon(self._timer_loop)
                nursery.start_soon(self._status_loop)
                nursery.start_soon(self._formation)
                nursery.start_soon(self._liveness_loop)
                await self.done_event.wait()
                if self.role == "data":  # relays waiting for an aggregation of ours need not wait
                    with trio.move_on_after(2):
                        async with trio.open_nursery() as n:
                            for pid in list(self.peers):
                                n.start_soon(self._send, pid, m.Goodbye(max(0, self.applied_steps - 1)))
                nursery.cancel_scope.cancel()
            self._write_status()
        self._checkpoint(final=True)

    def stop(self) -> None:
        self.done_event.set()

    # ------------------------------------------------------------------ peers
    def _hello(self) -> m.Hello:
        return m.Hello(self.run_id, self.role, -2 if self.stage is None else self.stage, self.name, self.capacity,
                       tuple(self.host.addrs), self.host.tensor_addr, self.joining, self.ready_from,
                       self.leaving, self.leave_after)

    async def _dial(self, addr: str) -> None:
        try:
            pid = await self.host.connect(addr)
        except Exception as e:  # noqa: BLE001 - any dial failure is logged, discovery retries
            log.warning("could not reach %s: %s", addr, e)
            return
        if pid != self.me:
            await self._send(pid, self._hello())
            self.hellos_sent.add(pid)

    async def _discovery_loop(self) -> None:
        """Publish our DHT records and look for peers of the run there (beside Hello/PeerList).

        Records (versioned, the highest version wins everywhere; see host.py):
        `run/<run id>` holds the manifest (put by data nodes), `node/<peer id>`
        holds {name, role, stage, addrs} (put by every node, again when its
        stage changes); provider records on `run/<run id>` and on
        `run/<run id>/stage/<k>` (relays) are how a newcomer finds the swarm
        and the members of a stage.  The DHT is discovery only: who is alive is
        decided by our own messages.
        """
        run_key = f"run/{self.run_id}"
        published: tuple | None = None
        while True:
            if self.peers:
                me = (self.role, self.stage, tuple(self.host.addrs))
                if published != me:
                    try:
                        with trio.move_on_after(10):
                            if self.role == "data":
                                await self.host.dht_put(run_key, self.manifest.to_json().encode())
                            rec = {"name": self.name, "role": self.role, "stage": self.stage,
                                   "addrs": self.host.addrs, "run_id": self.run_id}
                            await self.host.dht_put(f"node/{self.me}", json.dumps(rec).encode())
                            await self.host.provide(run_key)
                            if self.role == "relay" and self.stage is not None:
                                await self.host.provide(f"{run_key}/stage/{self.stage}")
                            published = me
                    except Exception as e:  # noqa: BLE001 - the DHT is best effort; retried next round
                        log.debug("DHT publish failed: %s", e)
                try:
                    with trio.move_on_after(10):
                        for pid, addrs in await self.host.find_providers(run_key):
                            if pid != self.me and pid not in self.peers and pid not in self.gone and addrs:
                                addr = addrs[0] if "/p2p/" in addrs[0] else f"{addrs[0]}/p2p/{pid}"
                                self.nursery.start_soon(self._dial, addr)
                except Exception as e:  # noqa: BLE001
                    log.debug("find_providers failed: %s", e)
            await trio.sleep(2.0)

    def _on_hello(self, sender: str, msg: m.Hello) -> None:
        if msg.run_id != self.run_id:
            self._refuse(sender, f"Hello for run {msg.run_id!r}, this node trains run {self.run_id!r}")
            return
        if msg.role not in ("data", "relay") or (msg.role == "relay" and not -2 <= msg.stage < self.n_stages):
            self._refuse(sender, f"Hello with role {msg.role!r} stage {msg.stage}")
            return
        self.gone.discard(sender)  # back (a restart keeps its peer id)
        if self.phases is not None:
            self.phases.gone.discard(sender)
        old = self.peers.get(sender)
        info = PeerInfo(sender, msg.role, msg.stage, msg.name, msg.capacity, tuple(msg.addrs),
                        old.rtt_ms if old else None, msg.joining, msg.ready_from, msg.leaving, msg.leave_after)
        changed = old is None or (old.role, old.stage) != (info.role, info.stage)
        self.peers[sender] = info
        if msg.role == "data" and self.leader_m is not None and sender not in self.leader_m.cfg.data_nodes:
            self.leader_m.add_data_node(sender)
        if self.member_m is not None and msg.role == "relay" and msg.stage >= 0 and not msg.joining:
            self.member_m.add_member(sender, msg.stage)
        if self.flow is not None and msg.role == "relay" and not msg.joining and not msg.leaving:
            side = self._flow_side(sender, msg.stage)
            if side is not None and not self._in_flow(sender):
                self.nursery.start_soon(self._add_flow_neighbour, sender, side)
        reply: list[m.Message] = []
        if sender not in self.hellos_sent:
            self.hellos_sent.add(sender)
            reply.append(self._hello())
        if changed:
            shaped = self.links_cfg.get((self.name, msg.name))
            if shaped is not None:
                self.host.links.set_link(sender, *shaped)  # emulate the link: our sends to this peer
            self.last_peer_change = trio.current_time()
            log.info("peer %s: %s stage %s (%s)", msg.name or sender[:12], msg.role, msg.stage, sender)
            known = tuple(a for p in self.peers.values() for a in p.addrs[:1] if p.peer_id != sender)
            reply.append(m.PeerList(tuple(self.host.addrs[:1]) + known))
        if reply:
            self.nursery.start_soon(self._send_all, sender, reply)

    def _on_peer_list(self, sender: str, msg: m.PeerList) -> None:
        for addr in msg.addrs[:256]:
            pid = addr.rsplit("/p2p/", 1)[-1]
            if pid and pid != self.me and pid not in self.peers:
                self.nursery.start_soon(self._dial, addr)

    def _ids(self, role: str, stage: int | None = None) -> list[str]:
        return sorted(p.peer_id for p in self.peers.values()
                      if p.role == role and (stage is None or p.stage == stage))

    def data_nodes(self) -> list[str]:
        return sorted(self._ids("data") + ([self.me] if self.role == "data" else []))

    def next_stage_ids(self) -> list[str]:
        if self.role == "data":
            return self._ids("relay", 0)
        if self.stage == self.n_stages - 1:
            return self.data_nodes()
        return self._ids("relay", self.stage + 1)

    def prev_stage_ids(self) -> list[str]:
        if self.role == "data":
            return self._ids("relay", self.n_stages - 1)
        if self.stage == 0:
            return self.data_nodes()
        return self._ids("relay", self.stage - 1)

    def stage_group(self) -> list[str]:
        if self.role == "data":
            return self.data_nodes()
        return sorted(self._ids("relay", self.stage) + [self.me])

    # ------------------------------------------------------------------ frames
    async def _send(self, peer: str, msg: m.Message, payload: bytes | memoryview = b"") -> bool:
        if peer in self.gone and not isinstance(msg, (m.Hello, m.Goodbye)):
            log.debug("%s to %s, which is gone: not sent", type(msg).__name__, peer[:16])
            return False
        try:
            await self.host.send(peer, codec.encode(self.me, msg), payload)
            return True
        except Exception as e:  # noqa: BLE001 - a dead or unreachable peer: logged, protocol deals with it
            log.warning("send %s to %s failed: %s", type(msg).__name__, self._who(peer), e)
            return False

    async def _send_all(self, peer: str, msgs: list) -> None:
        for msg in msgs:  # in order: a Hello before what depends on it
            await self._send(peer, msg)

    def _who(self, peer: str) -> str:
        p = self.peers.get(peer)
        return p.name if p and p.name else peer[:16]

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        log.warning("refused frame from %s: %s", self._who(peer), why)

    async def _on_frame(self, peer: str, envelope: bytes, payload) -> None:
        try:
            sender, msg = codec.decode(envelope)
        except codec.DecodeError as e:
            self._refuse(peer, str(e))
            return
        if sender != peer:
            self._refuse(peer, f"envelope claims sender {sender[:16]}, the authenticated peer is {peer[:16]}")
            return
        if peer not in self.gone:
            self._heard(peer)
        if isinstance(msg, m.Hello):
            self._on_hello(peer, msg)
            return
        if isinstance(msg, m.PeerList):  # addresses only: harmless from anyone, and may overtake a Hello
            self._on_peer_list(peer, msg)
            return
        if isinstance(msg, m.Ping):
            await self._send(peer, m.Pong(msg.nonce))
            return
        if isinstance(msg, m.Pong):
            ev = self.pongs.get(msg.nonce)
            if ev is not None:
                ev.set()
            return
        if isinstance(msg, m.LinkCost) and peer not in self.gone:  # may overtake the sender's Hello: kept
            try:
                self._on_link_cost(peer, msg)
            except FrameRefused as e:
                self._refuse(peer, str(e))
            return
        if peer not in self.peers:
            if peer in self.gone:  # said Goodbye: its last frames may still be on their way
                log.debug("%s from %s, which left: ignored", type(msg).__name__, peer[:16])
                return
            self._refuse(peer, f"{type(msg).__name__} from a peer that has not said Hello")
            return
        try:
            await self._dispatch(peer, msg, payload)
        except FrameRefused as e:
            self._refuse(peer, str(e))

    async def _dispatch(self, peer: str, msg: Any, payload) -> None:
        if isinstance(msg, FLOW_MSGS):
            if self.flow is None:
                self.flow_queue.append((peer, msg))
            else:  # the machine keeps what a newcomer says until it is told to add it (add_neighbour)
                self._apply(self.flow.on_message(trio.current_time(), peer, msg))
                if self.rec is not None and self.role == "data":
                    self._sync_rec()  # flows that changed reach the microbatch machine
        elif isinstance(msg, MB_MSGS):
            await self._on_mb_msg(peer, msg, payload)
        elif isinstance(msg, m.AllReduceChunk):
            await self.allreducer.on_chunk(peer, msg, payload)
        elif isinstance(msg, m.IterationDone):
            if self.role != "data":
                raise FrameRefused("IterationDone sent to a relay")
            self._on_iteration_done(peer, msg)
        elif isinstance(msg, m.BeginAggregation):
            if self.phases is None:
                raise FrameRefused("BeginAggregation before this node has a stage")
            if self.rec is not None and self.role == "relay" and msg.iteration not in self.phases.begun:
                eff, contrib = self.rec.begin_aggregation(trio.current_time(), msg.iteration)
                self.contrib_for[msg.iteration] = contrib
                self._apply_rec(eff)
            self._apply_phase(self.phases.on_begin(msg, self.next_stage_ids()))
        elif isinstance(msg, m.CanTake):
            if self.phases is None:
                raise FrameRefused("CanTake before this node has a stage")
            self._apply_phase(self.phases.on_can_take(peer, msg, self.next_stage_ids(), self.prev_stage_ids()))
        elif isinstance(msg, MEMBERSHIP_MSGS):
            self._on_membership_msg(peer, msg)
        elif isinstance(msg, m.Goodbye):
            self._on_goodbye(peer, msg)
        elif isinstance(msg, m.StageStateRequest):
            # answered in its own task: it may wait for a step, and this peer's other frames (Pings) must not
            self.nursery.start_soon(self._serve_state_request, peer, msg)
        elif isinstance(msg, m.StageState):
            await self._on_state(peer, msg, payload)
        else:
            raise FrameRefused(f"unexpected {type(msg).__name__}")

    # ------------------------------------------------------------------ flow machine
    def _apply(self, effects) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.nursery.start_soon(self._send, e.to, e.msg)
            elif isinstance(e, SetTimer):
                self.timers[e.key] = e.deadline
                self.timer_wake.set()
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.key, None)

    async def _timer_loop(self) -> None:
        while True:
            self.timer_wake = trio.Event()
            if self.timers:
                key = min(self.timers, key=self.timers.get)
                deadline = self.timers[key]
                with trio.move_on_at(deadline):
                    await self.timer_wake.wait()
                    continue
                if self.timers.get(key) == deadline:
                    del self.timers[key]
                    self._fire(key)
            else:
                await self.timer_wake.wait()

    def _fire(self, key: str) -> None:
        """A timer is due: hand it to the machine that set it (keys are namespaced by machine)."""
        now = trio.current_time()
        if key.startswith(TIMER_PREFIX):
            self._fire_rec(key)
        elif key.startswith("leader."):
            if self.leader_m is not None:
                self._apply_leader(self.leader_m.on_timer(now, key))
        elif key.startswith("membership."):
            if key == "membership.join_retry":
                if self.joiner is not None:
                    self._apply(self.joiner.on_timer(now, key))
            elif self.member_m is not None:
                self._apply(self.member_m.on_timer(now, key))
        elif self.flow is not None:
            self._apply(self.flow.on_timer(now, key))

    async def _measure_rtt(self, peer: str) -> float | None:
        samples = []
        for _ in range(3):
            nonce = random.getrandbits(63)
            ev = trio.Event()
            self.pongs[nonce] = ev
            t0 = trio.current_time()
            if not await self._send(peer, m.Ping(nonce)):
                break
            with trio.move_on_after(5):
                await ev.wait()
                samples.append((trio.current_time() - t0) * 1000.0)
            self.pongs.pop(nonce, None)
        return min(samples) if samples else None

    def _link_cost(self, peer: str) -> float:
        info = self.peers[peer]
        lat = (info.rtt_ms or 1.0) / 2.0
        bw = DEFAULT_BANDWIDTH_MBPS
        shaped = self.links_cfg.get((self.name, info.name))
        if shaped is not None:
            lat, bw = shaped
        shape = self.stage_model.expected_hidden_shape(self.manifest.data.microbatch_size)
        size_mb = math.prod(shape) * 4 / 1e6
        return round(link_cost(0.0, 0.0, lat, lat, bw, bw, size_mb), 3)

    async def _formation(self) -> None:
        """Wait for the swarm to settle, pick a stage if auto, measure links, start the flow machine."""
        while True:
            await trio.sleep(0.25)
            quiet = trio.current_time() - self.last_peer_change >= self.opts.settle_s
            if not quiet or not self.peers:
                continue
            if self.role == "data" and self.leader_m is None and len(self.data_nodes()) >= self.opts.data_nodes:
                self._start_leader_machine()
                self.nursery.start_soon(self._leader_loop)
            if self.stage is None:
                if self.data_nodes():
                    await self._join()  # returns once the leader placed us; the state download goes on
                continue
            if self.stage_model is None:
                continue  # a joiner is still building its stage
            if self.phases is None:
                self.phases = self._new_phases()
            nxt, prv = self.next_stage_ids(), self.prev_stage_ids()
            if nxt and prv and (self.role != "data" or self.leader_m is not None):
                break
        for pid in sorted(set(nxt) | set(prv)):
            rtt = await self._measure_rtt(pid)
            if pid in self.peers:  # (it may have died meanwhile)
                self.peers[pid].rtt_ms = rtt
        nxt = [p for p in nxt if p in self.peers or p == self.me]
        prv = [p for p in prv if p in self.peers or p == self.me]
        self.flow_costs_next = {p: self._link_cost(p) for p in nxt}
        self.flow_costs_prev = {p: self.agreed_costs.get(p, self._link_cost(p)) for p in prv}
        for p, c in sorted(self.flow_costs_next.items()):
            self.nursery.start_soon(self._send, p, m.LinkCost(c))
        commodities = tuple(self.data_nodes())
        cfg = FlowConfig(self.me, self.role == "data", self.capacity, commodities, self.flow_costs_next,
                         self.flow_costs_prev, tuple(self._ids("relay", self.stage)) if self.role == "relay" else (),
                         joined=self.joiner is not None)  # placed by the leader: flows may already exist
        seed = int.from_bytes(self.me.encode()[-8:], "big")
        self.flow = FlowNode(cfg, random.Random(seed))
        log.info("flow machine started: next %s prev %s", self._names(self.flow_costs_next),
                 self._names(self.flow_costs_prev))
        self._apply(self.flow.start(trio.current_time()))
        self._sync_costs()
        queued, self.flow_queue = self.flow_queue, []
        for peer, msg in queued:
            if any(msg_commodity_unknown(msg, commodities)):
                continue
            self._apply(self.flow.on_message(trio.current_time(), peer, msg))
        if self.role == "data":
            await self._wait_flows()
        self._start_recovery()
        if self.role == "data":
            self._open_iteration(0)

    def _flow_side(self, peer: str, stage: int) -> str | None:
        """Where a relay of `stage` sits for this node's flow machine: "next", "prev", "peer" or nowhere."""
        last = self.n_stages - 1
        if self.role == "data":
            return "next" if stage == 0 else "prev" if stage == last else None
        if stage == self.stage:
            return "peer"
        return "next" if stage == self.stage + 1 else "prev" if stage == self.stage - 1 else None

    def _in_flow(self, peer: str) -> bool:
        cfg = self.flow.cfg
        return peer in cfg.next_costs or peer in cfg.prev_costs or peer in cfg.peers

    async def _add_flow_neighbour(self, peer: str, side: str) -> None:
        """A relay became ready next to us (a newcomer): measure the link and add it to our flow machine."""
        if peer in self.adding:
            return
        self.adding.add(peer)
        try:
            if side != "peer":
                rtt = await self._measure_rtt(peer)
                if peer in self.peers:
                    self.peers[peer].rtt_ms = rtt
            if peer not in self.peers or self._in_flow(peer):
                return
            cost = self._link_cost(peer) if side != "peer" else 0.0
            if side == "next":
                self.nursery.start_soon(self._send, peer, m.LinkCost(cost))
            elif side == "prev":
                cost = self.agreed_costs.get(peer, cost)
            log.info("flows: adding %s as %s neighbour (cost %g)", self._who(peer), side, cost)
            self._apply(self.flow.add_neighbour(trio.current_time(), peer, cost, side))
            self._sync_costs()
        finally:
            self.adding.discard(peer)

    def _on_link_cost(self, peer: str, msg: m.LinkCost) -> None:
        """The upstream end of our link says which cost it uses: ours from now on (`LinkCost`)."""
        if not math.isfinite(msg.cost) or msg.cost < 0:
            raise FrameRefused(f"LinkCost {msg.cost!r}: a link cost is finite and >= 0")
        info = self.peers.get(peer)
        if info is not None and self.stage is not None and self._flow_side(peer, info.stage) != "prev":
            raise FrameRefused(f"LinkCost from {self._who(peer)}, which is not upstream of this node")
        self.agreed_costs[peer] = msg.cost
        if self.flow is not None and peer in self.flow.cfg.prev_costs and self.flow.cfg.prev_costs[peer] != msg.cost:
            log.debug("flows: link from %s costs %g (its measurement; mine was %g)", self._who(peer), msg.cost,
                      self.flow.cfg.prev_costs[peer])
            self._apply(self.flow.set_cost(trio.current_time(), peer, msg.cost))
            self._sync_costs()
            if self.rec is not None and self.role == "data":
                self._sync_rec()

    def _sync_costs(self) -> None:
        self.flow_costs_next = dict(self.flow.cfg.next_costs)
        self.flow_costs_prev = dict(self.flow.cfg.prev_costs)
        self.link_costs_used["next"].update(self.flow_costs_next)  # (status.json: peers that left stay in it)
        self.link_costs_used["prev"].update(self.flow_costs_prev)

    def _new_phases(self) -> Phases:
        return Phases(self.me, self.stage, self.n_stages - 1)

    def _names(self, costs: dict[str, float]) -> str:
        return ", ".join(f"{self._who(p)}={c:g}" for p, c in sorted(costs.items()))

    async def _wait_flows(self) -> None:
        """A data node starts pushing once its demand is placed, or its flows stopped changing."""
        start = trio.current_time()
        while True:
            placed = sum(self.flow.out[self.me].values())
            quiet = trio.current_time() - self.flow.stats.last_change
            if placed >= self.capacity or (placed > 0 and quiet > 3.0) or trio.current_time() - start > 60:
                log.info("flows formed: %d of %d units placed after %.1f s: %s", placed, self.capacity,
                         trio.current_time() - start, self._names(dict(self.flow.out[self.me])))
                return
            await trio.sleep(0.1)

    # ------------------------------------------------------------------ training (microbatches: training.py)
    async def _compute(self, fn, *args):
        """Run a stage computation in the torch worker thread; its own time counts as compute."""
        def timed():
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.compute_s += time.perf_counter() - t0
                self.compute_calls += 1

        return await trio.to_thread.run_sync(timed, limiter=self.torch_limiter)

    async def _send_tensor(self, peer: str, msg: Any, tensor) -> bool:
        from dataclasses import replace

        from ..model.tensors import pack

        header, payload = pack(tensor)
        return await self._send(peer, replace(msg, tensor=header), payload)

    def _unpack(self, msg: Any, payload, what: str):
        from ..model.tensors import TensorError, unpack

        if msg.tensor is None:
            raise FrameRefused(f"{what} without a tensor header")
        try:
            return unpack(msg.tensor, payload, expect_shape=self.stage_model.expected_hidden_shape(
                self.manifest.data.microbatch_size), expect_dtype=self.stage_model.dtype)
        except TensorError as e:
            raise FrameRefused(f"{what} tensor refused: {e}") from None

    # ------------------------------------------------------------------ aggregation
    def _apply_phase(self, effects) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.nursery.start_soon(self._send, e.to, e.msg)
            elif isinstance(e, StartStep):
                self.nursery.start_soon(self._step, e)
            elif isinstance(e, LeftOut):
                self.nursery.start_soon(self._resync, e.iteration)
            elif isinstance(e, OpenIteration):
                self._open_iteration(e.iteration)

    async def _step(self, e: StartStep) -> None:
        t0 = trio.current_time()
        keys: list = []  # relay: the contributions the recovery machine names (backward computed here, attempt
        if self.role == "relay":  # not released), as (data node, seq, iteration)
            keys = sorted(self.contrib_for.pop(e.iteration, frozenset()))
            log.info("iteration %d: aggregating %d contributions held here", e.iteration, len(keys))
        self._maybe_fault("aggregate")
        if keys:
            self._maybe_fault("aggregate_holding")
        if self.role == "data":
            mine = len(self.current.done) if self.current is not None and self.current.iteration == e.iteration else 0
        else:

            def commit() -> int:
                return sum(1 for k in keys if self.stage_model.commit(k))

            mine = await trio.to_thread.run_sync(commit, limiter=self.torch_limiter)
        grad = await trio.to_thread.run_sync(self.stage_model.grad_vector, limiter=self.torch_limiter)
        named = self.phases.group(e.iteration, self.stage)
        group = sorted(named) if named is not None else self.stage_group()
        total, count = await self._all_reduce_survivors(f"s{self.stage}/it{e.iteration}", group, grad, float(mine))
        if self.role == "relay" and count < e.microbatches:
            # the rule (recovery.py): the survivors' mean; the missing contributions died with a relay
            self.lost_contributions[e.iteration] = int(e.microbatches - count)
            log.warning("iteration %d: stage %d holds %d of %d contributions (the rest died with a relay)",
                        e.iteration, self.stage, int(count), e.microbatches)
        await trio.to_thread.run_sync(self._apply_step, total, count, e.iteration,
                                      limiter=self.torch_limiter)
        if self.rec is not None:
            self._apply_rec(self.rec.aggregation_done(trio.current_time(), e.iteration))
        self.steps_changed.set()
        self.steps_changed = trio.Event()
        if self.joiner is not None:
            self.joiner.on_iteration(e.iteration + 1)
        self.step_counts[e.iteration] = e.microbatches
        if self.opts.checkpoint_every and (e.iteration + 1) % self.opts.checkpoint_every == 0:
            await trio.to_thread.run_sync(self._checkpoint, limiter=self.torch_limiter)
        if self.role == "data" and self.leader() == self.me:  # the leader that opened this aggregation
            self._record_metrics(e.iteration, trio.current_time() - t0)
        self.last_iteration = e.iteration
        self._apply_phase(self.phases.on_step_done(e.iteration, self.next_stage_ids(), self.prev_stage_ids()))

    def _apply_step(self, total, count: int, iteration: int) -> None:
        """The optimizer step and its count, together (a state snapshot sees both or neither)."""
        self.stage_model.apply_mean_grad(total, count)
        self.applied_steps = iteration + 1

    def _record_metrics(self, t: int, step_s: float) -> None:
        completed, loss_sum = self.phases.iteration_loss(t)
        seconds = trio.current_time() - self.iter_started
        rec = {
            "iteration": t,
            "loss": loss_sum / completed if completed else None,
            "microbatches": completed,
            "samples": completed * self.manifest.data.microbatch_size,
            "completed": completed,
            "deferred": sum(r.deferred for r in self.phases.done_reports.get(t, {}).values()),
            "lost": sum(r.lost for r in self.phases.done_reports.get(t, {}).values()),
            "seconds": round(seconds, 4),
            "aggregation_seconds": round(step_s, 4),
            "pipeline_seconds": round(self.pipeline_s.get(t, math.nan), 4),
            "relays": sum(len(v) for k, v in (self.phases.groups.get(t) or {}).items() if k >= 0),
            "time": time.time(),
        }
        with open(self.opts.state_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        log.info("iteration %d loss %.4f microbatches %d %.2f s", t, rec["loss"] or math.nan, completed, seconds)

    def _checkpoint(self, final: bool = False) -> None:
        if self.stage_model is None:
            return
        import torch

        path = self.opts.state_dir / "checkpoint.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({"role": self.role, "stage": self.stage, "iteration": getattr(self, "last_iteration", -1),
                    "params": self.stage_model.param_vector(), "state": self.stage_model.state_bytes()}, tmp)
        os.replace(tmp, path)

    def _write_status(self) -> None:
        path = self.opts.state_dir / "status.json"
        st = {
            "peer_id": getattr(self, "me", ""), "name": self.name, "role": self.role, "stage": self.stage,
            "run_id": self.run_id, "addrs": self.host.addrs, "refused_frames": self.refused,
            "compute_s": round(self.compute_s, 6), "compute_calls": self.compute_calls,
            "leader": self.leader(), "term": self.leader_m.term if self.leader_m is not None else None,
            "steps_applied": self.applied_steps, "joining": self.joining, "leaving": self.leaving,
            "peers": {p.peer_id: {"name": p.name, "role": p.role, "stage": p.stage, "rtt_ms": p.rtt_ms}
                      for p in self.peers.values()},
            "flows": {d: dict(v) for d, v in self.flow.out.items()} if self.flow else {},
            "link_costs": self.link_costs_used,
            "iteration": self.current.iteration if self.current else getattr(self, "last_iteration", None),
            "ledger": self.ledger.counts(self.current.iteration) if self.current else {},
            "policy": self.opts.policy, "presumed_dead": sorted(self.crashed),
            "lost_contributions": {str(k): v for k, v in self.lost_contributions.items()},
            "recovery": dict(vars(self.rec.stats)) if self.rec is not None else {},
            "holding": self._holding(),
            "pid": os.getpid(), "time": time.time(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, path)

    def _holding(self) -> dict[str, int]:
        """Microbatches this relay holds, by phase (fwd/sending/sent: forward pass; bwd/grad/done: backward)."""
        out: dict[str, int] = {}
        if self.rec is not None and self.role == "relay":
            for r in self.rec.mbs.values():
                out[r.phase] = out.get(r.phase, 0) + 1
        return out

    async def _serve_state_request(self, peer: str, msg: m.StageStateRequest) -> None:
        try:
            await self._on_state_request(peer, msg)
        except FrameRefused as e:
            self._refuse(peer, str(e))

    async def _status_loop(self) -> None:
        while True:
            self._write_status()
            await trio.sleep(1.0)


class FrameRefused(Exception):
    """A frame that is well formed but not acceptable here; logged and dropped."""


def msg_commodity_unknown(msg: Any, commodities: tuple[str, ...]):
    c = getattr(msg, "commodity", None)
    yield c is not None and c not in commodities


async def run_node(opts: NodeOptions) -> None:
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
            await node.run()
            nursery.cancel_scope.cancel()

"""The daemon's side of leadership, joining and stage-state hand-over (issue 5 in the daemon).

Theory of operation
-------------------
* **Leader.**  Every data node runs the pure `protocol.leader.LeaderMachine`
  (terms, pre-votes, leases; a leader acts only while a majority of the data
  nodes granted its lease).  Its `(term, voted_for)` is saved in the state
  directory before any vote leaves the node, so a restarted data node cannot
  vote twice in a term.  The acting leader publishes `run/<id>/leader` in the
  DHT and is the one that opens the aggregation phase and places joiners.
  A data node whose iteration is done sends `IterationDone` to whoever leads
  now, and again if the leader changes before BEGIN AGGREGATION arrives.
* **Groups.**  BEGIN AGGREGATION names the members of each stage's all-reduce
  (`pipeline.Phases`): the data nodes, and every relay the leader knows that
  is not joining and whose state is ready for this iteration (`ready_from`
  in its Hello).  So all copies of a stage reduce over the same group, and
  CAN TAKE waits for exactly the members that step.
* **Joining.**  A relay started with `--stage auto` runs the pure
  `JoinerMachine`: it finds the leader (DHT record `run/<id>/leader`), sends its
  capacity (free memory over the stage's per-microbatch memory) and its
  measured cost to each stage; the leader's `MembershipMachine` queries the
  stages' utilization and answers with an `Assignment(stage, download_from,
  start_iteration)`.  The newcomer builds its stage, says Hello with
  `joining=True`, and asks `download_from` for its state with `after =
  start_iteration`: the source answers once it has applied that many
  optimizer steps, with the weights and optimizer state and their SHA-256.
  The newcomer checks the hash, loads the state, and says Hello with
  `ready_from = steps applied`: it takes part in aggregations from that
  iteration on, and the iteration in flight is not disturbed.  If a BEGIN
  AGGREGATION of an iteration it should have joined leaves it out (its Hello
  came too late), it fetches the state again, after that step.
* A newcomer takes part in aggregation (with zero gradients while no flow
  goes through it) but is not added to the flows of running flow machines:
  that needs neighbour changes in `protocol/flow.py` (not done yet).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from typing import Any

import trio

from ..protocol import messages as m
from ..protocol.effects import Send
from ..protocol.leader import LeaderConfig, LeaderMachine
from ..protocol.membership import INITIAL, JoinerConfig, JoinerMachine, MembershipConfig, MembershipMachine

log = logging.getLogger("gwtf.node")

LEADER_MSGS = (m.RequestVote, m.Vote, m.LeaderHeartbeat, m.HeartbeatAck)
STATE_WAIT_S = 600.0
LEAVE_WAIT_S = 10.0  # a leaving relay waits at most this long for the aggregation of its last iteration  # how long a source waits for its own steps before answering a StageStateRequest


def free_memory_bytes(device: str) -> int:
    """Free memory of the device the stage runs on (CUDA: the GPU's, CPU: MemAvailable)."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


class MembershipMixin:
    """Mixed into `runtime.node.Node`; uses its host, peers, timers and stage model."""

    # ---------------------------------------------------------------- leader
    def _start_leader_machine(self) -> None:
        path = self.opts.state_dir / "leader.json"
        term, voted = 0, None
        if path.exists():
            try:
                saved = json.loads(path.read_text())
                term, voted = int(saved["term"]), saved.get("voted_for")
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable %s", path)
        cfg = LeaderConfig(self.me, tuple(self.data_nodes()))
        self.leader_m = LeaderMachine(cfg, random.Random(f"{self.me}:leader"), term=term, voted_for=voted)
        self._persisted = self.leader_m.persistent_state()
        self._was_leader = False
        self._apply_leader(self.leader_m.start(trio.current_time()))

    def _apply_leader(self, effects) -> None:
        """Persist (term, vote) before any message leaves, then act on leadership changes."""
        state = self.leader_m.persistent_state()
        if state != self._persisted:
            path = self.opts.state_dir / "leader.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"term": state[0], "voted_for": state[1]}))
            os.replace(tmp, path)
            self._persisted = state
        self._apply(effects)
        now = trio.current_time()
        leading = self.leader_m.is_leader(now)
        if leading and not self._was_leader:
            log.info("leader of term %d", self.leader_m.term)
            self.member_m = MembershipMachine(MembershipConfig(self.me, self.n_stages, query_interval_s=2.0), self.leader_m.term,
                                              self._iteration_now())
            for p in self.peers.values():
                if p.role == "relay" and p.stage >= 0 and not p.joining:
                    self.member_m.add_member(p.peer_id, p.stage)
            self._apply(self.member_m.start(now))
            self.nursery.start_soon(self._publish_leader, self.leader_m.term)
        if not leading and self._was_leader:
            log.info("no longer leader (term %d)", self.leader_m.term)
            self.member_m = None
        self._was_leader = leading
        self.nursery.start_soon(self._maybe_report_done)

    async def _publish_leader(self, term: int) -> None:
        rec = json.dumps({"peer_id": self.me, "term": term, "name": self.name}).encode()
        try:
            with trio.move_on_after(10):
                await self.host.dht_put(f"run/{self.run_id}/leader", rec)
        except Exception as e:  # noqa: BLE001 - discovery is best effort
            log.debug("publishing the leader failed: %s", e)

    def _iteration_now(self) -> int:
        if self.current is not None:
            return self.current.iteration
        return max(0, self.applied_steps)

    def leader(self) -> str | None:
        if self.role == "data" and self.leader_m is not None:
            return self.leader_m.leader(trio.current_time())
        return self.known_leader

    def is_leader(self) -> bool:
        return self.leader_m is not None and self.leader_m.is_leader(trio.current_time())

    async def _maybe_report_done(self) -> None:
        """Send this data node's IterationDone to the current leader (again, if the leader changed)."""
        it = self.current
        if self.role != "data" or it is None or not self.iteration_reported(it.iteration) or self.phases is None:
            return
        if it.iteration in self.phases.begun:
            return
        lead = self.leader()
        if lead is None or self.done_sent.get(it.iteration) == lead:
            return
        self.done_sent[it.iteration] = lead
        c = self.ledger.counts(it.iteration)
        done = m.IterationDone(it.iteration, len(it.done), it.loss_sum, c["deferred"], c["pending"] + c["inflight"])
        if lead == self.me:
            self._on_iteration_done(self.me, done)
        else:
            await self._send(lead, done)

    def _on_iteration_done(self, sender: str, msg: m.IterationDone) -> None:
        if not self.is_leader():
            log.info("IterationDone from %s while not the acting leader: ignored (it resends)", self._who(sender))
            return
        if self.member_m is not None:
            self.member_m.set_iteration(msg.iteration + 1)
        self._apply_phase(self.phases.on_iteration_done(sender, msg, self.data_nodes(), self._ids("relay", 0),
                                                        self._groups(msg.iteration)))

    def _groups(self, iteration: int) -> dict[int, list[str]]:
        """Who takes part in each stage's aggregation of `iteration`: relays ready for it, and the data nodes."""
        groups: dict[int, list[str]] = {-1: self.data_nodes()}
        for k in range(self.n_stages):
            groups[k] = sorted(p.peer_id for p in self.peers.values()
                               if p.role == "relay" and p.stage == k and not p.joining and p.ready_from <= iteration
                               and not (p.leaving and p.leave_after < iteration))
        return groups

    def _usable(self, iteration: int) -> set[str]:
        """Next hops that may take a microbatch of `iteration` (not joining, not gone by then)."""
        return {p.peer_id for p in self.peers.values()
                if not p.joining and not (p.leaving and p.leave_after < iteration)}

    # ---------------------------------------------------------------- graceful leave
    def can_leave_gracefully(self) -> bool:
        return self.role == "relay" and self.stage is not None and self.phases is not None and not self.joining

    async def leave(self) -> None:
        """Leave without wasting work (section V-B's counterpart).

        The relay announces `leaving` with `leave_after` = the iteration in
        flight: from the next iteration on nobody routes microbatches to it and
        the leader leaves it out of the aggregation groups.  It finishes the
        microbatches it holds, takes part in that iteration's aggregation (its
        gradients count), then says Goodbye: its peers drop it and their flow
        machines rebuild the flows through it.  It waits for that aggregation
        even when it carried no microbatch (the leader may already have counted
        it in the group), but not longer than LEAVE_WAIT_S, and not at all
        once no data node is left.
        """
        t = self.applied_steps  # the iteration in flight (or about to open): our last one
        self.leaving, self.leave_after = True, t
        self._hello_all()
        log.info("leaving after iteration %d: finishing its microbatches and that iteration's aggregation", t)
        with trio.move_on_after(LEAVE_WAIT_S) as scope:
            while t not in self.phases.can_take_sent and self.data_nodes():
                await trio.sleep(0.05)  # (no data node left: no aggregation will come)
        if scope.cancelled_caught:
            log.warning("iteration %d's aggregation did not come within %.0f s: leaving anyway", t, LEAVE_WAIT_S)
        bye = m.Goodbye(self.applied_steps - 1 if self.applied_steps else 0)
        with trio.move_on_after(3):
            async with trio.open_nursery() as n:
                for pid in list(self.peers):
                    n.start_soon(self._send, pid, bye)
        with trio.move_on_after(3):
            try:
                rec = {"name": self.name, "role": self.role, "stage": self.stage, "left": True, "run_id": self.run_id}
                await self.host.dht_put(f"node/{self.me}", json.dumps(rec).encode())
            except Exception as e:  # noqa: BLE001 - deregistering is best effort; peers heard Goodbye
                log.debug("DHT deregistration failed: %s", e)
        log.info("left the run")
        self.stop()

    def _on_goodbye(self, peer: str, msg: m.Goodbye) -> None:
        info = self.peers.get(peer)
        log.info("%s left after iteration %d", info.name if info and info.name else peer[:16], msg.after_iteration)
        self._forget_peer(peer)

    async def _leader_loop(self) -> None:
        """Data nodes: keep reporting to the current leader; the leader publishes itself."""
        while True:
            await trio.sleep(0.5)
            await self._maybe_report_done()

    # ---------------------------------------------------------------- membership messages
    def _on_membership_msg(self, peer: str, msg: Any) -> None:
        now = trio.current_time()
        if isinstance(msg, LEADER_MSGS):
            if self.leader_m is None:
                return  # not a data node, or not started yet: the sender retries
            self._apply_leader(self.leader_m.on_message(now, peer, msg))
        elif isinstance(msg, (m.JoinRequest, m.UtilizationReport)):
            if self.member_m is not None and self.is_leader():
                self._apply(self.member_m.on_message(now, peer, msg))
        elif isinstance(msg, m.UtilizationQuery):
            if self.joiner is not None and self.joining:
                self._apply(self.joiner.on_message(now, peer, msg))
            elif self.role == "relay" and self.stage is not None:
                flows = sum(sum(v.values()) for v in self.flow.inn.values()) if self.flow else 0
                self.nursery.start_soon(self._send, peer, m.UtilizationReport(
                    msg.query_id, self.stage, flows, self.capacity, not self.joining))
        elif isinstance(msg, m.Assignment):
            if self.joiner is not None and self.stage is None:
                effects = self.joiner.on_message(now, peer, msg)
                self._apply([e for e in effects if not (isinstance(e, Send)
                                                        and isinstance(e.msg, m.StageStateRequest))])
                if self.joiner.assignment is not None:
                    self.nursery.start_soon(self._take_assignment, self.joiner.assignment)

    # ---------------------------------------------------------------- joining
    def _measured_capacity(self) -> int:
        """Microbatches this node can hold: free memory over a stage's per-microbatch memory, capped."""
        cap_demand = self.mb_per_it * self.opts.data_nodes
        if self.opts.capacity:
            return self.opts.capacity
        d = self.manifest.dims
        b, t = self.manifest.data.microbatch_size, self.manifest.data.seq_len
        layers = max(e - s for s, e in self.manifest.stages)
        # stashed input + ~12 activations of hidden size per layer (attention, MLP) in float32
        per_mb = 4 * b * t * d.hidden * (1 + 12 * layers)
        return max(1, min(cap_demand, int(0.5 * free_memory_bytes(self.opts.device) // max(1, per_mb))))

    def _stage_costs(self) -> tuple[float, ...]:
        """Measured cost to each stage: mean round trip to the peers it would talk to there."""
        def mean_rtt(ids: list[str]) -> float:
            rtts = [self.peers[p].rtt_ms for p in ids if self.peers[p].rtt_ms is not None]
            return sum(rtts) / len(rtts) if rtts else 1.0
        out = []
        for k in range(self.n_stages):
            prev = self.data_nodes() if k == 0 else self._ids("relay", k - 1)
            nxt = self.data_nodes() if k == self.n_stages - 1 else self._ids("relay", k + 1)
            out.append(round(mean_rtt(prev) / 2 + mean_rtt(nxt) / 2, 3))
        return tuple(out)

    async def _join(self) -> None:
        """`--stage auto`: ask the leader for a stage (section V-B) and fetch its state."""
        for pid in list(self.peers):
            rtt = await self._measure_rtt(pid)
            if pid in self.peers:  # (it may have died meanwhile)
                self.peers[pid].rtt_ms = rtt
        cfg = JoinerConfig(self.me, self._measured_capacity(), self._stage_costs())
        self.capacity = cfg.capacity
        self.joiner = JoinerMachine(cfg)
        self.joining = True
        log.info("joining: capacity %d, stage costs %s; waiting for the leader's assignment",
                 cfg.capacity, cfg.stage_costs)
        self._apply(self.joiner.start(trio.current_time()))
        while self.stage is None:
            lead = await self._find_leader()
            if lead is not None and lead != self.known_leader:
                self.known_leader = lead
                self._apply(self.joiner.set_leader(trio.current_time(), lead))
            await trio.sleep(1.0)

    async def _find_leader(self) -> str | None:
        try:
            with trio.move_on_after(5):
                raw = await self.host.dht_get(f"run/{self.run_id}/leader")
                if raw:
                    pid = json.loads(raw)["peer_id"]
                    if pid in self.peers:
                        return pid
        except Exception as e:  # noqa: BLE001 - the DHT is best effort
            log.debug("leader lookup failed: %s", e)
        return None

    async def _take_assignment(self, a: m.Assignment) -> None:
        log.info("assigned to stage %d by the leader (term %d); state from %s, serving from iteration %d",
                 a.stage, a.term, self._who(a.download_from), a.start_iteration)
        self.stage = a.stage
        self.joining = True
        self.want_after = max(self.want_after, a.start_iteration)
        self.phases = self._new_phases()  # from now on a BEGIN that leaves us out raises `want_after`
        await trio.to_thread.run_sync(self._load_model)
        if a.download_from == INITIAL:  # an empty stage before any step: the manifest's weights are the state
            self.applied_steps = self.ready_from = 0
            self.joining = False
            self.joiner.state_loaded()
            log.info("stage %d starts from the run's initial weights", a.stage)
            self._hello_all()
            self.state_loaded.set()
            return
        self._hello_all()
        await self._fetch_state(a.download_from, a.start_iteration)

    async def _fetch_state(self, source: str, after: int) -> None:
        """Download the stage state from `source`, with at least `after` optimizer steps applied.

        While it waits, a BEGIN AGGREGATION that leaves it out raises the steps
        it needs (`_resync`); the request is then sent again, and a reply with
        fewer steps is refused, so the state it ends with is never behind an
        aggregation it missed.
        """
        self.joining = True
        self.want_after = max(self.want_after, after)
        self.state_loaded = trio.Event()
        self._hello_all()
        asked, deadline = -1, 0.0
        while not self.state_loaded.is_set():
            if asked != self.want_after or trio.current_time() > deadline:
                if asked == self.want_after:
                    log.warning("no state from %s within %.0f s: asking again", self._who(source), STATE_WAIT_S)
                asked = self.want_after
                deadline = trio.current_time() + STATE_WAIT_S
                await self._send(source, m.StageStateRequest(self.stage, asked))
            with trio.move_on_after(0.2):
                await self.state_loaded.wait()

    def _hello_all(self) -> None:
        for pid in list(self.peers):
            self.nursery.start_soon(self._send, pid, self._hello())

    async def _on_state_request(self, peer: str, msg: m.StageStateRequest) -> None:
        if self.stage is None or msg.stage != self.stage or self.stage_model is None or self.joining:
            raise_refused(f"StageStateRequest for stage {msg.stage}: this node serves stage {self.stage}"
                          + (" and is joining itself" if self.joining else ""))
        with trio.move_on_after(STATE_WAIT_S):
            while self.applied_steps < msg.after:
                await self.steps_changed.wait()
        steps, blob = await trio.to_thread.run_sync(self._snapshot, limiter=self.torch_limiter)
        import torch

        digest = hashlib.sha256(blob).hexdigest()
        tensor = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        log.info("sending stage %d state (%d steps, %.1f MB) to %s", self.stage, steps, len(blob) / 1e6,
                 self._who(peer))
        await self._send_tensor(peer, m.StageState(self.stage, steps, digest, None), tensor)

    def _snapshot(self) -> tuple[int, bytes]:
        return self.applied_steps, self.stage_model.state_bytes()

    async def _on_state(self, peer: str, msg: m.StageState, payload) -> None:
        from ..model.tensors import TensorError, unpack

        if not self.joining or msg.stage != self.stage or msg.tensor is None:
            raise_refused("StageState that this node did not ask for")
        if msg.iteration < self.want_after:
            raise_refused(f"StageState after {msg.iteration} steps, asked for at least {self.want_after}")
        try:
            t = unpack(msg.tensor, payload, expect_dtype="uint8", max_bytes=1 << 34)
        except TensorError as e:
            raise_refused(f"StageState tensor refused: {e}")
        blob = t.numpy().tobytes()
        if hashlib.sha256(blob).hexdigest() != msg.sha256:
            raise_refused("StageState hash mismatch: the state was corrupted or tampered with")
        try:
            await trio.to_thread.run_sync(self.stage_model.load_state_bytes, blob, limiter=self.torch_limiter)
        except Exception as e:  # noqa: BLE001 - refuse a state that does not fit this stage, keep running
            raise_refused(f"StageState does not load: {e}")
        if msg.iteration < self.want_after:
            # a BEGIN AGGREGATION left us out while this state was loading: it misses that
            # step; the fetch loop asks again for a newer one
            log.info("state of %d steps is behind an aggregation we missed: asking for %d",
                     msg.iteration, self.want_after)
            return
        self.applied_steps = msg.iteration
        self.ready_from = msg.iteration
        self.joining = False
        if self.joiner is not None:
            self.joiner.state_loaded()
        log.info("stage %d state loaded from %s (%d steps, sha256 %s...): taking part from iteration %d",
                 self.stage, self._who(peer), msg.iteration, msg.sha256[:12], self.ready_from)
        self._hello_all()
        self.state_loaded.set()

    async def _resync(self, iteration: int) -> None:
        """BEGIN AGGREGATION of `iteration` left this node out: fetch the state after that step.

        Only a node that holds a state meant for this iteration (not joining,
        `ready_from <= iteration`) has fallen behind; a joiner's download in
        flight already asks for a later state, and an older iteration's step
        is in the state it holds.
        """
        if self.joining:
            self.want_after = max(self.want_after, iteration + 1)  # the download must include this step
            return
        if iteration < self.ready_from:
            return
        group = self.phases.group(iteration, self.stage) or set()
        sources = sorted(p for p in group if p != self.me)
        if not sources:
            log.warning("left out of iteration %d and no stage peer to resync from", iteration)
            return
        log.info("left out of iteration %d's aggregation: fetching the state after it", iteration)
        await self._fetch_state(sources[0], iteration + 1)


def raise_refused(why: str):
    from .node import FrameRefused

    raise FrameRefused(why)


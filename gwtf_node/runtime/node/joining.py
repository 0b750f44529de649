"""Joining and leaving: a relay placed by the leader, stage-state hand-over, graceful leave, Goodbye.

* **Joining** (section V-B). A relay started with `--stage auto` runs the pure `JoinerMachine`: it finds the leader
  (DHT record `run/<id>/leader`), sends its capacity (the microbatches that fit its device's free memory in every stage
  it can hold, model/memory.py) and its measured cost to each stage, +inf for a stage whose part does not fit (the
  leader never places a node where its cost is infinite: protocol/membership.py `choose_stage`); the leader's
  `MembershipMachine` (leadership.py) queries the stages' utilization and answers with an `Assignment(stage,
  download_from, start_iteration)`. The newcomer builds its stage, says Hello with `joining=True`, and asks
  `download_from` for its state with `after = start_iteration`: the source answers once it has applied that many
  optimizer steps, with the weights and optimizer state and their SHA-256, in chunks (statechunks.py). The newcomer
  checks the hash, loads the state, and says Hello with `ready_from = steps applied`: it takes part in aggregations
  from that iteration on, and the iteration in flight is not disturbed. Its neighbours add it to their running flow
  machines once its Hello says it is ready (flows.py), and its own flow machine starts as `joined`.
* **Falling behind.** If a BEGIN AGGREGATION of an iteration this node should have taken part in leaves it out (its
  Hello came too late), it fetches the state again, after that step (`resync`). A relay that was cut off (a partition)
  while the run stepped learns it from the first Hello after it is redialled (discovery.py), a stage peer's or a data
  node's saying more than one aggregation more than its own state: it fetches the state after those steps from a stage
  peer (`catch_up`) and takes part again from the next iteration.
* **Leaving** (V-B's counterpart, `leave`). The relay announces `leaving` with `leave_after` = the iteration in flight:
  from the next iteration on nobody routes microbatches to it and the leader leaves it out of the aggregation groups.
  It finishes the microbatches it holds, takes part in that iteration's aggregation (its gradients count), then says
  Goodbye: its peers forget it and their flow machines rebuild the flows through it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import trio

from ...model.memory import largest_state_bytes
from ...protocol import messages as m
from ...protocol.bounds import MAX_STATE_BYTES
from ...protocol.effects import Send
from ...protocol.membership import INITIAL, JoinerConfig, JoinerMachine, link_report
from .aggregation import Aggregation
from ..net.discovery import Discovery
from ..net.frames import DEFAULT_FRAME_TIMEOUT_S
from .handover import replacement_source
from .flows import Flows
from .leadership import Leadership
from .liveness import Liveness
from ..net.peers import PeerInfo, Peers
from .stage import LocalStage
from .statechunks import Download, StateServer
from .driver import Drivers, Owner
from ..net.wire import FrameRefused, Wire, now
from .waits import resume_wait, wait_entry

log = logging.getLogger("gwtf.node")

STATE_WAIT_S = 600.0  # how long a source waits for its own steps before answering a StageStateRequest
LEAVE_WAIT_S = 10.0  # a leaving relay waits at most this long for the aggregation of its last iteration
GOODBYE_WAIT_S = 3.0
LEADER_LOOKUP_S = 5.0
RESUME_POLL_S = 2.0  # a relay coming back that waits asks its peers again this often
RESUME_SETTLE_S = 1.0  # ... and first gives the peers it learns of from a data node this long to say Hello
HASH_ASK_S = 15.0  # ... and waits this long at most for a hash-only answer
NO_QUORUM_RETRY_S = 30.0  # a joiner whose state no quorum vouched for asks again after this long (handover.py)
HASH_ANSWER_WAIT_S = 10.0  # a stage peer waits this long at most for the steps a hash-only request asks for


class Joining:
    def __init__(self, wire: Wire, peers: Peers, liveness: Liveness, discovery: Discovery, stage: LocalStage,
                 flows: Flows, leadership: Leadership, aggregation: Aggregation, drivers: Drivers,
                 host: Any, *, capacity_flag: int, data_nodes: int, on_gone: Callable[[str], None],
                 on_left: Callable[[], None], records: Any = None) -> None:
        self.wire = wire
        self.records = records  # signed DHT records (records.py)
        self.peers = peers
        self.liveness = liveness
        self.discovery = discovery
        self.stage = stage
        self.flows = flows
        self.leadership = leadership
        self.aggregation = aggregation
        self.driver = drivers.make(Owner.JOINER, self.on_timer)  # the joiner machine's
        self.host = host
        self.capacity_flag = capacity_flag  # --capacity (0: measured)
        self.data_nodes = data_nodes  # --data-nodes: the demand a relay may have to hold
        self.on_gone = on_gone  # a peer said Goodbye: forget it everywhere
        self.on_left = on_left  # this node left the run
        self.manifest = stage.manifest
        self.run_id = stage.manifest.run_id
        self.joiner: JoinerMachine | None = None  # a --stage auto relay until placed and loaded
        self.want_after = 0  # the fewest steps the state it downloads must have
        self.state_loaded = trio.Event()
        self.resuming = False  # a relay back with a checkpoint (resume.py)
        self.resume_status: dict | None = None  # status.json's `resume`: what it decided and why
        self._answers: dict[str, m.StageState] = {}  # peer -> its answer to our hash-only request
        self._answered = trio.Event()
        self._hash_of: tuple[int, str] | None = None  # (steps, params hash) of the state held, when last computed
        self._verifying = 0  # hash-only questions in flight (a downloaded state's vouchers: handover.py; cutcheck.py)
        self.fetch_source: str | None = None  # the member the state download asks (another after a refusal)
        self._ask_deadline = 0.0  # when the download asks again without a new reason
        self._tried_sources: set[str] = set()  # members whose state the stage's quorum refused
        self.handover: dict | None = None  # the last downloaded state's check: source, steps, taken, why
        self.fetch_since: float | None = None  # the last state download began then (waits.py)
        self.server = StateServer(stage, wire, aggregation.round_records)  # this node's state to newcomers
        self.download = Download(lambda: min(MAX_STATE_BYTES, largest_state_bytes(self.manifest)))  # in chunks

    @property
    def joined(self) -> bool:
        """This node was placed by the leader or came back to its stage (flows may already exist around it)."""
        return self.joiner is not None or self.resuming

    # ---------------------------------------------------------------- joining
    def _fitting_stages(self) -> dict[int, int]:
        """The stages whose part fits this device's free memory, each with the capacity that fits there, at most
        the demand of the run's data nodes (model/memory.py); --capacity, when given, must fit as it is."""
        from ...model import memory

        cap = self.capacity_flag or memory.relay_demand(self.manifest, self.data_nodes)
        device = str(self.stage.device)
        fits = memory.stage_capacities(self.manifest, memory.free_bytes(device), cap, device=device)
        if self.capacity_flag:
            return {k: c for k, c in fits.items() if c >= self.capacity_flag}
        return fits

    def _measured_capacity(self, fits: dict[int, int]) -> int:
        """Microbatches this node can hold: --capacity, or what fits every stage it can serve (the least)."""
        if self.capacity_flag:
            return self.capacity_flag
        return min(fits.values(), default=1)

    def _stage_costs(self, fits: dict[int, int] | None = None) -> tuple[float, ...]:
        """Measured cost to each stage: mean round trip to the peers it would talk to there; +inf for a stage
        whose part does not fit this device (`fits`: the stages that do), so the leader never places it there."""
        def mean_rtt(ids: list[str]) -> float:
            rtts = [self.peers.get(p).rtt_ms for p in ids if self.peers.get(p).rtt_ms is not None]
            return sum(rtts) / len(rtts) if rtts else 1.0
        out = []
        n = self.peers.n_stages
        for k in range(n):
            prev = self.peers.data_nodes() if k == 0 else self.peers.ids("relay", k - 1)
            nxt = self.peers.data_nodes() if k == n - 1 else self.peers.ids("relay", k + 1)
            out.append(round(mean_rtt(prev) / 2 + mean_rtt(nxt) / 2, 3) if fits is None or k in fits else math.inf)
        return tuple(out)

    async def join(self) -> None:
        """`--stage auto`: ask the leader for a stage (section V-B); returns once placed (the download goes on)."""
        for pid in self.peers.ids_known():
            self.peers.set_rtt(pid, await self.liveness.measure_rtt(pid))
        measured = sorted(p for p in self.peers.ids_known() if self.peers.get(p).rtt_ms is not None)
        links = link_report({p: self.flows.link_cost(p) for p in measured})
        fits = self._fitting_stages()
        if not fits:
            log.warning("joining: no stage of the run fits this device's free memory; waiting to be placed anyway")
        cfg = JoinerConfig(self.wire.me, self._measured_capacity(fits), self._stage_costs(fits or None),
                           link_costs=links)
        self.peers.set_capacity(cfg.capacity)
        self.joiner = JoinerMachine(cfg)
        self.peers.set_standing(joining=True)
        log.info("joining: capacity %d, stage costs %s; waiting for the leader's assignment",
                 cfg.capacity, cfg.stage_costs)
        self.driver.carry(self.joiner.start(now()))
        while self.peers.stage is None:
            found = await self._find_leader()
            if found is not None and found[0] != self.leadership.known_leader:
                self.leadership.learned_leader(*found)
            lead = self.leadership.known_leader
            if lead is not None and lead != self.joiner.leader:
                self.driver.carry(self.joiner.set_leader(now(), lead))
            await trio.sleep(1.0)

    async def _find_leader(self) -> tuple[str, int] | None:
        """(the leader, its term) from the DHT record, which an admitted data node signed (records.py)."""
        try:
            with trio.move_on_after(LEADER_LOOKUP_S):
                rec = await self.records.get(f"run/{self.run_id}/leader")  # signed by an admitted data node
                if rec is not None:
                    pid = rec.value["peer_id"]
                    if pid in self.peers:
                        return pid, rec.value["term"]
        except Exception as e:  # noqa: BLE001 - the DHT is best effort
            log.debug("leader lookup failed: %s", e)
        return None

    def on_timer(self, key: str) -> None:
        if self.joiner is not None:
            self.driver.carry(self.joiner.on_timer(now(), key))

    def on_utilization_query(self, peer: str, msg: m.UtilizationQuery) -> None:
        if self.joiner is not None and self.peers.place.joining:
            self.driver.carry(self.joiner.on_message(now(), peer, msg))
        elif self.peers.role == "relay" and self.peers.stage is not None:
            links = {**self.flows.prev_costs, **self.flows.next_costs}  # Eq. 1 costs of its flow links
            self.wire.post(peer, m.UtilizationReport(msg.query_id, self.peers.stage, self.flows.units_through(),
                                                     self.peers.capacity, not self.peers.place.joining,
                                                     link_report(links)))

    def on_assignment(self, peer: str, msg: m.Assignment) -> None:
        if self.joiner is None or self.peers.stage is not None:
            return
        effects = self.joiner.on_message(now(), peer, msg)
        # the state request goes from _fetch_state, which asks again when it falls behind
        self.driver.carry([e for e in effects if not (isinstance(e, Send)
                                                              and isinstance(e.msg, m.StageStateRequest))])
        if self.joiner.assignment is not None:
            self.wire.spawn(self._take_assignment, self.joiner.assignment)

    async def _take_assignment(self, a: m.Assignment) -> None:
        log.info("assigned to stage %d by the leader (term %d); state from %s, serving from iteration %d",
                 a.stage, a.term, self.peers.who(a.download_from) if a.download_from != INITIAL
                 else "the run's initial weights", a.start_iteration)
        self.peers.take_stage(a.stage)
        self.peers.set_standing(joining=True)
        self.want_after = max(self.want_after, a.start_iteration)
        self.aggregation.new_phases()  # from now on a BEGIN that leaves us out raises `want_after`
        await trio.to_thread.run_sync(self.stage.build, a.stage)
        if a.download_from == INITIAL:  # an empty stage before any step: the manifest's weights are the state
            self.stage.set_steps(0)
            self.peers.set_standing(joining=False, ready_from=0)
            self.joiner.state_loaded()
            log.info("stage %d starts from the run's initial weights", a.stage)
            self.discovery.hello_all()
            self.discovery.prune()
            self.state_loaded.set()
            return
        self.discovery.hello_all()
        self.discovery.prune()  # (its sample: the relays of the stages it does not work with)
        await self._fetch_state(a.download_from, a.start_iteration)

    def on_stepped(self, iteration: int) -> None:
        if self.joiner is not None:
            self.joiner.on_iteration(iteration + 1)

    # ---------------------------------------------------------------- resuming (resume.py)
    async def resume(self, stage: int, steps: int, params_sha256: str) -> None:
        """A relay back with a checkpoint of `stage` (loaded: `steps` applied, parameter hash `params_sha256`):
        ask its peers, decide which state it takes (`resume.decide`), and take it; waits while the decision
        says so, asking again every RESUME_POLL_S."""
        from .resume import Source

        self.resuming = True
        self._hash_of = (steps, params_sha256)
        self.aggregation.new_phases(ready=False)  # a BEGIN leaving it out, or naming it, raises the steps it needs
        since, said = now(), ""
        self.resume_status = {"decision": "wait", "reason": "no data node known yet", "waiting_s": 0}
        while not [p for p in self.peers.data_nodes() if p != self.wire.me]:
            await trio.sleep(0.2)  # (finding the run is discovery's business; it says so when it cannot)
        await trio.sleep(RESUME_SETTLE_S)  # the Hellos of the peers the data node's PeerList names
        while True:
            d = await self._resume_decision(stage)
            self.resume_status = {"decision": d.source.value, "reason": d.reason, "waiting_s": round(now() - since)}
            if d.source is not Source.WAIT:
                break
            if d.reason != said:
                log.warning("resume: %s", d.reason)
                said = d.reason
            await trio.sleep(RESUME_POLL_S)
        log.info("resume: %s", d.reason)
        if d.source is Source.DOWNLOAD:
            log.info("resume: downloading stage %d's state from %s", stage, self.peers.who(d.peer))
            await self._fetch_state(d.peer, d.steps)
            return
        if d.source is Source.STALE_RESTART:
            log.warning("resume: stage %d restarts from a checkpoint of %d steps: %d optimizer steps of stage %d's "
                        "training are lost; the run goes on from iteration %d", stage, self.stage.applied_steps,
                        d.lost, stage, d.steps)
        self.stage.set_steps(d.steps)
        self.aggregation.resynced(d.steps)
        self.peers.set_standing(joining=False, ready_from=d.steps)
        log.info("resume: stage %d from its own checkpoint (no download): taking part from iteration %d", stage,
                 d.steps)
        self.discovery.hello_all()
        self.state_loaded.set()

    async def _resume_decision(self, stage: int):
        from .resume import Decision, Held, PeerAnswer, RunAnswer, Source, decide

        ready = [p for p in self.peers.ids("relay", stage)
                 if not self.peers.get(p).joining and not self.peers.get(p).leaving]
        held = Held(self.stage.applied_steps, await self._own_hash())
        if ready:
            for p in ready:
                ans = await self._ask(p, m.StageStateRequest(stage, held.steps, hash_only=True))
                if ans is not None:
                    return decide(stage, held, peer=PeerAnswer(p, ans.iteration, ans.params_sha256), run=None,
                                  want=self.want_after)
            return Decision(Source.WAIT, reason=f"no answer from stage {stage}'s relays "
                                                f"{', '.join(map(self.peers.who, ready))}")
        run = None
        for d in [p for p in self.peers.data_nodes() if p != self.wire.me]:
            ans = await self._ask(d, m.StageStateRequest(stage, 0, hash_only=True))
            if ans is not None:
                run = RunAnswer(ans.iteration, ans.run_steps, ans.stage_empty)
                break
        rivals = {p: self.peers.get(p).steps for p in self.peers.ids("relay", stage) if self.peers.get(p).joining}
        return decide(stage, held, peer=None, run=run, empty_stage=self.manifest.empty_stage, me=self.wire.me,
                      rivals=rivals)

    async def ask_hash(self, peer: str, msg: m.StageStateRequest) -> m.StageState | None:
        """A stage peer's (steps, parameter hash) answer to a hash-only request (cutcheck.py)."""
        self._verifying += 1
        try:
            return await self._ask(peer, msg)
        finally:
            self._verifying -= 1

    async def _own_hash(self) -> str:
        steps = self.stage.applied_steps
        if self._hash_of is None or self._hash_of[0] != steps:
            self._hash_of = (steps, await self.stage.run(self.stage.model.state_hash))
        return self._hash_of[1]

    async def _ask(self, peer: str, msg: m.StageStateRequest) -> m.StageState | None:
        """Send a hash-only request and wait (at most HASH_ASK_S) for the answer."""
        self._answers.pop(peer, None)
        if not await self.wire.send(peer, msg):
            return None
        with trio.move_on_after(HASH_ASK_S):
            while peer not in self._answers:
                await self._answered.wait()
        return self._answers.pop(peer, None)

    def _on_answer(self, peer: str, msg: m.StageState) -> None:
        if not (self.resuming or self._verifying):
            raise FrameRefused("hash-only StageState that this node did not ask for")
        self._answers[peer] = msg
        self._answered.set()
        self._answered = trio.Event()

    async def _answer_hash_only(self, peer: str, msg: m.StageStateRequest) -> None:
        """A relay coming back compares its checkpoint: a stage peer says its steps and parameter hash, a data
        node the steps the stage holds in the run and the run's step (resume.py).  No state moves."""
        if self.peers.role == "data":
            if not 0 <= msg.stage < self.peers.n_stages:
                raise FrameRefused(f"StageStateRequest for stage {msg.stage}: the run has {self.peers.n_stages}")
            run_steps = self.aggregation.run_steps()
            await self.wire.send(peer, m.StageState(msg.stage, self.aggregation.stage_steps(msg.stage), "", None,
                                                    run_steps=run_steps,
                                                    stage_empty=not self.peers.groups(run_steps)[msg.stage]))
            return
        await self.stage.wait_steps(msg.after, HASH_ANSWER_WAIT_S)
        steps, digest = await self.stage.run(lambda: (self.stage.applied_steps, self.stage.model.state_hash()))
        await self.wire.send(peer, m.StageState(self.peers.stage, steps, "", None, params_sha256=digest,
                                                rounds=self.aggregation.round_records(steps)))

    # ---------------------------------------------------------------- state hand-over
    async def fetch_state(self, source: str, after: int) -> None:
        """Download this node's part from `source` with at least `after` steps (a data node back after a restart
        downloads the data part from another data node); returns once it is loaded."""
        await self._fetch_state(source, after)

    async def _fetch_state(self, source: str, after: int) -> None:
        """Download the stage state from `source`, with at least `after` optimizer steps applied.

        While it waits, a BEGIN AGGREGATION that leaves it out raises the steps
        it needs (`resync`); the request is then sent again, and a reply with
        fewer steps is refused, so the state it ends with is never behind an
        aggregation it missed.  A source that is gone (presumed dead, or it
        left) before it answered is replaced by another ready member of its
        role and stage (handover.py `replacement_source`); with none, the request goes
        to it again once it is back.
        """
        if not self.peers.place.joining:  # (a joiner already said so: a second Hello could overtake the next)
            self.peers.set_standing(joining=True)
            self.discovery.hello_all()
        self.want_after = max(self.want_after, after)
        self.state_loaded = trio.Event()
        self.fetch_source = source
        self.fetch_since = now()
        asked, asked_from = -1, None
        while not self.state_loaded.is_set():
            src = self.fetch_source
            if self.peers.is_gone(src):  # presumed dead, or it left, before it answered
                alt = replacement_source(self.peers, src, self.wire.me, self._tried_sources)
                if alt is None:
                    asked_from = None  # nobody else: ask it again as soon as it is back (its Hello)
                else:
                    log.warning("state source %s is gone: asking %s", self.peers.who(src), self.peers.who(alt))
                    self.fetch_source = src = alt
            if not self.peers.is_gone(src) and (
                    asked != self.want_after or asked_from != src or self._answer_overdue(src)):
                if asked == self.want_after and asked_from == src:
                    log.warning("no state taken from %s yet: asking again", self.peers.who(src))
                asked, asked_from = self.want_after, src
                self._ask_deadline = now() + STATE_WAIT_S
                offset, sha = self.download.resume()
                if offset:
                    log.info("resuming the state download at %.1f of %.1f MB", offset / 1e6, self.download.total / 1e6)
                await self.wire.send(src, m.StageStateRequest(self.peers.stage, asked, offset=offset, sha256=sha))
            with trio.move_on_after(0.2):
                await self.state_loaded.wait()

    def _answer_overdue(self, src: str) -> bool:
        """No payload byte from `src`, nor a request to it, for a frame timeout, and asked STATE_WAIT_S ago or
        answered in this download (a state of GBs takes minutes, a source may wait for its steps before it answers)."""
        asked, came = self._ask_deadline - STATE_WAIT_S, self.host.payload_moved.get((src, True), -math.inf)
        begun = came > (self.fetch_since or math.inf)
        return (now() > self._ask_deadline or begun) and now() - max(came, asked) > DEFAULT_FRAME_TIMEOUT_S

    def on_state_request(self, peer: str, msg: m.StageStateRequest) -> None:
        # answered in its own task: it may wait for a step, and this peer's other frames (Pings) must not
        self.wire.spawn(self._serve_state_request, peer, msg)

    async def _serve_state_request(self, peer: str, msg: m.StageStateRequest) -> None:
        try:
            await self._answer_state_request(peer, msg)
        except FrameRefused as e:
            self.wire.refuse(peer, str(e))

    async def _answer_state_request(self, peer: str, msg: m.StageStateRequest) -> None:
        joining = self.peers.place.joining
        if msg.hash_only and self.peers.role == "data":
            await self._answer_hash_only(peer, msg)
            return
        if self.peers.stage is None or msg.stage != self.peers.stage or not self.stage.built or joining:
            raise FrameRefused(f"StageStateRequest for stage {msg.stage}: this node serves stage {self.peers.stage}"
                               + (" and is joining itself" if joining else ""))
        if msg.hash_only:
            await self._answer_hash_only(peer, msg)
            return
        await self.server.answer(peer, msg, self.peers.stage, self.peers.who(peer), STATE_WAIT_S)

    async def on_state(self, peer: str, msg: m.StageState, payload) -> None:
        if msg.tensor is None and not msg.sha256:
            self._on_answer(peer, msg)
            return
        if not self.peers.place.joining or msg.stage != self.peers.stage or msg.tensor is None:
            raise FrameRefused("StageState that this node did not ask for")
        if msg.iteration < self.want_after:
            raise FrameRefused(f"StageState after {msg.iteration} steps, asked for at least {self.want_after}",
                               ban=False)  # (the chunks of a state asked for before a resync: not the sender's fault)
        try:
            blob = await self.download.take(self.stage.run, peer, msg, payload)
        except ValueError as e:
            raise FrameRefused(str(e)) from None
        if blob is None:  # (more chunks to come: statechunks.py)
            return
        await self._check_with_members(peer, msg, blob)
        try:  # (the parameters and their steps together: a checkpoint never labels one with the other's steps)
            await self.stage.run(self.stage.install, blob, msg.iteration)
            self.server.served = None  # (a state kept for a newcomer's resumption is not this one)
        except Exception as e:  # noqa: BLE001 - refuse a state that does not fit this stage, keep running
            raise FrameRefused(f"StageState does not load: {e}") from None
        self.aggregation.adopt_rounds(msg.rounds, msg.iteration)
        if msg.iteration < self.want_after:
            # a BEGIN AGGREGATION left us out while this state was loading: it misses that
            # step; the fetch loop asks again for a newer one
            log.info("state of %d steps is behind an aggregation we missed: asking for %d",
                     msg.iteration, self.want_after)
            return
        self.aggregation.resynced(msg.iteration)
        self.peers.set_standing(joining=False, ready_from=msg.iteration)
        if self.joiner is not None:
            self.joiner.state_loaded()
        log.info("stage %d state loaded from %s (%d steps, sha256 %s...): taking part from iteration %d",
                 self.peers.stage, self.peers.who(peer), msg.iteration, msg.sha256[:12], msg.iteration)
        self.discovery.hello_all()
        self.state_loaded.set()

    async def _check_with_members(self, source: str, msg: m.StageState, blob: memoryview) -> None:
        """The stage's other ready members vouch for the downloaded state, or it is refused (handover.py)."""
        from .handover import next_source, params_hash, verdict

        try:
            digest = await self.stage.run(params_hash, blob)
        except ValueError as e:
            raise FrameRefused(f"StageState does not load: {e}") from None
        others = [p for p in self.peers.ids("relay", msg.stage) if p not in (source, self.wire.me)
                  and not self.peers.get(p).joining and not self.peers.get(p).leaving]
        answers: dict[str, tuple[int, str]] = {}
        self._verifying += 1
        try:
            for p in others:
                ans = await self._ask(p, m.StageStateRequest(msg.stage, msg.iteration, hash_only=True))
                if ans is not None:
                    answers[p] = (ans.iteration, ans.params_sha256)
        finally:
            self._verifying -= 1
        ok, why = verdict(msg.iteration, digest, answers)
        self.handover = {"source": source, "steps": msg.iteration, "taken": ok, "why": why}
        if not ok:
            self._tried_sources.add(source)
            nxt = next_source(msg.iteration, digest, answers, self._tried_sources)
            if nxt is not None:
                log.warning("stage %d state from %s refused: %s; taking it from %s, whose state a majority holds",
                            msg.stage, self.peers.who(source), why, self.peers.who(nxt))
                self.fetch_source = nxt
            else:
                self.handover["no_quorum"] = True
                self._tried_sources.clear()
                self._ask_deadline = now() + NO_QUORUM_RETRY_S
                log.error("stage %d state hand-over: no quorum of the stage's members vouches for any state at %d "
                          "steps (%s): nothing loaded; asking again in %.0f s (a majority of the stage's members "
                          "must be honest: docs/security.md)", msg.stage, msg.iteration, why,
                          NO_QUORUM_RETRY_S)
            raise FrameRefused(f"StageState from {self.peers.who(source)}: {why}")
        log.info("stage %d state from %s: %s", msg.stage, self.peers.who(source), why)

    def catch_up(self, info: PeerInfo) -> None:
        """`info` (a Hello) says the run stepped more than one aggregation past this relay's state: this node was
        cut off (a partition: every peer presumed it dead, it presumed them dead) while the others trained.  It
        fetches the state after those steps from a ready member of its stage (the peer itself when it is one), as
        a joiner does, and takes part again from the iteration after it (module doc).  A data node's steps count
        too (the run's step), so a relay that hears its data node first waits for no stage peer to say it."""
        place = self.peers.place
        if self.peers.role != "relay" or self.peers.stage is None or place.joining or not self.stage.built:
            return
        if info.joining or info.leaving or not (info.role == "data" or info.stage == self.peers.stage):
            return
        if info.steps <= self.stage.applied_steps + 1:
            return
        source = info.peer_id if info.role == "relay" else replacement_source(self.peers, self.wire.me, self.wire.me,
                                                                              self._tried_sources)
        if source is None:
            return  # (no stage peer known yet: its own Hello brings it here again)
        log.warning("behind the run: %s has %d steps applied, this node %d (cut off while the run trained): "
                    "fetching the state from %s", self.peers.who(info.peer_id), info.steps,
                    self.stage.applied_steps, self.peers.who(source))
        self.wire.spawn(self._fetch_state, source, info.steps)

    def resync(self, iteration: int) -> None:
        """BEGIN AGGREGATION of `iteration` left this node out (Phases' LeftOut): fetch the state after that step.

        Only a node that holds a state meant for this iteration (not joining,
        `ready_from <= iteration`) has fallen behind; a joiner's download in
        flight already asks for a later state, and an older iteration's step
        is in the state it holds.
        """
        if self.peers.place.joining:
            self.want_after = max(self.want_after, iteration + 1)  # the download must include this step
            return
        if iteration < self.stage.applied_steps:
            # the state held here is after that step already (a relay back with the state after it, resume.py):
            # that iteration counts as stepped here, and its CAN TAKE goes on
            self.aggregation.resynced(self.stage.applied_steps)
            return
        if iteration < self.peers.place.ready_from:
            return
        group = self.aggregation.group(iteration, self.peers.stage) or set()
        sources = sorted(p for p in group if p != self.wire.me)
        if not sources:
            log.warning("left out of iteration %d and no stage peer to resync from", iteration)
            return
        log.info("left out of iteration %d's aggregation: fetching the state after it", iteration)
        self.wire.spawn(self._fetch_state, sources[0], iteration + 1)

    # ---------------------------------------------------------------- leaving
    def can_leave_gracefully(self) -> bool:
        return (self.peers.role == "relay" and self.peers.stage is not None and self.aggregation.has_phases()
                and not self.peers.place.joining)

    async def leave(self) -> None:
        """Leave without wasting work: announce it, finish the iteration in flight and its aggregation, Goodbye.

        It waits for that aggregation even when it carried no microbatch (the
        leader may already have counted it in the group), but not longer than
        LEAVE_WAIT_S, and not at all once no data node is left.
        """
        t = self.stage.applied_steps  # the iteration in flight (or about to open): our last one
        self.peers.set_standing(leaving=True, leave_after=t)
        self.discovery.hello_all()
        log.info("leaving after iteration %d: finishing its microbatches and that iteration's aggregation", t)
        with trio.move_on_after(LEAVE_WAIT_S) as scope:
            while not self.aggregation.can_take_sent(t) and (self.peers.data_nodes() or self.aggregation.stepping(t)):
                await trio.sleep(0.05)  # (no data node left: no aggregation will come, but one begun finishes)
        if scope.cancelled_caught:
            log.warning("iteration %d's aggregation did not come within %.0f s: leaving anyway", t, LEAVE_WAIT_S)
        await self.stage.run(self.aggregation.checkpoint)  # the state after its last aggregation (resume.py)
        steps = self.stage.applied_steps
        await self.goodbye_all(steps - 1 if steps else 0)
        with trio.move_on_after(GOODBYE_WAIT_S):
            try:
                rec = {"name": self.peers.name, "role": self.peers.role, "stage": self.peers.stage, "left": True,
                       "run_id": self.run_id}
                await self.records.put(f"node/{self.wire.me}", rec)
            except Exception as e:  # noqa: BLE001 - deregistering is best effort; peers heard Goodbye
                log.debug("DHT deregistration failed: %s", e)
        log.info("left the run")
        self.on_left()

    async def goodbye_all(self, after_iteration: int, wait_s: float = GOODBYE_WAIT_S) -> None:
        """Tell every peer this node leaves after `after_iteration` (bounded: a dead peer does not hold it up)."""
        bye = m.Goodbye(after_iteration)
        with trio.move_on_after(wait_s):
            async with trio.open_nursery() as n:
                for pid in self.peers.ids_known():
                    n.start_soon(self.wire.send, pid, bye)

    def on_goodbye(self, peer: str, msg: m.Goodbye) -> None:
        info = self.peers.get(peer)
        log.info("%s left after iteration %d", info.name if info and info.name else peer[:16], msg.after_iteration)
        self.leadership.on_goodbye(peer)
        self.on_gone(peer)

    def waits(self, t: float, who: Callable[[str], str]) -> list[dict]:
        """status.json's `waiting_for` here: the stage's state download; a relay back with a checkpoint waiting."""
        got = self.download.progress() or {"bytes": 0, "total": None}
        out = [] if self.fetch_since is None or self.state_loaded.is_set() else [wait_entry(
            "stage_state", self.fetch_since, t, iteration=self.want_after, steps=self.want_after,
            peers=[who(self.fetch_source)] if self.fetch_source else [], bytes=got["bytes"], total=got["total"])]
        rs = self.resume_status if self.resuming else None
        return out + ([resume_wait(rs)] if rs is not None and rs.get("decision") == "wait" else [])

"""Joining in virtual time: a relay back after a crash goes through the daemon's joining (`runtime/node/joining.py`).

With `joining="machines"` (the default) every step is the daemon's, in its
order, run by the pure machines of `protocol/membership.py` and
`protocol/placement.py`, their messages on the simulator's links:

1. REJOIN_S after its crash the machine restarts as a new node (new id, its
   location and capacity) with a `JoinerMachine`: its capacity and its cost
   to each stage (the mean round trip to that stage's neighbours, halved on
   each side, as `Joining._stage_costs`).  Every LEADER_LOOKUP_S it looks
   the leader up in the DHT (the record the acting leader published when it
   took office) and sends `JoinRequest` to it.
2. The acting leader (the data node `protocol/leader.py` elected) runs a
   `MembershipMachine` while it leads, as `runtime/node/leadership.py`: created
   when it takes office with the relays it knows as members, a round every
   QUERY_INTERVAL_S (`UtilizationQuery` to every member, a
   `UtilizationReport` back: flow units through the relay, its capacity,
   serving or joining), placement by `place_by_search` (which may put the
   joiner in another stage than the one it left), an `Assignment` to the
   joiner and its state source.  Its iteration is the one in flight, or the
   next once it sent BEGIN AGGREGATION.
3. The joiner asks its source for the stage state (`StageStateRequest`,
   `after` = the Assignment's start iteration); the source answers once it
   applied that many steps, with the state (STAGE_STATE_MB over the link,
   after what the link already carries); the joiner asks each other ready
   member of the stage for the hash of that state (a round trip each, in
   turn: `handover.py`), then loads it.
4. Ready, with the steps it loaded: the adjacent stages' microbatch machines
   get it as a neighbour (`set_neighbours`), their flow machines
   `add_neighbour` it and its own starts `joined`, the leader's membership
   machine counts it as a member.  A joiner ready while an aggregation is
   under way comes in when the next iteration opens.  (The daemon starts the
   joiner's own flow machine at placement and its neighbours add it at its
   ready Hello; here both happen at ready, so that no flow message reaches a
   machine that does not know its sender.)

A joiner does not crash while it joins.  A joiner whose source is reported
gone before it answered asks another ready member of the stage (the nearest),
as the daemon's `_fetch_state`; with none left it waits for good (a crashed
relay comes back with another id): `joining["stuck"]` in the report counts
them.

`joining="restart"` is the model before the machines ran: the relay comes
back in the stage it left, its download (STAGE_STATE_MB from a live stage
peer) started at once, announced as soon as it finished if the iteration is
in training (`join_mid_iteration`), else when the next iteration opens.

A node left out of an aggregation or out of step (Phases' `LeftOut`,
`OutOfStep`) fetches the state after that step the same way as a joiner, from
the first other member of its stage's group (`Joining.resync`).
"""

from __future__ import annotations

from ...protocol.effects import Send
from ...protocol.membership import (
    INITIAL, JoinerConfig, JoinerMachine, MembershipConfig, MembershipMachine, link_report,
)
from ...protocol.messages import Assignment, JoinRequest, StageStateRequest, UtilizationQuery, UtilizationReport
from .events import JoinLookup, Reflow, StateArrives
from .interpret import interpret
from .setting import STAGE_STATE_MB

JOIN_MSGS = (JoinRequest, UtilizationQuery, UtilizationReport, Assignment, StageStateRequest)
JOININGS = ("machines", "restart")  # TrainSim's `joining`: the daemon's joining, or the simulator's older model
QUERY_INTERVAL_S = 2.0  # the acting leader's utilization rounds (runtime/node/leadership.py)
LEADER_LOOKUP_S = 1.0  # a joiner looks the leader up this often until it is placed (runtime/node/joining.py)


class JoinDriver:
    """Part of `TrainSim` (driver.py): one mechanism of the simulator, see the module docstring."""

    def _init_joining(self) -> None:
        self.joiners: dict = {}  # joining.py: joiner id -> its JoinerMachine, until it comes in
        self._joiner_cap: dict[str, int] = {}
        self.joiner_count = 0
        self.join_stats = {"asked": 0, "placed": 0, "loaded": 0, "in": 0}
        self.placement: dict = {}  # acting leader -> its MembershipMachine
        self._dht_leader: str | None = None  # the leader record in the DHT: the last data node that took office
        self._state_waits: dict[str, list] = {}  # source -> state requests it holds (asker, steps)
        self._join_source: dict[str, str] = {}  # placed joiner -> the member it asked for the stage state
        self._resync_for: dict[tuple[str, str], int] = {}  # (node, source) -> the iteration it resyncs after
        self._ready_at_open: list = []  # joiners ready during an aggregation: they come in at the next open
        self.pending_joins: list[tuple[float, str, int, int]] = []
        self.joins = 0
        self.resyncs = 0

    # ---------------------------------------------------------------- the joiner
    def _restart_as_joiner(self, old: str) -> None:
        """The machine of crashed relay `old` is back as a new node: it asks the leader for a stage."""
        self.joiner_count += 1
        nid = f"{old.split('~')[0]}~{self.joiner_count}"
        self.net.loc[nid] = self.net.loc[old]  # the same machine, restarted
        self.join_stats["asked"] += 1
        jm = JoinerMachine(JoinerConfig(nid, self.cap[old], self._stage_costs(nid), link_costs=self._join_links(nid)))
        self.joiners[nid] = jm
        self._joiner_cap[nid] = self.cap[old]
        self._apply_join(nid, "joiner", jm.start(self.now))
        self._lookup_leader(nid)

    def _rtt_ms(self, a: str, b: str) -> float:
        return self.net.link(a, b)[0] + self.net.link(b, a)[0]

    def _stage_costs(self, nid: str) -> tuple[float, ...]:
        """Its cost to each stage: half the mean round trip to the stage's previous and next neighbours."""
        def mean_rtt(ids: list[str]) -> float:
            return sum(self._rtt_ms(nid, p) for p in ids) / len(ids) if ids else 1.0
        S, out = self.S, []
        for k in range(S):
            prev = list(self._live_data()) if k == 0 else self._peers(k - 1, nid)
            nxt = list(self._live_data()) if k == S - 1 else self._peers(k + 1, nid)
            out.append(round(mean_rtt(prev) / 2 + mean_rtt(nxt) / 2, 3))
        return tuple(out)

    def _join_links(self, nid: str) -> tuple[tuple[str, float], ...]:
        """What a joiner tells the leader of its links (`JoinRequest.link_costs`, as `Joining.join`): the Equation
        1 cost of its link to each live node it measured (every data node and relay here), sorted by peer id."""
        if not self.options.join_links:
            return ()
        relays = {r for r in self.stage if r not in self.dead and r not in self.data and r != nid}
        peers = set(self._live_data()) | relays
        return link_report({p: round(self._flow_cost(nid, p), 3) for p in peers})

    def _member_links(self, nid: str) -> tuple[tuple[str, float], ...]:
        """What a serving relay tells the leader of its links (`UtilizationReport.link_costs`, as
        `Joining.on_utilization_query`): the Equation 1 costs of its flow machine's links, by peer id."""
        fm = self.fnodes.get(nid)
        if not self.options.join_links or fm is None:
            return ()
        return link_report({p: round(c, 3) for p, c in {**fm.cfg.prev_costs, **fm.cfg.next_costs}.items()})

    def _lookup_leader(self, nid: str) -> None:
        """The joiner's DHT lookup of the leader record; again LEADER_LOOKUP_S later while it is not placed."""
        jm = self.joiners.get(nid)
        if jm is None or jm.assignment is not None:
            return
        lead = self._dht_leader if self._dht_leader not in self.reported_gone else None
        if lead is not None and lead != jm.leader:
            self._apply_join(nid, "joiner", jm.set_leader(self.now, lead))
        self._push(self.now + LEADER_LOOKUP_S, JoinLookup(nid))

    def _apply_join(self, nid: str, component: str, effects: list) -> None:
        """A joiner's or a leader's membership machine's effects (interpret.py): control messages and timers."""
        interpret(self, nid, component, effects)

    def _send_joiner(self, nid: str, e: Send) -> None:
        if type(e.msg) is StageStateRequest:
            return  # (sent by `_take_assignment`, as the daemon's `_fetch_state`)
        self._send(nid, e)

    def _join_timer(self, nid: str, key: tuple) -> None:
        component, name = key
        if component == "joiner":
            jm = self.joiners.get(nid)
            if jm is not None:
                self._apply_join(nid, "joiner", jm.on_timer(self.now, name))
        elif nid in self.placement and nid not in self.dead:
            pm = self.placement[nid]
            pm.set_iteration(self._placement_iteration(nid))
            self._apply_join(nid, "placement", pm.on_timer(self.now, name))

    def _join_message(self, nid: str, sender: str, msg) -> None:
        """A joining message reaches `nid` (a joiner, a relay, or a data node)."""
        t = type(msg)
        if t is StageStateRequest:
            self._state_request(nid, sender, msg.stage, msg.after)
            return
        jm = self.joiners.get(nid)
        if jm is not None:  # a joiner: its machine answers queries and takes its Assignment
            eff = jm.on_message(self.now, sender, msg)
            self._apply_join(nid, "joiner", eff)
            if t is Assignment and jm.assignment is msg:
                self._take_assignment(nid, msg)
            return
        if nid in self.dead:
            return
        if t is UtilizationQuery:
            if nid not in self.data:  # a serving relay reports (runtime/node/joining.py `on_utilization_query`)
                self._send(nid, Send(sender, UtilizationReport(msg.query_id, self.stage[nid], self._units_through(nid),
                                                               self.cap[nid], True, self._member_links(nid))))
        elif t in (JoinRequest, UtilizationReport):
            if nid in self.placement and self._leading(nid):
                pm = self.placement[nid]
                pm.set_iteration(self._placement_iteration(nid))
                self._apply_join(nid, "placement", pm.on_message(self.now, sender, msg))
        # an Assignment to a serving relay names it as the source: it waits for the joiner's request

    def _units_through(self, nid: str) -> int:
        fm = self.fnodes.get(nid)
        return sum(sum(v.values()) for v in fm.inn.values()) if fm is not None else 0

    def _take_assignment(self, nid: str, a: Assignment) -> None:
        self.join_stats["placed"] += 1
        if a.download_from == INITIAL:  # an empty stage before any step: the run's initial weights
            self._state_loaded(nid, 0)
            return
        self._join_source[nid] = a.download_from
        self._send(nid, Send(a.download_from, StageStateRequest(a.stage, a.start_iteration)))

    def _source_gone(self, gone: str) -> None:
        """`gone` is reported gone: a joiner, or a node resyncing after a step, that waits for its state from it asks
        another ready member of the stage (`Joining._replacement_source`: the nearest, never a joiner)."""
        for (nid, src), it in sorted(self._resync_for.items()):
            if src == gone and nid not in self.dead and (alt := self._replacement(nid, self.stage[nid], gone)):
                del self._resync_for[(nid, src)]
                self._resync_for[(nid, alt)] = it
                self._send(nid, Send(alt, StageStateRequest(self.stage[nid], it + 1)))
        for nid, src in sorted(self._join_source.items()):
            jm = self.joiners.get(nid)
            if src != gone or jm is None or jm.loaded:
                continue
            a = jm.assignment
            if alt := self._replacement(nid, a.stage, gone):
                self._join_source[nid] = alt
                self._send(nid, Send(alt, StageStateRequest(a.stage, a.start_iteration)))

    def _replacement(self, nid: str, stage: int, gone: str) -> str | None:
        """The stage member `nid` asks for the state instead of `gone`: the nearest live one (None: there is none)."""
        alts = [p for p in self._known(stage) if p not in (gone, nid) and p not in self.dead]
        return min(alts, key=lambda p: (self._rtt_ms(nid, p), p)) if alts else None

    # ---------------------------------------------------------------- the state hand-over
    def _state_request(self, src: str, to: str, stage: int, after: int) -> None:
        """`to` asks `src` for `stage`'s state with at least `after` steps: answered once `src` applied them."""
        if src in self.dead or self.stage.get(src) != stage or src not in self.nodes:
            return  # (the daemon refuses it; the asker waits)
        self._state_waits.setdefault(src, []).append((to, after))
        self._serve_state(src)

    def _serve_state(self, src: str) -> None:
        """Answer the requests `src` holds whose steps it has applied: the state over the link."""
        waits = self._state_waits.get(src)
        if not waits or src in self.dead:
            return
        steps = self.nodes[src].phases.applied
        keep = []
        for to, after in waits:
            if steps < after:
                keep.append((to, after))
                continue
            link = (src, to)
            dur = self.net.transfer_s(src, to, STAGE_STATE_MB)
            start = max(self.now, self._link_free.get(link, 0.0))
            self._link_free[link] = start + dur - self.net.link(src, to)[0] / 1000.0
            arrive = start + dur + self._hash_checks_s(to, src, self.stage[src])
            self._push(arrive, StateArrives(to, steps, src))
        self._state_waits[src] = keep

    def _hash_checks_s(self, nid: str, src: str, stage: int) -> float:
        """The stage's other ready members vouch for the state: a hash-only round trip to each, in turn."""
        others = [p for p in self._known(stage) if p not in (src, nid) and p not in self.dead]
        return sum(self._rtt_ms(nid, p) for p in others) / 1000.0

    def _state_arrived(self, nid: str, src: str, steps: int) -> None:
        """The state `src` sent reaches `nid` (checked with the stage's members): a joiner loads it, a node that
        resynced after the step of an iteration takes it."""
        if nid in self.joiners:
            if not self.joiners[nid].loaded:  # (a source reported gone may have answered before it died: the
                self._state_loaded(nid, steps)  # replacement's state then comes second, and is not loaded again)
            return
        it = self._resync_for.pop((nid, src), None)
        if it is not None and nid not in self.dead:
            nxt, prv = self._next_prev(nid)
            self._apply(nid, self.nodes[nid].rec.aggregation_done(self.now, it))
            self._apply_phase(nid, self.nodes[nid].phases.resynced(self.now, steps, nxt, prv))
            self._serve_state(nid)

    def _state_loaded(self, nid: str, steps: int) -> None:
        jm = self.joiners[nid]
        jm.state_loaded()
        self.join_stats["loaded"] += 1
        a = jm.assignment
        if self._aggregating():
            self._ready_at_open.append((nid, a.stage, steps))
        else:
            self._come_in(nid, a.stage, steps)

    def _resync(self, nid: str, it: int) -> None:
        """Left out of (or out of step in) the aggregation of `it`: the state after that step from the first other
        member of the stage's group (or a stage peer)."""
        self.resyncs += 1
        stage = self.stage[nid]
        group = self.nodes[nid].phases.group(it, stage) or set()
        sources = sorted(p for p in group if p != nid) or sorted(self._peers(stage, nid))
        if sources:
            self._send(nid, Send(sources[0], StageStateRequest(stage, it + 1)))
            self._resync_for[(nid, sources[0])] = it

    # ---------------------------------------------------------------- coming in
    def _come_in(self, nid: str, stage: int, steps: int) -> None:
        """The joiner is ready: its machines start, its neighbours take it, the leader counts it."""
        self.joiners.pop(nid, None)
        self.join_stats["in"] += 1
        self._add_node(nid, stage, self._joiner_cap.pop(nid), applied=steps)
        for d, pm in self.placement.items():
            if d not in self.dead:
                pm.add_member(nid, stage)
        if self.options.policy == "gwtf" and self.options.reflow:  # oracle routing: the optimum with the joiner, once settled
            self._push(self.now + self._settle_s(), Reflow(self._live_members()))

    def _ready_joiners_at_open(self) -> None:
        ready, self._ready_at_open = self._ready_at_open, []
        for nid, stage, steps in ready:
            self._come_in(nid, stage, steps)

    # ---------------------------------------------------------------- the leader
    def _placement_iteration(self, nid: str) -> int:
        ph = self.nodes[nid].phases
        return max(ph.iteration, max(ph.begun, default=-1) + 1)

    def _leadership_changed(self, nid: str) -> None:
        """A data node took office (its membership machine starts; it publishes itself in the DHT) or left it."""
        leading = self._leading(nid)
        if leading and nid not in self.placement:
            pm = MembershipMachine(MembershipConfig(nid, self.S, query_interval_s=QUERY_INTERVAL_S),
                                   self.nodes[nid].leader.term, self._placement_iteration(nid))
            for r in sorted(self.nodes):
                if r not in self.data and r not in self.dead and r not in self.reported_gone:
                    pm.add_member(r, self.stage[r])
            self.placement[nid] = pm
            self._dht_leader = nid
            self._apply_join(nid, "placement", pm.start(self.now))
        elif not leading and nid in self.placement:
            del self.placement[nid]

    def _placement_gone(self, gone: str) -> None:
        for d, pm in self.placement.items():
            pm.remove_member(gone)

    def _stuck_joiners(self) -> int:
        """Joiners placed whose source died before answering with no other member of the stage left to ask."""
        return sum(1 for nid, jm in self.joiners.items() if jm.assignment is not None and not jm.loaded
                   and self._join_source.get(nid) in self.dead)


def joining_report(sim) -> dict:
    rep = dict(sim.join_stats)
    rep["stuck"] = sim._stuck_joiners() if sim.options.joining == "machines" else 0
    rep["waiting"] = len(sim.joiners) - rep["stuck"]
    return rep


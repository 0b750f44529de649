"""Churn in virtual time: crashes, graceful leaves, relays joining a given stage, and the pause of an empty stage.

Crashes (`_crash`): a relay's or a data node's machines stop; the
membership layer reports it gone `detect_s` later (`Gone`); with
`rejoin` its machine comes back as a joiner (joining.py).  Churn spares the
last live relay of a stage (`_spared`, `spare_last`).

The hooks below make one change at the current virtual time, between two
calls of `TrainSim.run(..., until=...)` (tests drive the simulator with them):

* `crash_relay(r)`: `r` crashes now (as a scripted crash: never spared).
* `leave_relay(r)`: the daemon's graceful leave (runtime/node/joining.py,
  `Joining.leave`): `r` announces that it leaves after the iteration in flight
  (`leave_after` = the steps its state holds): from the next iteration on it
  takes no microbatch (its microbatch machine denies them) and the leader
  leaves it out of the aggregation groups; it finishes that iteration's
  aggregation (its CAN TAKE sent) or waits `leave_wait_s` at most (the
  daemon's LEAVE_WAIT_S; a test may set it on the simulator), then says
  Goodbye: every node forgets it at once (`Gone` now, no detection
  delay), nothing it computed is lost.
* `join_relay(k, loc)`: a relay started with `--stage k` at location `loc`.
  With a live member in stage k it downloads the stage state from the
  nearest one (`StageStateRequest` after the leader's placement iteration,
  checked and loaded as joining.py does) and comes in once loaded.  With
  stage k empty it is a relay coming back with the stage's checkpoint
  (runtime/node/resume.py, `Source.OWN`: the state of an empty stage does not move,
  so the checkpoint holds it): it comes in at once, ready from the iteration
  in flight, or from the next one once the leader sent its BEGIN AGGREGATION
  (the placement's start iteration, joining.py).

The pause (`pause_empty`, on by default as in the daemon; off, a stage dead
for good makes every iteration defer its microbatches, the older model that
`tests/sim/test_sim_train.py` still measures): a data node whose aggregation phase opens iteration t
while some stage has no relay ready for t (`empty_stages`: members not
reported gone, not leaving before t) does not open it (runtime/node/microbatches.py,
`open_iteration`: every microbatch would be deferred at once, a busy loop of
idle iterations).  It is paused (`paused`: the iteration, the empty stages,
since when) until a relay comes in that serves the last empty stage; then it
opens t at once (the daemon looks at every Hello and every PAUSE_CHECK_S).
Joiners that finished their download during the aggregation come in before
the check (their state is ready for t).  The daemon then also waits up to
PAUSE_FLOWS_WAIT_S for its flows to place a unit through the new relay; the
simulator does not (the flow machines re-form after the open as after any
join).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...protocol.membership import JoinerConfig, JoinerMachine
from ...protocol.messages import Assignment
from ...protocol.phasewaits import peers_at_work
from .events import Gone, Halt, LeaveWaited, Rejoin
from .setting import BACKWARD_S, FORWARD_S, MICROBATCHES, REJOIN_S, STAGE_STATE_MB, loose_detect_s

LEAVE_WAIT_S = 10.0  # the daemon's (runtime/node/joining.py): a leaving relay's longest wait for its last aggregation


@dataclass(frozen=True)
class Pause:
    """A data node does not open `iteration`: `stages` have no relay ready for it (since `since`)."""

    iteration: int
    stages: tuple[int, ...]
    since: float


class ChurnDriver:
    """Part of `TrainSim` (driver.py): one mechanism of the simulator, see the module docstring."""

    def _init_churn(self) -> None:
        self.spared = 0
        self.crashed_at: dict[str, float] = {}
        self.crashes: list[tuple[float, str]] = []
        self.data_crashed: dict[str, int] = {}  # a data node that crashed -> the iteration it was in
        self.leave_wait_s = LEAVE_WAIT_S  # a leaving relay's wait for its last aggregation (module docstring)
        self._begun = False  # `run` started the machines
        self.paused: dict[str, Pause] = {}  # data node -> the iteration it does not open while a stage is empty
        self.pauses: list[tuple[str, int, float, float]] = []  # (data node, iteration, paused at, opened at)
        self.leaving: dict[str, int] = {}  # relay -> the iteration after which it leaves
        self.left: list[tuple[float, str]] = []  # (when, relay) of every Goodbye

    def _spared(self, nid: str) -> bool:
        """`spare_last`: a churn crash of the last live relay of its stage is left out, as `gwtf-node local
        --churn` spares a relay of every stage: after the first step a stage whose members all died has no state
        a joiner could load (the daemon brings it back only from a relay's checkpoint)."""
        if not self.options.spare_last or nid in self.dead or nid not in self.nodes or nid in self.data:
            return False
        if self._peers(self.stage[nid], nid):
            return False
        self.spared += 1
        return True

    def _crash(self, nid: str) -> None:
        if nid in self.dead or nid not in self.nodes:
            return
        self.dead.add(nid)
        self.leaving.pop(nid, None)  # (a leaving relay may crash before its Goodbye)
        self.crashed_at[nid] = self.now
        self.crashes.append((self.now, nid))
        if self.trace is not None:
            self.trace.append(("crash", self.now, nid))
        m = self.nodes[nid].rec
        for it, keys in m.contrib.items():  # gradients held here die with the node
            st = self._it(it)
            st.lost_contrib += len(keys)
            st.lost_contrib_s += len(keys) * (FORWARD_S + BACKWARD_S)
        stage = self.stage[nid]
        self._allreduce_crash(nid)  # its stage's round waits for the report if it had not done its part
        self._schedule_reflow()
        later: tuple[str, ...] = ()  # who learns of it later, as the daemon's liveness check (liveness.py)
        if nid in self.data and self.options.middle_data_detect_s > self.options.detect_s:
            later = tuple(r for r, k in sorted(self.stage.items()) if r not in self.data and r not in self.dead
                          and 0 < k < self.S - 1)
            self._tell_loose(nid, later, self.options.middle_data_detect_s)
        elif nid not in self.data and self.options.idle_detect_s > self.options.detect_s:
            later = self._idle_watchers(nid)
            self.idle_watchers[nid] = dict.fromkeys(later, False)
            self._tell_loose(nid, later, self.options.idle_detect_s)
        self._push(self.now + self.options.detect_s, Gone(nid, later))
        if nid in self.data:
            self.data_crashed[nid] = self.nodes[nid].rec.iteration
        elif self.options.rejoin and self.options.joining == "machines":
            self._push(self.now + REJOIN_S, Rejoin(nid))
        elif self.options.rejoin:
            peers = self._peers(stage, nid)
            dl = STAGE_STATE_MB * 8.0 / min(self.net.link(p, nid)[1] for p in peers) if peers else 0.0
            self.pending_joins.append((self.now + REJOIN_S + dl, nid, stage, self.cap[nid]))
            self._push(self.now + REJOIN_S + dl, Rejoin(nid))

    def _tell_loose(self, nid: str, watchers: tuple[str, ...], floor_s: float) -> None:
        """Crashed `nid` is reported to each of `watchers`, which watched it loosely, after its loose deadline: the
        floor, or longer for a watcher with many loose peers (setting.py's `loose_detect_s`)."""
        when: dict[float, list[str]] = {}
        for r in watchers:
            when.setdefault(loose_detect_s(floor_s, self.options.loose_per_peer_s, self._loose_peers(r, nid)),
                            []).append(r)
        for delay, rs in sorted(when.items()):
            self._push(self.now + delay, Gone(nid, tuple(rs), late=True))

    def _loose_peers(self, r: str, nid: str) -> int:
        """The peers relay `r` watched loosely when `nid` crashed (liveness.py's `loose_peers`): the relays of its
        stage and the stages next to it, `nid` included, that it does not work with, and the data nodes if it is of
        a middle stage."""
        if not self.options.loose_per_peer_s:
            return 0
        k = self.stage[r]
        data = len([d for d in self.data if d not in self.dead or d == nid]) if 0 < k < self.S - 1 else 0
        at = self._at_work(r)
        return data + sum(1 for x in self._near(k, r, nid) if x not in at and r not in self._next_hops(x))

    def _near(self, k: int, me: str, crashed: str) -> list[str]:
        """The relays of stage `k` and the stages next to it but `me`: the live ones and `crashed`."""
        return [x for x, s in sorted(self.stage.items()) if abs(s - k) <= 1 and x != me and x not in self.data
                and (x not in self.dead or x == crashed)]

    def _next_hops(self, x: str) -> set[str]:
        """The next hops node `x`'s flows send units to."""
        return {j for v in self.nodes[x].rec.out.values() for j, u in v.items() if u}

    def _at_work(self, r: str) -> set[str]:
        """The peers relay `r` works with now, as it sees them (the daemon's `at_work`, runtime/node/node.py, but
        the previous hops of its flows): its next hops, its microbatches' previous and next hops, its aggregation's
        waits and its stage's group in aggregations begun and not stepped, from its second aggregation on
        (protocol/phasewaits.py)."""
        return (self._next_hops(r) | self.nodes[r].rec.peers_in_flight()
                | peers_at_work(self.nodes[r].phases, self.now, self.stage[r]))

    def _idle_watchers(self, nid: str) -> tuple[str, ...]:
        """The live relays of relay `nid`'s stage and the stages next to it that do not work with it now: no flow
        between them, no microbatch of one held by the other as its previous or next hop, no aggregation begun and
        not stepped, or phase wait, that names it (the daemon's `at_work`, runtime/node/node.py)."""
        work = self._next_hops(nid)
        return tuple(r for r in self._near(self.stage[nid], nid, nid) if r not in work and nid not in self._at_work(r))

    def _comes_to_work(self, r: str, nid: str) -> None:
        """Relay `r` sends crashed relay `nid` a message or a unit of flow: if it was not told yet and watched `nid`
        loosely, it watches it closely from now and learns of it DETECT_S later (liveness.py's `close_since`)."""
        pending = self.idle_watchers.get(nid, {})
        if pending.get(r) is False:
            pending[r] = True
            self._push(self.now + self.options.detect_s, Gone(nid, (r,), late=True))

    # ---------------------------------------------------------------- the run's start and its stops (`run`)
    def _begin(self, until: float | None) -> int | None:
        """Start the machines at the first call of `run`; with `until`, the token of the halt set at that time."""
        if not self._begun:
            self._begun = True
            if self.machines:  # the flows form first; each data node opens iteration 0 once its own formed
                if self._pooling_starts():
                    self._start_pooling()  # (pooling.py: each node's flow machine starts once it hands over)
                elif self._scaling_starts():
                    self._start_scaled()  # (scaled.py: each node's flow machine starts once formation is over)
                for nid in sorted(self.nodes):
                    if nid not in self.dead and nid not in self.pooled and nid not in self.scaled:
                        self._apply_flow(nid, self._make_flow(nid, joined=False).start(self.now))
                for nid in sorted(self.nodes):
                    if nid not in self.data:
                        self._started.add(nid)
                        self._apply(nid, self.nodes[nid].rec.start(self.now))
            else:
                for nid in sorted(self.nodes):
                    self._apply(nid, self.nodes[nid].rec.start(self.now))
            for d in self.data:
                self._leader_event(d, self.nodes[d].leader.start(self.now))
        if until is None:
            return None
        self._token += 1
        self._push(until, Halt(self._token))
        return self._token

    # ---------------------------------------------------------------- hooks: a change at the current time
    def crash_relay(self, nid: str) -> None:
        """`nid` crashes now (module docstring)."""
        if nid in self.data:
            raise ValueError(f"{nid} is a data node: crash_relay crashes relays")
        self._crash(nid)

    def leave_relay(self, nid: str) -> None:
        """`nid` announces its graceful leave now (module docstring)."""
        if nid in self.data or nid not in self.nodes:
            raise ValueError(f"{nid} is not a relay of the run")
        if nid in self.dead or nid in self.leaving:
            return
        t = self.nodes[nid].phases.applied  # the iteration in flight (or about to open): its last one
        self.leaving[nid] = t
        self.nodes[nid].rec.leave_after(t)
        self._push(self.now + self.leave_wait_s, LeaveWaited(nid, t))
        self._maybe_goodbye(nid)

    def join_relay(self, stage: int, loc: str, cap: int = MICROBATCHES) -> str:
        """A relay started with `--stage stage` at location `loc` joins now; returns its id (module docstring)."""
        if not 0 <= stage < self.S:
            raise ValueError(f"stage {stage}: the run has stages 0..{self.S - 1}")
        if loc not in set(self.net.loc.values()) | {loc for pair in self.net.lat for loc in pair}:
            raise ValueError(f"unknown location {loc!r}")
        self.joiner_count += 1
        nid = f"k{stage}~{self.joiner_count}"
        self.net.loc[nid] = loc
        self.join_stats["asked"] += 1
        members = [p for p in self._known(stage) if p not in self.dead and p not in self.leaving]
        # the iteration in flight, or the next once the leader sent its BEGIN AGGREGATION (joining.py)
        start = max((self._placement_iteration(d) for d in self._live_data()), default=self._iteration_now())
        if not members:  # the stage's checkpoint: ready from that iteration
            self.join_stats["placed"] += 1
            self.join_stats["loaded"] += 1
            self.join_stats["in"] += 1
            self._add_node(nid, stage, cap, applied=start)
            for d, pm in self.placement.items():
                if d not in self.dead:
                    pm.add_member(nid, stage)
            return nid
        jm = JoinerMachine(JoinerConfig(nid, cap, self._stage_costs(nid), link_costs=self._join_links(nid)))
        self.joiners[nid] = jm
        self._joiner_cap[nid] = cap
        src = min(members, key=lambda p: (self._rtt_ms(nid, p), p))
        a = Assignment(0, nid, stage, src, start)
        self._apply_join(nid, "joiner", jm.on_message(self.now, src, a))
        self._take_assignment(nid, a)
        return nid

    # ---------------------------------------------------------------- leaving
    def _maybe_goodbye(self, nid: str) -> None:
        """A leaving relay says Goodbye once its CAN TAKE of its last iteration is sent (or no data node is left)."""
        t = self.leaving.get(nid)
        if t is None or nid in self.dead:
            return
        ph = self.nodes[nid].phases
        if max(ph.can_take_sent, default=-1) >= t or not self._live_data():
            self._goodbye(nid)

    def _leave_timeout(self, nid: str, t: int) -> None:
        if self.leaving.get(nid) == t and nid not in self.dead:
            self._goodbye(nid)

    def _goodbye(self, nid: str) -> None:
        """Goodbye: the relay's machines stop and every node forgets it at once."""
        del self.leaving[nid]
        self.dead.add(nid)
        self.crashed_at[nid] = self.now  # (no longer heard)
        self.left.append((self.now, nid))
        if self.trace is not None:
            self.trace.append(("left", self.now, nid))
        self._allreduce_crash(nid)
        self._schedule_reflow()
        self._push(self.now, Gone(nid))

    def _ready_for(self, nid: str, t: int) -> bool:
        """A relay counts for iteration `t`: not leaving before it (the daemon's `Peers.groups`)."""
        return self.leaving.get(nid, t) >= t

    # ---------------------------------------------------------------- the pause
    def empty_stages(self, t: int) -> list[int]:
        """Stages with no relay ready for iteration `t`: none known (not reported gone) and not leaving before it."""
        return [k for k in range(self.S) if not any(self._ready_for(r, t) for r in self._known(k))]

    def _open_or_pause(self, nid: str, t: int) -> None:
        """The aggregation phase opens `t` at data node `nid`: open it, or pause while a stage is empty."""
        if self.options.pause_empty and self.empty_stages(t):
            if self._ready_at_open and not self._aggregating():
                self._ready_joiners_at_open()  # (they are ready for t: they may serve the empty stage)
            empty = self.empty_stages(t)
            if empty:
                old = self.paused.get(nid)
                self.paused[nid] = Pause(t, tuple(empty), old.since if old is not None else self.now)
                return
        self._apply(nid, self.nodes[nid].rec.open_iteration(self.now, t))

    def _recheck_paused(self) -> None:
        """A relay came in: every paused data node whose stages are all served now opens its iteration."""
        for nid in sorted(self.paused):
            p = self.paused.get(nid)  # (an open below may bring joiners in, and this check runs again inside it)
            if p is None:
                continue
            if nid in self.dead:
                del self.paused[nid]
            elif not self.empty_stages(p.iteration):
                del self.paused[nid]
                self.pauses.append((nid, p.iteration, p.since, self.now))
                self._apply(nid, self.nodes[nid].rec.open_iteration(self.now, p.iteration))

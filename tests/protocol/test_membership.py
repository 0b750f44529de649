"""Joining at the bottleneck (protocol/membership.py): placement functions and simulator runs.

The simulator runs relays (stubs that answer the utilization query and serve
state), joiners (`JoinerMachine`) and the leader's `MembershipMachine`; the
iteration counter is a global clock (`ITER_S` per iteration), standing in for
the aggregation phase.  After every event the harness checks that nobody was
asked for state while itself joining, and that every Assignment names a live,
serving source.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.leader import LeaderConfig, LeaderMachine
from gwtf_node.protocol.membership import (
    Candidate, JoinerConfig, JoinerMachine, MembershipConfig, MembershipMachine, StageLoad, choose_stage,
    MAX_MISSED_ROUNDS, known_links, place, stage_loads,
)
from gwtf_node.protocol.placement import DATA
from gwtf_node.protocol.messages import (
    Assignment, HeartbeatAck, JoinRequest, LeaderHeartbeat, RequestVote, StageState, StageStateRequest,
    UtilizationQuery, UtilizationReport, Vote,
)
from gwtf_node.sim.engine import Simulator

ITER_S = 3.0
INF = math.inf


def report(stage: int, flows: int, capacity: int, serving: bool = True) -> UtilizationReport:
    return UtilizationReport(query_id=1, stage=stage, flows=flows, capacity=capacity, serving=serving)


# ---- pure placement ---------------------------------------------------------


def test_utilization_counts_joining_capacity_but_not_their_flows() -> None:
    loads = stage_loads([report(0, 4, 4), report(0, 2, 4), report(1, 3, 6)], [(1, 3), (0, 0)], 3)
    assert (loads[0].flows, loads[0].capacity) == (6, 8)
    assert (loads[1].flows, loads[1].capacity) == (3, 9)
    assert loads[2].utilization == math.inf  # a stage with no capacity at all is the worst bottleneck


def test_highest_capacity_goes_to_most_utilized_and_utilization_is_re_evaluated() -> None:
    # Figure 3 of the paper: stages of capacity 2, 3, 4 carrying 2 flows each
    loads = {0: StageLoad(2, 2), 1: StageLoad(2, 3), 2: StageLoad(2, 4)}
    sources = {0: ["a"], 1: ["b"], 2: ["c"]}
    reports = {"a": report(0, 2, 2), "b": report(1, 2, 3), "c": report(2, 2, 4)}
    cands = [Candidate("small", 1, (1.0, 1.0, 1.0)), Candidate("big", 5, (1.0, 1.0, 1.0)),
             Candidate("mid", 1, (1.0, 1.0, 1.0))]
    got = [(c.node, s) for c, s, _ in place(cands, loads, sources, reports)]
    # big -> stage 0 (u=1, then 2/7); stage 1 (u=2/3) is now the bottleneck: mid -> 1 (then 2/4);
    # stages 1 and 2 tie at 2/4 with capacity 4 and equal costs: the lower index
    assert got == [("big", 0), ("mid", 1), ("small", 1)]


def test_a_stage_the_candidate_cannot_reach_or_without_a_source_takes_nobody() -> None:
    loads = {0: StageLoad(9, 1), 1: StageLoad(1, 9), 2: StageLoad(5, 5)}
    c = Candidate("x", 2, (INF, 1.0, 1.0))
    assert choose_stage(c, loads, [0, 1, 2]) == 2
    assert choose_stage(c, loads, [0, 1]) == 1
    assert choose_stage(Candidate("y", 2, (INF, INF, INF)), loads, [0, 1, 2]) is None
    placed = place([c], loads, {1: ["b"]}, {"b": report(1, 1, 9)})  # stage 2 has no source
    assert [(p.node, s, src) for p, s, src in placed] == [("x", 1, "b")]


def test_sources_spread_over_the_stage_members() -> None:
    loads = {0: StageLoad(10, 10)}
    reports = {"a": report(0, 5, 5), "b": report(0, 1, 5)}
    cands = [Candidate(f"c{i}", 1, (1.0,)) for i in range(4)]
    srcs = [src for _, _, src in place(cands, loads, {0: ["a", "b"]}, reports)]
    assert srcs == ["b", "a", "b", "a"]  # fewest downloads first, then the least utilized


def _round(m: MembershipMachine, now: float, reports: dict[str, UtilizationReport]) -> list:
    out = m.on_timer(now, "membership.round")
    for n, r in reports.items():
        out += m.on_message(now, n, UtilizationReport(m.query_id, r.stage, r.flows, r.capacity, r.serving))
    return out + m.on_timer(now + 1.0, "membership.collect")


def test_known_links_average_both_ends_and_merge_the_data_nodes() -> None:
    reports = {"a": UtilizationReport(1, 0, 0, 1, True, (("d0", 2.0), ("b", 4.0))),
               "b": UtilizationReport(1, 1, 0, 1, True, (("a", 6.0), ("d1", 1.0), ("x", INF)))}
    links = known_links(reports, {"c": (("d0", 3.0), ("b", 2.0))}, ("d0", "d1"))
    assert links == {(DATA, "a"): 2.0, ("a", "b"): 5.0, (DATA, "b"): 1.0, (DATA, "c"): 3.0, ("b", "c"): 2.0}


def test_the_leader_places_joiners_by_the_link_costs_it_is_told() -> None:
    """Two joiners, one member per stage: either split makes the max flow 2; the split c1 -> 0, c2 -> 1 routes
    the second unit over cheap links (d-c1-b-d and d-a-c2-d, 3 each), the other over 50-cost ones.  The
    joiners' reported stage costs point the other way, so a leader without link costs picks the dear split."""
    near = {("d", "a"): 1, ("d", "b"): 1, ("a", "b"): 1, ("d", "c1"): 1, ("d", "c2"): 1, ("c1", "b"): 1,
            ("a", "c2"): 1, ("c1", "c2"): 50, ("a", "c1"): 50, ("b", "c2"): 50}
    cost = {**near, **{(y, x): c for (x, y), c in near.items()}}

    def told(node: str, peers: str) -> tuple[tuple[str, float], ...]:
        return tuple((p, float(cost[(node, p)])) for p in peers.split())

    def place(with_links: bool) -> dict[str, int]:
        m = MembershipMachine(MembershipConfig("d", 2, data_nodes=("d",)), term=1, iteration=3)
        m.add_member("a", 0)
        m.add_member("b", 1)
        m.on_message(0.0, "c1", JoinRequest(1, (5.0, 1.0), told("c1", "d a b c2") if with_links else ()))
        m.on_message(0.0, "c2", JoinRequest(1, (1.0, 5.0), told("c2", "d a b c1") if with_links else ()))
        out = m.on_timer(0.0, "membership.round")
        for n, s, peers in (("a", 0, "d b"), ("b", 1, "a d")):
            out += m.on_message(0.0, n, UtilizationReport(m.query_id, s, 1, 1, True,
                                                          told(n, peers) if with_links else ()))
        return {e.msg.node: e.msg.stage for e in out if type(e) is Send and type(e.msg) is Assignment}

    assert place(with_links=True) == {"c1": 0, "c2": 1}
    assert place(with_links=False) == {"c1": 1, "c2": 0}


def test_joining_members_are_never_sources_and_silent_ones_are_not_either() -> None:
    m = MembershipMachine(MembershipConfig("d0", 2), term=3, iteration=7)
    for n, s in [("a", 0), ("b", 0), ("c", 1), ("dead", 1)]:
        m.add_member(n, s)
    m.on_message(0.0, "x", JoinRequest(4, (1.0, 1.0)))
    m.on_message(0.0, "y", JoinRequest(2, (1.0, 1.0)))
    out = _round(m, 0.0, {"a": report(0, 3, 3, serving=False), "b": report(0, 3, 3), "c": report(1, 1, 3)})
    sent = {(e.to, e.msg) for e in out if type(e) is Send and type(e.msg) is Assignment}
    # stage capacities 6 (a joining, b) and 3 (c; "dead" is silent): x (4) to stage 1 and y (2) to stage 0
    # make the max flow 7, where water-filling (x to the more utilized stage 0) would make it 5
    ax = Assignment(term=3, node="x", stage=1, download_from="c", start_iteration=8)
    ay = Assignment(term=3, node="y", stage=0, download_from="b", start_iteration=8)
    assert sent == {("x", ax), ("c", ax), ("y", ay), ("b", ay)}
    # a lost Assignment is sent again; an invalid request is ignored and counted
    assert m.on_message(1.0, "x", JoinRequest(4, (1.0, 1.0))) == [Send("x", ax)]
    assert m.on_message(1.0, "z", JoinRequest(0, (1.0, 1.0))) == []
    assert m.on_message(1.0, "z", JoinRequest(1, (1.0,))) == [] and m.invalid_requests == 2
    # next round: x still joining (placed, reported not serving): never a source for w
    m.on_message(5.0, "w", JoinRequest(1, (1.0, INF)))
    out = _round(m, 5.0, {"a": report(0, 3, 3, serving=False), "b": report(0, 3, 3),
                          "x": report(0, 0, 4, serving=False)})
    (a,) = {e.msg for e in out if type(e) is Send and type(e.msg) is Assignment}
    assert (a.node, a.stage, a.download_from) == ("w", 0, "b")


# ---- simulator --------------------------------------------------------------


@dataclass
class Relay:
    """A serving stage member: answers the utilization query and serves its state."""

    stage: int
    capacity: int
    flows: int
    state_requests: list[str] = field(default_factory=list)

    def start(self, now: float) -> list:
        return []

    def on_timer(self, now: float, key: str) -> list:
        return []

    def on_message(self, now: float, sender: str, msg: object) -> list:
        if type(msg) is UtilizationQuery:
            return [Send(sender, UtilizationReport(msg.query_id, self.stage, self.flows, self.capacity, True))]
        if type(msg) is StageStateRequest:
            self.state_requests.append(sender)
            return [Send(sender, StageState(msg.stage, int(now // ITER_S), "sha", None))]
        return []


class World:
    """Data nodes (leader election + membership), relays and joiners in one simulator."""

    def __init__(self, seed: int, stages: list[list[tuple[int, int]]], data_nodes: int = 1) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        delays: dict[tuple[str, str], float] = {}
        self.sim = Simulator(lambda a, b: delays.setdefault((a, b), self.rng.uniform(0.005, 0.05)))
        self.num_stages = len(stages)
        self.relays: dict[str, Relay] = {}
        for s, members in enumerate(stages):
            for i, (cap, flows) in enumerate(members):
                nid = f"r{s}.{i}"
                self.relays[nid] = Relay(s, cap, flows)
                self.sim.add(nid, _Checked(self, nid, self.relays[nid]))
        self.data_ids = tuple(f"d{i}" for i in range(data_nodes))
        self.data: dict[str, DataNode] = {}
        for d in self.data_ids:
            lm = LeaderMachine(LeaderConfig(d, self.data_ids), random.Random(f"{seed}/{d}"))
            self.data[d] = DataNode(self, d, lm)
            self.sim.add(d, _Checked(self, d, self.data[d]))
        self.joiners: dict[str, JoinerMachine] = {}
        self.assignments: list[tuple[float, Assignment]] = []

    def add_joiner(self, nid: str, capacity: int, costs: tuple[float, ...]) -> JoinerMachine:
        j = JoinerMachine(JoinerConfig(nid, capacity, costs, retry_s=2.0))
        self.joiners[nid] = j
        self.sim.add(nid, _Checked(self, nid, j))
        return j

    def iteration(self, now: float) -> int:
        return int(now // ITER_S)

    def leader(self, now: float) -> str | None:
        """The DHT record of the leader: the data node acting as leader now."""
        found = [d for d, n in self.data.items() if d not in self.sim.dead and n.lm.is_leader(now)]
        return found[0] if found else None

    def serving(self, nid: str) -> bool:
        if nid in self.sim.dead:
            return False
        return nid in self.relays or (nid in self.joiners and self.joiners[nid].serving)

    def start(self) -> None:
        self.sim.start_all()

    def run(self, until: float) -> None:
        self.sim.run_until(until)
        for j in self.joiners.values():  # the iteration boundary reaches idle joiners too
            j.on_iteration(self.iteration(self.sim.now))


class DataNode:
    """How a daemon composes the two machines: membership runs only while this node acts as leader."""

    def __init__(self, world: World, nid: str, lm: LeaderMachine) -> None:
        self.world, self.nid, self.lm = world, nid, lm
        self.mm: MembershipMachine | None = None

    def start(self, now: float) -> list:
        return self.lm.start(now)

    def _membership(self, now: float) -> list:
        if not self.lm.is_leader(now):
            self.mm = None
            return []
        if self.mm is not None and self.mm.term == self.lm.term:
            self.mm.set_iteration(self.world.iteration(now))
            return []
        self.mm = MembershipMachine(MembershipConfig(self.nid, self.world.num_stages, 2.0, 0.5), self.lm.term,
                                    self.world.iteration(now))
        for r, relay in sorted(self.world.relays.items()):  # stage members from the DHT records
            self.mm.add_member(r, relay.stage)
        return self.mm.start(now)

    def on_timer(self, now: float, key: str) -> list:
        out = self.lm.on_timer(now, key) if key.startswith("leader.") else []
        out += self._membership(now)
        if key.startswith("membership.") and self.mm is not None:
            out += self.mm.on_timer(now, key)
        return out

    def on_message(self, now: float, sender: str, msg: object) -> list:
        if type(msg) in (RequestVote, Vote, LeaderHeartbeat, HeartbeatAck):
            return self.lm.on_message(now, sender, msg) + self._membership(now)
        out = self._membership(now)
        if self.mm is not None:
            out += self.mm.on_message(now, sender, msg)
        return out


@dataclass
class _Checked:
    world: World
    nid: str
    m: object

    def _sync(self, now: float) -> list:
        j = self.world.joiners.get(self.nid)
        if j is None:
            return []
        j.on_iteration(self.world.iteration(now))
        return j.set_leader(now, self.world.leader(now))

    def _out(self, now: float, effects: list) -> list:
        for e in effects:
            if type(e) is Send and type(e.msg) is Assignment and e.to == e.msg.node:
                a = e.msg
                assert self.world.serving(a.download_from), \
                    f"seed {self.world.seed}: {a.node} told to download from {a.download_from}, not serving"
                assert a.start_iteration == self.world.iteration(now) + 1
                self.world.assignments.append((now, a))
        return effects

    def start(self, now: float) -> list:
        return self._out(now, self._sync(now) + self.m.start(now))

    def on_timer(self, now: float, key: str) -> list:
        return self._out(now, self._sync(now) + self.m.on_timer(now, key))

    def on_message(self, now: float, sender: str, msg: object) -> list:
        if type(msg) is StageStateRequest:
            assert self.world.serving(self.nid), f"seed {self.world.seed}: {sender} asked {self.nid} for state " \
                                                 "while it is joining"
        out = self._sync(now) + self.m.on_message(now, sender, msg)
        if type(msg) is StageStateRequest and self.nid in self.world.joiners:  # the daemon's part
            out.append(Send(sender, StageState(msg.stage, self.world.iteration(now), "sha", None)))
        if type(msg) is StageState and self.nid in self.world.joiners:
            self.world.joiners[self.nid].state_loaded()
        return self._out(now, out)


def _stages(rng: random.Random) -> list[list[tuple[int, int]]]:
    """4 stages of 3 relays (capacity, flows), with different utilizations."""
    return [[(c := rng.randint(1, 4), rng.randint(0, c)) for _ in range(3)] for _ in range(4)]


def test_joiners_arriving_one_by_one_never_download_from_a_joiner() -> None:
    """Rounds run while earlier newcomers are still joining: those report serving=False (and are
    less utilized than anyone), so a wrong source rule would pick them; the harness would fail."""
    rng = random.Random(5)
    w = World(5, _stages(rng))
    w.start()
    for i in range(20):
        t = 3.0 + 0.7 * i
        w.run(t)
        j = w.add_joiner(f"j{i:02d}", rng.randint(1, 4), tuple(rng.uniform(1, 10) for _ in range(4)))
        w.sim._apply(j.cfg.node_id, j.start(t))
    w.run(60.0)
    assert len(w.assignments) == 20 and all(j.serving for j in w.joiners.values())
    assert {a.download_from for _, a in w.assignments} - set(w.relays)  # served newcomers were sources


@pytest.mark.parametrize("seed", range(3))
def test_twenty_nodes_joining_at_once_all_get_a_stage_from_a_serving_source(seed: int) -> None:
    rng = random.Random(seed)
    w = World(seed, _stages(rng))
    w.sim.kill("r1.0")  # a stage member that crashed: never a source
    for i in range(20):
        w.add_joiner(f"j{i:02d}", rng.randint(1, 4), tuple(rng.uniform(1, 10) for _ in range(4)))
    w.start()
    w.run(30.0)
    assigned = {a.node: a for _, a in w.assignments}
    assert set(assigned) == set(w.joiners), f"seed {seed}: unplaced {set(w.joiners) - set(assigned)}"
    assert all(j.assignment == assigned[n] for n, j in w.joiners.items())
    assert all(a.download_from in w.relays and a.download_from != "r1.0" for a in assigned.values())
    assert all(j.serving for j in w.joiners.values())
    # highest capacity first: within the round, capacities are placed in non-increasing order
    first_round = [a for t, a in w.assignments if t == w.assignments[0][0]]
    caps = [w.joiners[a.node].cfg.capacity for a in first_round]
    assert caps == sorted(caps, reverse=True)


def test_waves_of_joiners_newcomers_become_sources_once_serving() -> None:
    rng = random.Random(11)
    w = World(11, [[(2, 2)], [(4, 1)]])  # stage 0 is the bottleneck, one member each
    w.start()
    for wave in range(3):
        t = 5.0 + wave * 12.0
        w.run(t)
        for i in range(4):
            j = w.add_joiner(f"j{wave}.{i}", rng.randint(1, 3), (1.0, 1.0))
            w.sim._apply(j.cfg.node_id, j.start(t))  # a node starting in a running simulator
    w.run(60.0)
    sources = {a.download_from for _, a in w.assignments}
    assert len(w.assignments) == 12 and all(j.serving for j in w.joiners.values())
    assert sources - set(w.relays), "later waves download from earlier newcomers that serve"
    # the bottleneck got the first newcomer
    assert w.assignments[0][1].stage == 0


def test_the_leader_crashes_while_nodes_join_and_the_next_leader_places_them() -> None:
    rng = random.Random(21)
    w = World(21, _stages(rng), data_nodes=3)
    w.start()
    w.run(10.0)
    old = w.leader(w.sim.now)
    assert old is not None
    for i in range(6):
        j = w.add_joiner(f"j{i}", rng.randint(1, 4), tuple(rng.uniform(1, 10) for _ in range(4)))
        w.sim._apply(j.cfg.node_id, j.start(10.0))
    w.run(10.3)
    w.sim.kill(old)  # before its first round ends, or right after: both must work out
    w.run(40.0)
    new = w.leader(w.sim.now)
    assert new not in (None, old)
    assert all(j.assignment is not None and j.serving for j in w.joiners.values())
    assert {a.node for _, a in w.assignments} == set(w.joiners)


def _volunteer_round(m: MembershipMachine, now: float, silent: set[str] = frozenset()) -> dict[str, int]:
    """One round of the volunteer's swarm: stage 0 has one relay at 100 % (3 of 3), stage 1 two at 33 % (1 of 3
    each); the members in `silent` do not answer the query.  The stages the round assigned."""
    out = m.on_timer(now, "membership.round")
    for n, s, flows in (("a", 0, 3), ("b", 1, 1), ("c", 1, 1)):
        if n not in silent:
            out += m.on_message(now, n, UtilizationReport(m.query_id, s, flows, 3, True))
    out += m.on_timer(now + 1.0, "membership.collect")
    return {e.msg.node: e.msg.stage for e in out if type(e) is Send and type(e.msg) is Assignment}


def _volunteer_swarm() -> MembershipMachine:
    m = MembershipMachine(MembershipConfig("d0", 2, data_nodes=("d0",)), term=1, iteration=12)
    for n, s in (("a", 0), ("b", 1), ("c", 1)):
        m.add_member(n, s)
    m.on_message(0.0, "x", JoinRequest(3, (1.0, 1.0)))
    return m


def test_the_newcomer_goes_to_the_bottleneck_stage() -> None:
    """Stage 0: 1 relay at 100 %; stage 1: 2 relays at 33 %: a `--stage auto` relay is placed on stage 0."""
    assert _volunteer_round(_volunteer_swarm(), 0.0) == {"x": 0}


def test_a_round_without_the_bottlenecks_reports_places_nobody() -> None:
    """The lone relay of the bottleneck stage answers late (after report_timeout_s): that round cannot see stage
    0's load nor use it as a source, so it places nobody, instead of sending the newcomer to stage 1."""
    m = _volunteer_swarm()
    assert _volunteer_round(m, 0.0, silent={"a"}) == {} and m.rounds_held == 1 and "x" in m.waiting
    assert _volunteer_round(m, 5.0) == {"x": 0}
    m = _volunteer_swarm()  # a member silent for MAX_MISSED_ROUNDS is forgotten: the wait is bounded
    got = [_volunteer_round(m, 5.0 * k, silent={"a"}) for k in range(MAX_MISSED_ROUNDS)]
    assert got[:-1] == [{}] * (MAX_MISSED_ROUNDS - 1) and got[-1] == {"x": 1}  # stage 0 has no source left

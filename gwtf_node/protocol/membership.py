"""Joining at the bottleneck (section V-B of the GWTF paper): the leader's side and the newcomer's.

Theory of operation
-------------------
A *candidate* (a node started with ``--stage auto``) finds the leader through
the DHT and sends it a `JoinRequest`: its capacity (microbatches it can hold)
and its measured cost to each relay stage (+inf: it cannot serve that stage,
e.g. no link to it).  It re-sends every ``retry_s`` until it is placed, to
whichever node is leader then (`JoinerMachine`).

The leader (`MembershipMachine`, run by the data node while
`LeaderMachine.is_leader(now)` holds) runs a *round* every
``query_interval_s``:

1. Utilization query.  The paper floods the query stage by stage, each node
   adding its numbers and forwarding it.  We model the flood as a
   `UtilizationQuery` to every known stage member (from the DHT records and
   the assignments the leader made) and one `UtilizationReport` back from
   each: stage, flows through the reporter, capacity, and whether it is
   serving or still joining.  One hop instead of S hops gives the same sums
   with less delay, and a member's silence is information: a member that does
   not answer within ``report_timeout_s`` is not live for this round.
2. Per stage: utilization = (sum of flows of its serving members) / (sum of
   capacity of its serving members + capacity of its members still joining).
   Joining members count in the capacity because they will serve from their
   start iteration on: without them every round would see the same
   bottleneck and pile all candidates onto it.
3. Placement (`place_by_search`): the stages of the waiting candidates are
   chosen by the local search of protocol/placement.py, which minimizes the
   time to push a batch (C / F^2: F the maximum flow, C its least cost) over
   the leader's snapshot (each stage's capacity, each candidate's capacity
   and cost to each stage), starting from two rules and never ending worse
   than either: water-filling (`place`: candidates in decreasing capacity,
   each to the most utilized stage it can serve that has a state source, with
   utilization re-evaluated after every placement; ties: less capacity, the
   candidate's cheaper stage, lower index) and the paper's rank matching (the
   highest capacity to the most utilized stage, the second to the second).
   The search spends at most `placement_evaluations` evaluations per round.
   A swarm forming from scratch is placed as a whole instead (`_place`), and
   the candidates of a stage that was silent wait (`silent_stages`).
4. State source: a member of the stage that answered this round, reports
   that it serves, and is not a newcomer the leader placed and has not yet
   seen serving: never a node that is itself joining.  Among those the one
   with the fewest downloads handed out in this round, then the least
   utilized, then the lowest id.  A stage without such a member takes no
   candidate (nobody could hand it the weights); candidates wait.
5. Announcement: an `Assignment(term, node, stage, download_from,
   start_iteration = current iteration + 1)` to the newcomer and to its
   source.  The newcomer downloads the state the source holds after the
   current iteration's step and serves from `start_iteration` (the next
   iteration boundary), or from the first boundary after its download
   completes: the iteration in flight is not disturbed.  The leader re-sends
   the Assignment if the newcomer asks again, and forgets a newcomer that is
   not serving after ``join_timeout_s`` (it crashed while downloading; its
   reserved capacity is released).

A new leader starts with no memory of the old one's placements: newcomers
that hold an Assignment keep it (the highest term wins), answer the queries
as joining, and so count as capacity and never as sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .effects import CancelTimer, Effect, Send, SetTimer
from .messages import Assignment, JoinRequest, StageStateRequest, UtilizationQuery, UtilizationReport
from .placement import (DATA, DEFAULT_MAX_EVALUATIONS, Candidate, Member, PlacementProblem, StageLoad,
                        rank_matching, search_stages, told_links)
from .swarmplace import DEFAULT_SWARM_EVALUATIONS, place_new_swarm

INITIAL = ""  # download_from of a placement into an empty stage before any step: the manifest's initial weights
ROUND_TIMER = "membership.round"
COLLECT_TIMER = "membership.collect"
RETRY_TIMER = "membership.join_retry"
MAX_MISSED_ROUNDS = 3  # a member silent for this many rounds in a row is forgotten
MAX_LINKS_REPORTED = 1024  # link costs in a JoinRequest or UtilizationReport (the leader's placement graph)



def link_report(costs: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """The link costs a JoinRequest (a joiner's measured links) or a UtilizationReport (a member's flow links)
    carries: (peer, cost) by peer id, at most MAX_LINKS_REPORTED of them."""
    return tuple(sorted(costs.items()))[:MAX_LINKS_REPORTED]

# ---- pure placement ---------------------------------------------------------


def stage_loads(reports: Iterable[UtilizationReport], joining: Iterable[tuple[int, int]],
                num_stages: int) -> dict[int, StageLoad]:
    """Flows and capacity per stage: serving reports count both, joining (stage, capacity) only capacity."""
    loads = {s: StageLoad() for s in range(num_stages)}
    for r in reports:
        if r.serving and r.stage in loads:
            loads[r.stage].flows += r.flows
            loads[r.stage].capacity += r.capacity
    for stage, capacity in joining:
        if stage in loads:
            loads[stage].capacity += capacity
    return loads


def choose_stage(c: Candidate, loads: Mapping[int, StageLoad], eligible: Iterable[int]) -> int | None:
    """The most utilized stage `c` can serve; ties: less capacity, cheaper for `c`, lower index."""
    options = [s for s in eligible if s < len(c.stage_costs) and math.isfinite(c.stage_costs[s])]
    if not options:
        return None
    return min(options, key=lambda s: (-loads[s].utilization, loads[s].capacity, c.stage_costs[s], s))


def choose_source(sources: Iterable[str], reports: Mapping[str, UtilizationReport],
                  downloads: Mapping[str, int]) -> str:
    """The source with the fewest downloads handed out, then the least utilized, then the lowest id."""
    def key(n: str) -> tuple:
        r = reports[n]
        return downloads.get(n, 0), (r.flows / r.capacity if r.capacity else math.inf), n
    return min(sources, key=key)


def place(candidates: Iterable[Candidate], loads: Mapping[int, StageLoad],
          sources: Mapping[int, list[str]], reports: Mapping[str, UtilizationReport]
          ) -> list[tuple[Candidate, int, str]]:
    """(candidate, stage, source) for every candidate that can be placed, highest capacity first.

    `loads` is updated in place as candidates are placed; `sources` lists the
    eligible state sources of each stage (stages without any take nobody).
    """
    placed: list[tuple[Candidate, int, str]] = []
    downloads: dict[str, int] = {}
    eligible = [s for s in sorted(loads) if sources.get(s)]
    for c in sorted(candidates, key=lambda c: (-c.capacity, c.node)):
        stage = choose_stage(c, loads, eligible)
        if stage is None:
            continue
        src = "" if sources[stage] == [INITIAL] else choose_source(sources[stage], reports, downloads)
        downloads[src] = downloads.get(src, 0) + 1
        loads[stage].capacity += c.capacity
        placed.append((c, stage, src))
    return placed


def known_links(reports: Mapping[str, UtilizationReport], candidate_links: Mapping[str, Iterable[tuple[str, float]]],
                data_nodes: Iterable[str]) -> dict[tuple[str, str], float]:
    """The link costs the leader was told (members' reports, candidates' requests), keyed by sorted pair; the
    data nodes are one side of the placement graph (`DATA`), so their links are averaged per node.  A link
    reported by both ends costs the mean of the two."""
    told = [(n, r.link_costs) for n, r in sorted(reports.items())] + sorted(candidate_links.items())
    return told_links(told, {d: DATA for d in data_nodes})


def place_by_search(candidates: Iterable[Candidate], loads: Mapping[int, StageLoad],
                    sources: Mapping[int, list[str]], reports: Mapping[str, UtilizationReport],
                    max_evaluations: int = DEFAULT_MAX_EVALUATIONS, *, members: Sequence[Member] = (),
                    links: Mapping[tuple[str, str], float] | None = None) -> list[tuple[Candidate, int, str]]:
    """`place`, with the stages chosen by the local search of protocol/placement.py.

    The starts are water-filling (`place`) and the paper's rank matching; the
    snapshot is what the leader holds: each stage's members (`members`: serving
    and joining, the same capacity as `loads`), each candidate's reported cost
    to each stage and the link costs it was told (`links`, from `known_links`).
    With links, the search evaluates the routing's exact min-cost flow over
    them; without (no member reported any), every link costs the mean of the
    candidates' finite stage costs and no stage is preferred for it.  Sources
    are then chosen as `place` does, highest capacity first.
    """
    eligible = [s for s in sorted(loads) if sources.get(s)]
    num_stages = max(loads, default=-1) + 1
    cands = []
    for c in sorted(candidates, key=lambda c: (-c.capacity, c.node)):
        costs = tuple(c.stage_costs[s] if s in eligible and s < len(c.stage_costs) else math.inf
                      for s in range(num_stages))
        if any(math.isfinite(x) for x in costs):
            cands.append(Candidate(c.node, c.capacity, costs))
    if not cands:
        return []
    waterfill = {c.node: s for c, s, _src in place(cands, {s: StageLoad(ld.flows, ld.capacity)
                                                          for s, ld in loads.items()}, sources, reports)}
    ranked = rank_matching(cands, loads, eligible)
    if links and members:
        unknown = sum(links.values()) / len(links)
        problem = PlacementProblem(num_stages, tuple(m for m in members if m.capacity > 0 and 0 <= m.stage < num_stages),
                                   tuple(cands), dict(links), unknown_link_cost=unknown)
    else:
        known = [x for c in cands for x in c.stage_costs if math.isfinite(x)]
        problem = PlacementProblem(
            num_stages, tuple(Member(f"stage {s}", s, loads[s].capacity) for s in sorted(loads)
                              if loads[s].capacity > 0),
            tuple(cands), unknown_link_cost=sum(known) / len(known))
    starts = [tuple(start[c.node] for c in cands) for start in (waterfill, ranked) if len(start) == len(cands)]
    stages = search_stages(problem, starts, max_evaluations=max_evaluations)
    placed: list[tuple[Candidate, int, str]] = []
    downloads: dict[str, int] = {}
    for c, stage in zip(cands, stages):
        src = "" if sources[stage] == [INITIAL] else choose_source(sources[stage], reports, downloads)
        downloads[src] = downloads.get(src, 0) + 1
        loads[stage].capacity += c.capacity
        placed.append((c, stage, src))
    return placed


def valid_request(msg: JoinRequest, num_stages: int) -> bool:
    return msg.capacity >= 1 and len(msg.stage_costs) == num_stages \
        and all(not math.isnan(x) and x >= 0 for x in msg.stage_costs)


# ---- the leader's machine ---------------------------------------------------


@dataclass(frozen=True)
class MembershipConfig:
    node_id: str
    num_stages: int
    query_interval_s: float = 5.0
    report_timeout_s: float = 1.0
    join_timeout_s: float = 120.0  # a placed newcomer not serving by then is forgotten
    placement_evaluations: int = DEFAULT_MAX_EVALUATIONS  # budget of the stage search per round
    data_nodes: tuple[str, ...] = ()  # the run's data nodes: one side of the placement graph (`known_links`)
    swarm_evaluations: int = DEFAULT_SWARM_EVALUATIONS  # budget of a whole-swarm placement (0: never one)

    def __post_init__(self) -> None:
        if not 0 < self.report_timeout_s < self.query_interval_s:
            raise ValueError(
                f"report_timeout_s is {self.report_timeout_s} and query_interval_s {self.query_interval_s}: "
                "a round must collect its reports before the next one starts (e.g. 1.0 and 5.0)"
            )
        if self.num_stages < 1:
            raise ValueError(f"num_stages is {self.num_stages}: a run has at least one relay stage")


@dataclass
class _Placed:
    assignment: Assignment
    capacity: int
    at: float


@dataclass
class MembershipMachine:
    """The leader's side of V-B: collect candidates, measure utilization, place, announce."""

    cfg: MembershipConfig
    term: int  # the leader's term, stamped on every Assignment
    iteration: int = 0  # the iteration in flight (set by the driver at each boundary)
    members: dict[str, int] = field(default_factory=dict)  # known stage members -> stage
    waiting: dict[str, Candidate] = field(default_factory=dict)
    candidate_links: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)  # from JoinRequests
    placed: dict[str, _Placed] = field(default_factory=dict)  # newcomers not yet seen serving
    query_id: int = 0
    reports: dict[str, UtilizationReport] = field(default_factory=dict)
    queried: set[str] = field(default_factory=set)
    missed: dict[str, int] = field(default_factory=dict)
    invalid_requests: int = 0
    swarm_placed: int = 0  # candidates placed by a whole-swarm placement (`_place`)
    rounds_held: int = 0  # rounds that placed nobody because a stage's members were all silent
    collecting: bool = False

    def add_member(self, node: str, stage: int) -> None:
        self.members[node] = stage

    def remove_member(self, node: str) -> None:
        """`node` crashed or left: it no longer counts in a stage's load."""
        self.members.pop(node, None)

    def set_iteration(self, iteration: int) -> None:
        self.iteration = iteration

    def start(self, now: float) -> list[Effect]:
        return [SetTimer(ROUND_TIMER, now)]

    def on_timer(self, now: float, key: str) -> list[Effect]:
        if key == ROUND_TIMER:
            return self._begin_round(now)
        if key == COLLECT_TIMER and self.collecting:
            return self._finish_round(now)
        return []

    def on_message(self, now: float, sender: str, msg: object) -> list[Effect]:
        if type(msg) is JoinRequest:
            return self._on_join(now, sender, msg)
        if type(msg) is UtilizationReport:
            return self._on_report(now, sender, msg)
        return []

    # ---- rounds ----

    def _begin_round(self, now: float) -> list[Effect]:
        effects: list[Effect] = self._finish_round(now) if self.collecting else []
        self.query_id += 1
        self.reports, self.queried, self.collecting = {}, set(self.members) | set(self.placed), True
        q = UtilizationQuery(query_id=self.query_id, term=self.term)
        effects += [Send(n, q) for n in sorted(self.queried)]
        effects += [SetTimer(COLLECT_TIMER, now + self.cfg.report_timeout_s),
                    SetTimer(ROUND_TIMER, now + self.cfg.query_interval_s)]
        if not self.queried:
            effects += self._finish_round(now)
        return effects

    def _on_report(self, now: float, sender: str, r: UtilizationReport) -> list[Effect]:
        if not self.collecting or r.query_id != self.query_id or sender not in self.queried:
            return []
        if not 0 <= r.stage < self.cfg.num_stages:
            return []
        self.reports[sender] = r
        if len(self.reports) == len(self.queried):
            return [CancelTimer(COLLECT_TIMER), *self._finish_round(now)]
        return []

    def _finish_round(self, now: float) -> list[Effect]:
        self.collecting = False
        self._update_members(now)
        joining = {n: (p.assignment.stage, p.capacity) for n, p in self.placed.items()}
        for n, r in self.reports.items():
            if not r.serving:
                joining[n] = (r.stage, r.capacity)
        serving = [r for n, r in self.reports.items() if r.serving and n not in joining]
        loads = stage_loads(serving, joining.values(), self.cfg.num_stages)
        sources: dict[int, list[str]] = {}
        for n in sorted(self.reports):
            r = self.reports[n]
            if r.serving and n not in joining:
                sources.setdefault(r.stage, []).append(n)
        if self.iteration == 0:
            # No optimizer step yet: every copy of a stage still holds the manifest's initial
            # weights, so a stage nobody serves (a swarm forming from scratch) can take
            # newcomers that build their state themselves.
            for k in range(self.cfg.num_stages):
                if k not in sources and not any(st == k for st, _c in joining.values()):
                    sources[k] = [INITIAL]
        silent = self.silent_stages()  # their load is unknown this round: who could serve one waits (step 3)
        held = {n for n, c in self.waiting.items()
                if any(s < len(c.stage_costs) and math.isfinite(c.stage_costs[s]) for s in silent)}
        self.rounds_held += bool(held)
        members = [Member(n, r.stage, r.capacity) for n, r in sorted(self.reports.items()) if n not in joining]
        members += [Member(n, st, cap) for n, (st, cap) in sorted(joining.items())]
        links = known_links(self.reports, {n: self.candidate_links.get(n, ()) for n in self.waiting},
                            self.cfg.data_nodes)
        effects: list[Effect] = []
        for c, stage, src in self._place(members, loads, sources, links, held):
            a = Assignment(term=self.term, node=c.node, stage=stage, download_from=src,
                           start_iteration=self.iteration if src == INITIAL else self.iteration + 1)
            self.placed[c.node] = _Placed(a, c.capacity, now)
            del self.waiting[c.node]
            self.candidate_links.pop(c.node, None)
            effects.append(Send(c.node, a))
            if src != INITIAL:
                effects.append(Send(src, a))
        return effects

    def _place(self, members: list[Member], loads: dict[int, StageLoad], sources: dict[int, list[str]],
               links: dict[tuple[str, str], float], held: set[str]) -> list[tuple[Candidate, int, str]]:
        """A swarm forming from scratch (iteration 0, no member yet, at least one candidate per stage, links
        told) is placed as a whole instead (`swarmplace.place_new_swarm`: every candidate's stage by the flows
        its links make possible, each data node's microbatches out and back to it), every stage's state the
        manifest's initial weights; any other round by `place_by_search`."""
        if self.iteration == 0 and not members and not held and self.cfg.swarm_evaluations > 0:
            cands = [self.waiting[n] for n in sorted(self.waiting)]
            stages = place_new_swarm(cands, {c.node: self.candidate_links.get(c.node, ()) for c in cands},
                                     self.cfg.data_nodes, self.cfg.num_stages, self.cfg.swarm_evaluations)
            if stages is not None:
                self.swarm_placed += len(cands)
                return [(c, stages[c.node], INITIAL) for c in cands]
        return place_by_search([c for n, c in self.waiting.items() if n not in held], loads, sources, self.reports,
                               self.cfg.placement_evaluations, members=members, links=links)

    def silent_stages(self) -> list[int]:
        """Stages with a known member queried in this round and no report from any of their members.

        In a round in which every known member of some stage was silent
        (`silent_stages`) the candidates that could serve that stage are not
        placed: its load is unknown and it has no source this round, so it would
        lose them to a less utilized stage although it may be the bottleneck (a
        relay whose report came after ``report_timeout_s``, e.g. on a busy
        machine).  They wait for the next round; a member silent for
        ``MAX_MISSED_ROUNDS`` rounds is forgotten, so the wait is bounded.
        """
        reported = {r.stage for r in self.reports.values()}
        return sorted({s for n, s in self.members.items() if n in self.queried and n not in self.reports}
                      - reported)

    def _update_members(self, now: float) -> None:
        for n, r in self.reports.items():
            self.members[n] = r.stage
            self.missed.pop(n, None)
            if r.serving and n in self.placed:
                del self.placed[n]  # the newcomer serves: it may be a source from now on
        for n in self.queried - set(self.reports):
            self.missed[n] = self.missed.get(n, 0) + 1
            if self.missed[n] >= MAX_MISSED_ROUNDS:
                self.members.pop(n, None)
                self.missed.pop(n)
        for n in [n for n, p in self.placed.items() if now - p.at > self.cfg.join_timeout_s]:
            del self.placed[n]  # crashed while joining: release its reserved capacity

    # ---- candidates ----

    def _on_join(self, now: float, sender: str, msg: JoinRequest) -> list[Effect]:
        if not valid_request(msg, self.cfg.num_stages):
            self.invalid_requests += 1
            return []
        if sender in self.placed:
            return [Send(sender, self.placed[sender].assignment)]  # our Assignment was lost
        self.members.pop(sender, None)  # a member that asks again lost its state: place it anew
        self.waiting[sender] = Candidate(sender, msg.capacity, tuple(msg.stage_costs))
        self.candidate_links[sender] = tuple(msg.link_costs)
        return []


# ---- the newcomer's machine -------------------------------------------------


@dataclass(frozen=True)
class JoinerConfig:
    node_id: str
    capacity: int
    stage_costs: tuple[float, ...]
    retry_s: float = 5.0
    link_costs: tuple[tuple[str, float], ...] = ()  # Eq. 1 cost of its link to each peer it measured


@dataclass
class JoinerMachine:
    """A candidate: ask the leader, keep the highest-term Assignment, fetch state, serve at the boundary."""

    cfg: JoinerConfig
    leader: str | None = None
    assignment: Assignment | None = None
    loaded: bool = False  # the driver verified the downloaded state (hash) and installed it
    iteration: int = 0
    flows: int = 0  # units through this node once serving (from its flow machine)

    def start(self, now: float) -> list[Effect]:
        return self._ask(now)

    def set_leader(self, now: float, leader: str | None) -> list[Effect]:
        changed = leader != self.leader
        self.leader = leader
        return self._ask(now) if changed and self.assignment is None else []

    def state_loaded(self) -> None:
        self.loaded = True

    def on_iteration(self, iteration: int) -> None:
        self.iteration = iteration

    @property
    def serving(self) -> bool:
        return self.loaded and self.assignment is not None and self.iteration >= self.assignment.start_iteration

    def on_timer(self, now: float, key: str) -> list[Effect]:
        return self._ask(now) if key == RETRY_TIMER and self.assignment is None else []

    def on_message(self, now: float, sender: str, msg: object) -> list[Effect]:
        if type(msg) is Assignment:
            return self._on_assignment(msg)
        if type(msg) is UtilizationQuery and self.assignment is not None:
            return [Send(sender, UtilizationReport(query_id=msg.query_id, stage=self.assignment.stage,
                                                   flows=self.flows if self.serving else 0,
                                                   capacity=self.cfg.capacity, serving=self.serving))]
        return []

    def _ask(self, now: float) -> list[Effect]:
        effects: list[Effect] = [SetTimer(RETRY_TIMER, now + self.cfg.retry_s)]
        if self.leader is not None:
            effects.append(Send(self.leader, JoinRequest(self.cfg.capacity, self.cfg.stage_costs,
                                                             self.cfg.link_costs)))
        return effects

    def _on_assignment(self, a: Assignment) -> list[Effect]:
        if a.node != self.cfg.node_id:
            return []  # we are its state source: the driver serves StageStateRequest
        current = self.assignment
        if current is not None and (a.term <= current.term or self.loaded):
            return []  # keep the newest leader's choice; once loaded, keep what we have
        self.assignment = a
        return [CancelTimer(RETRY_TIMER), Send(a.download_from, StageStateRequest(stage=a.stage))]

"""The aggregation phase with a newcomer the leader counts before the stage before it knows it, and its waits.

The leader names a new stage-1 relay in BEGIN AGGREGATION (its Hello reached
the leader first); stage 0's relay does not know it yet.  BEGIN still reaches
it and its CAN TAKE goes back, so the data node opens the next iteration
(protocol/phases.py, "Who passes a signal on").  `waiting` says what each
node waits for, and a wait past its bound is `Overdue` once, with BEGIN sent
again to the member it waits for (protocol/phasewaits.py).
"""

from __future__ import annotations

from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.messages import IterationDone
from gwtf_node.protocol.phases import WATCH_TIMER, OpenIteration, Overdue, Phases, StartStep, Wait
from gwtf_node.protocol.phasewaits import peers_at_work

GROUPS = {-1: ["d"], 0: ["r0"], 1: ["r1", "r3"]}


def _swarm(bound: float | None = None) -> dict[str, Phases]:
    nodes = {"d": Phases("d", -1, 1, applied=5, wait_bound_s=bound), "r0": Phases("r0", 0, 1, applied=5),
             "r1": Phases("r1", 1, 1, applied=5), "r3": Phases("r3", 1, 1, applied=5)}
    nodes["d"].set_leader(0.0, "d", front=["d", "r0"])
    return nodes


# what each node knows of its neighbours: r0 has not heard of r3 yet, r3 not of r0
NEXT = {"d": ["r0"], "r0": ["r1"], "r1": ["d"], "r3": ["d"]}
PREV = {"d": ["r1", "r3"], "r0": ["d"], "r1": ["r0"], "r3": []}


def _run(nodes: dict[str, Phases], eff: list, at: str, t: float = 0.0, lose: set[str] = frozenset()) -> list:
    """Deliver every message and apply every step until nothing moves; the effects that are not messages."""
    queue = [(at, e) for e in eff]
    other: list = []
    while queue:
        src, e = queue.pop(0)
        t += 0.01
        if isinstance(e, Send):
            if e.to in lose:
                continue
            ph, kind = nodes[e.to], type(e.msg).__name__
            out = (ph.on_begin(t, src, e.msg, NEXT[e.to]) if kind == "BeginAggregation"
                   else ph.on_can_take(t, src, e.msg, NEXT[e.to], PREV[e.to]) if kind == "CanTake"
                   else ph.on_ack(t, src, e.msg) if kind == "PhaseAck" else [])
            queue += [(e.to, x) for x in out]
        elif isinstance(e, StartStep):
            queue += [(src, x) for x in nodes[src].on_step_done(t, e.iteration, NEXT[src], PREV[src])]
        else:
            other.append((src, e))
    return other


def test_a_member_named_by_the_leader_gets_begin_from_a_stage_that_does_not_know_it() -> None:
    nodes = _swarm()
    d = nodes["d"]
    eff = d.report_done(0.0, IterationDone(5, 2, 4.0, 0, 0, (10, 11)))
    eff += d.maybe_begin(0.0, 5, leading=True, data_nodes=["d"], stage0=["r0"], groups=GROUPS)
    other = _run(nodes, eff, "d")
    assert 5 in nodes["r3"].stepped, "the newcomer named in BEGIN never had it"
    assert ("d", OpenIteration(6)) in other, "the data node did not open the next iteration"
    assert all(ph.waiting(1.0) == [] for ph in nodes.values())


def test_a_wait_past_its_bound_is_overdue_once_and_begin_is_sent_again() -> None:
    nodes = _swarm(bound=30.0)
    d = nodes["d"]
    eff = d.report_done(0.0, IterationDone(5, 2, 4.0, 0, 0, (10, 11)))
    assert SetTimer(WATCH_TIMER, 30.0) in eff
    eff += d.maybe_begin(0.0, 5, leading=True, data_nodes=["d"], stage0=["r0"], groups=GROUPS)
    _run(nodes, eff, "d", lose={"r0"})  # stage 0 never hears of it: the data node waits for its CAN TAKE
    assert [(w.what, w.iteration, w.peers) for w in d.waiting(1.0)] == [("can_take", 5, ("r0",))]
    assert d.check_waits(10.0) == [SetTimer(WATCH_TIMER, d.watch_at)] and d.watch_at >= 30.0
    eff = d.on_timer(40.0, WATCH_TIMER)
    over = [e for e in eff if isinstance(e, Overdue)]
    assert len(over) == 1 and over[0].wait.what == "can_take" and over[0].wait.peers == ("r0",), eff
    assert over[0].resolution
    resent = [e for e in eff if isinstance(e, Send) and e.to == "r0"]
    assert resent and type(resent[0].msg).__name__ == "BeginAggregation"
    assert not [e for e in d.on_timer(41.0, WATCH_TIMER) if isinstance(e, Overdue)], "warned twice"
    other = _run(nodes, resent, "d", t=41.0)
    assert ("d", OpenIteration(6)) in other
    assert d.waiting(42.0) == []


def test_a_report_waits_for_begin_from_the_leader() -> None:
    d = Phases("d2", -1, 1, wait_bound_s=5.0)
    d.set_leader(0.0, "d", front=[])
    d.report_done(1.0, IterationDone(3, 1, 2.0, 0, 0, (1,)))
    assert d.waiting(2.0) == [Wait("begin", 3, 1.0, ("d",))]
    eff = d.on_timer(7.0, WATCH_TIMER)
    assert any(isinstance(e, Overdue) for e in eff)
    assert any(isinstance(e, Send) and isinstance(e.msg, IterationDone) and e.to == "d" for e in eff)


def _aggregate(nodes: dict[str, Phases], iteration: int, t: float, step: bool) -> list:
    """The data node reports `iteration` and begins its aggregation; the relays step at once (`step`) or hold their
    steps (returned)."""
    d = nodes["d"]
    eff = d.report_done(t, IterationDone(iteration, 2, 4.0, 0, 0, (10, 11)))
    eff += d.maybe_begin(t, iteration, leading=True, data_nodes=["d"], stage0=["r0"], groups=GROUPS)
    if step:
        return _run(nodes, eff, "d", t)
    held: list = []
    queue = [("d", e) for e in eff]
    while queue:
        src, e = queue.pop(0)
        if isinstance(e, Send):
            ph, kind = nodes[e.to], type(e.msg).__name__
            if kind == "BeginAggregation":
                queue += [(e.to, x) for x in ph.on_begin(t, src, e.msg, NEXT[e.to])]
        elif isinstance(e, StartStep):
            held.append((src, e))
    return held


def test_a_stage_mate_is_at_work_in_an_aggregation_only_once_the_node_has_stepped_after_one() -> None:
    """`peers_at_work` (what the liveness check watches closely): the first aggregation's stage group is left out,
    the next one's is in, as long as its all-reduce runs (begun, not stepped)."""
    nodes = _swarm()
    held = _aggregate(nodes, 5, 0.0, step=False)
    assert {src for src, _ in held} == {"d", "r0", "r1", "r3"}
    assert nodes["r1"].group(5, 1) == {"r1", "r3"}  # the all-reduce's group: r3 works with r1 ...
    assert "r3" not in peers_at_work(nodes["r1"], 1.0, 1)  # ... but r1 has never stepped: watched loosely
    other = []
    for src, e in held:
        other += _run(nodes, nodes[src].on_step_done(2.0, e.iteration, NEXT[src], PREV[src]), src, 2.0)
    assert any(isinstance(e, OpenIteration) and e.iteration == 6 for _, e in other), other
    assert nodes["r1"].stats.steps == 1 and "r3" not in peers_at_work(nodes["r1"], 3.0, 1)  # (stepped: not at work)
    nodes["r1"].on_step_done(3.0, 5, NEXT["r1"], PREV["r1"])  # (a step told twice counts once)
    assert nodes["r1"].stats.steps == 1
    _aggregate(nodes, 6, 4.0, step=False)
    assert "r3" in peers_at_work(nodes["r1"], 5.0, 1)  # its second aggregation: watched closely
    assert "r1" in peers_at_work(nodes["r3"], 5.0, 1)

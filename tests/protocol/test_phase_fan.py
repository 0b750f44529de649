"""BEGIN to children, CAN TAKE to parents (protocol/phasefan.py): a bounded number of phase signals per node, and
still no data node opens the next iteration before every member of every stage applied its step."""

from __future__ import annotations

from collections import Counter

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.messages import BeginAggregation, CanTake, IterationDone, PhaseAck
from gwtf_node.protocol.phasefan import FAN_OUT, children, parents, rank
from gwtf_node.protocol.phases import OpenIteration, Phases, StartStep

STAGES, K = 3, 6  # three stages of six relays


def relay_ids(stage: int) -> list[str]:
    return [f"r{stage}_{i}" for i in range(K)]


def test_every_member_has_fan_out_parents_and_the_children_partition_them() -> None:
    prev, nxt = relay_ids(0), relay_ids(1)
    for c in nxt:
        ps = parents(c, prev, FAN_OUT)
        assert len(ps) == FAN_OUT and ps <= set(prev)
        assert parents(c, list(reversed(prev)), FAN_OUT) == ps  # the same on every node, whatever the order
    kids = {p: children(p, prev, nxt, FAN_OUT) for p in prev}
    assert Counter(c for ks in kids.values() for c in ks) == {c: FAN_OUT for c in nxt}
    assert parents("x", ["a"], FAN_OUT) == {"a"} and parents("x", [], FAN_OUT) == frozenset()


class Swarm:
    """One data node d0 (the leader) and STAGES x K relays, every Send delivered in order."""

    def __init__(self, fan_out: int | None = FAN_OUT) -> None:
        self.stage = {"d0": -1} | {r: k for k in range(STAGES) for r in relay_ids(k)}
        self.nodes = {n: Phases(n, s, STAGES - 1, fan_out=fan_out) for n, s in self.stage.items()}
        self.nodes["d0"].set_leader(0.0, "d0", front=["d0", *relay_ids(0)])
        self.sent: Counter = Counter()  # (sender, message type) -> copies
        self.stepping: set[str] = set()
        self.opened = False
        self.dead: set[str] = set()

    def near(self, n: str) -> tuple[list[str], list[str]]:
        s = self.stage[n]
        nxt = relay_ids(0) if s == -1 else ["d0"] if s == STAGES - 1 else relay_ids(s + 1)
        prv = relay_ids(STAGES - 1) if s == -1 else ["d0"] if s == 0 else relay_ids(s - 1)
        return nxt, prv

    def run(self, sender: str, eff: list) -> None:
        queue = [(sender, e) for e in eff]
        while queue:
            src, e = queue.pop(0)
            if isinstance(e, StartStep):
                self.stepping.add(src)
            if isinstance(e, OpenIteration):
                self.opened = True
            if not isinstance(e, Send) or e.to in self.dead or src in self.dead:
                continue
            self.sent[(src, type(e.msg).__name__)] += 1
            node, (nxt, prv) = self.nodes[e.to], self.near(e.to)
            if isinstance(e.msg, BeginAggregation):
                out = node.on_begin(1.0, src, e.msg, nxt)
            elif isinstance(e.msg, CanTake):
                out = node.on_can_take(1.0, src, e.msg, nxt, prv)
            elif isinstance(e.msg, PhaseAck):
                out = node.on_ack(1.0, src, e.msg)
            else:
                out = []
            queue += [(e.to, x) for x in out]

    def begin(self) -> None:
        lead = self.nodes["d0"]
        lead.report_done(0.0, IterationDone(0, 4, 1.0))
        groups = {-1: ["d0"]} | {k: relay_ids(k) for k in range(STAGES)}
        self.run("d0", lead.maybe_begin(0.0, 0, leading=True, data_nodes=["d0"], stage0=relay_ids(0),
                                        groups=groups))

    def step(self, n: str) -> None:
        self.stepping.discard(n)
        self.run(n, self.nodes[n].on_step_done(2.0, 0, *self.near(n)))

    def forget(self, gone: str) -> None:
        self.dead.add(gone)
        self.stepping.discard(gone)
        for n in self.nodes:
            if n not in self.dead:
                self.run(n, self.nodes[n].forget(3.0, gone, *self.near(n)))


def test_begin_reaches_every_member_and_the_next_iteration_waits_for_the_last_step() -> None:
    sw = Swarm()
    sw.begin()
    assert sw.stepping == set(sw.stage)  # every relay got BEGIN through its parents and steps
    last = "r2_3"  # every node steps but one relay of the last stage: nobody upstream of it may say CAN TAKE
    for n in sorted(sw.stage, key=lambda n: -sw.stage[n]):
        if n != last:
            sw.step(n)
    assert not sw.opened
    sw.step(last)
    assert sw.opened
    for k in range(STAGES):  # per relay: BEGIN to its children, CAN TAKE to its parents
        for r in relay_ids(k):
            if k < STAGES - 1:
                assert sw.sent[(r, "BeginAggregation")] == len(children(r, relay_ids(k), relay_ids(k + 1), FAN_OUT))
            assert sw.sent[(r, "CanTake")] == (1 if k == 0 else FAN_OUT)


def test_without_fan_out_every_member_hears_every_member_of_the_stage_before() -> None:
    sw = Swarm(fan_out=None)
    sw.begin()
    for n in sorted(sw.stage, key=lambda n: -sw.stage[n]):
        sw.step(n)
    assert sw.opened
    assert sw.sent[("r0_0", "BeginAggregation")] == K and sw.sent[("r1_0", "CanTake")] == K
    fan = Swarm()
    fan.begin()
    for n in sorted(fan.stage, key=lambda n: -fan.stage[n]):
        fan.step(n)
    total = sum(v for (_s, t), v in sw.sent.items() if t != "IterationDone")
    assert sum(fan.sent.values()) < total / 2  # K = 6, fan-out 2: a third of the copies and acknowledgements


def test_a_child_whose_parents_crashed_is_given_begin_by_new_parents_that_wait_for_it() -> None:
    sw = Swarm()
    child = "r2_0"
    gone = sorted(parents(child, relay_ids(1), FAN_OUT))
    # both parents crash before BEGIN reaches them: nobody passes BEGIN to the child...
    for p in gone:
        sw.dead.add(p)
    sw.begin()
    assert child not in sw.stepping
    # ...until the membership layer reports them: the parents computed without them pass it on and wait for it
    for p in gone:
        sw.dead.discard(p)
        sw.forget(p)
    assert child in sw.stepping
    new = parents(child, set(relay_ids(1)) - set(gone), FAN_OUT)
    assert all(sw.nodes[p].passed[0] >= {child} for p in new)
    for n in sorted(sw.stepping - {child}, key=lambda n: -sw.stage[n]):
        sw.step(n)
    assert not sw.opened  # its new parents wait for its CAN TAKE
    sw.step(child)
    assert sw.opened


def test_a_can_take_sent_to_a_parent_that_crashed_goes_to_the_new_parent() -> None:
    sw = Swarm()
    sw.begin()
    child = "r2_1"
    sw.step(child)
    told = set(sw.nodes[child].can_take_to[0])
    assert told == parents(child, relay_ids(1), FAN_OUT)
    gone = sorted(told)[0]
    sw.forget(gone)
    assert sw.nodes[child].can_take_to[0] == told | parents(child, set(relay_ids(1)) - {gone}, FAN_OUT)
    for n in sorted(sw.stepping, key=lambda n: -sw.stage[n]):
        sw.step(n)
    assert sw.opened


def test_a_relay_waits_for_can_take_from_its_children_only() -> None:
    sw = Swarm()
    sw.begin()
    r = max(relay_ids(1), key=lambda p: len(children(p, relay_ids(1), relay_ids(2), FAN_OUT)))
    kids = children(r, relay_ids(1), relay_ids(2), FAN_OUT)
    assert 0 < len(kids) < K
    sw.step(r)
    [wait] = [w for w in sw.nodes[r].waiting(5.0) if w.what.value == "can_take"]
    assert set(wait.peers) == kids


def test_a_relay_that_thinks_itself_a_parent_hears_the_childs_can_take() -> None:
    """p holds a stage-mate x gone (a false death: x lives, and the child c does not hold it gone), so by p's view p
    is one of c's parents and waits for c, while by c's view its parents are x and y: c's CAN TAKE goes to whoever
    passed it BEGIN too, so p does not wait for the bound of the waits (none here: it would wait forever)."""
    sw = Swarm()
    stage1, stage2 = relay_ids(1), relay_ids(2)
    c, (x, y, p) = next((c, tuple(sorted(stage1, key=lambda q: rank(c, q), reverse=True)[:3])) for c in stage2)
    assert parents(c, stage1, FAN_OUT) == {x, y}
    sw.begin()
    sw.run(p, sw.nodes[p].forget(2.0, x, *sw.near(p)))  # at p alone
    assert c in sw.nodes[p].passed[0] and sw.nodes[c].begin_from[0] >= {x, y, p}
    for n in sorted(sw.stage, key=lambda n: -sw.stage[n]):
        sw.step(n)
    assert sw.opened
    assert sw.nodes[c].can_take_to[0] == {x, y, p}

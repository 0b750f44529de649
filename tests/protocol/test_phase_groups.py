"""BEGIN AGGREGATION's groups by digest (protocol/phasegroups.py): sent in full once per receiver, by digest while
they do not change, in full again to a receiver that lacks them; every node applies the same groups either way."""

from __future__ import annotations

from collections import Counter

import pytest

from gwtf_node.protocol import codec
from gwtf_node.protocol.bounds import Context, check
from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.messages import BeginAggregation, CanTake, IterationDone, PhaseAck, PhaseKind, StageMembers
from gwtf_node.protocol.phasegroups import GROUPS_KEPT, GroupDigests, by_digest, group_digest
from gwtf_node.protocol.phases import OpenIteration, Phases, PhaseTimer, StartStep

STAGES, K = 3, 4
PEER = "12D3KooW" + "x" * 44  # a peer id's length: the groups' bytes are those of the daemon's


def relay_ids(stage: int) -> list[str]:
    return [f"{PEER}{stage}{i}" for i in range(K)]


class Swarm:
    """One data node (the leader) and STAGES x K relays; every Send delivered in order, its bytes counted."""

    def __init__(self, by_digest: bool = True) -> None:
        self.stage = {"d0": -1} | {r: k for k in range(STAGES) for r in relay_ids(k)}
        self.nodes = {n: Phases(n, s, STAGES - 1, groups_by_digest=by_digest) for n, s in self.stage.items()}
        self.nodes["d0"].set_leader(0.0, "d0", front=["d0", *relay_ids(0)])
        self.begin_bytes: Counter = Counter()  # iteration -> bytes of the BEGIN frames sent
        self.asked: Counter = Counter()  # iteration -> PhaseAck(GROUPS) sent
        self.stepping: set[str] = set()
        self.opened: set[int] = set()
        self.lose: set[tuple[str, int]] = set()  # (receiver, iteration): its first BEGIN copy is lost

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
                self.opened.add(e.iteration)
            if not isinstance(e, Send):
                continue
            msg = codec.decode(codec.encode(src, e.msg))[1]  # (through the wire format)
            node, (nxt, prv) = self.nodes[e.to], self.near(e.to)
            if isinstance(msg, BeginAggregation):
                self.begin_bytes[msg.iteration] += len(codec.encode(src, msg))
                if (e.to, msg.iteration) in self.lose:
                    self.lose.discard((e.to, msg.iteration))
                    continue
                out = node.on_begin(1.0, src, msg, nxt)
            elif isinstance(msg, CanTake):
                out = node.on_can_take(1.0, src, msg, nxt, prv)
            else:
                if msg.kind is PhaseKind.GROUPS:
                    self.asked[msg.iteration] += 1
                out = node.on_ack(1.0, src, msg)
            queue += [(e.to, x) for x in out]

    def iteration(self, t: int, relays: dict[int, list[str]] | None = None) -> None:
        lead = self.nodes["d0"]
        lead.report_done(0.0, IterationDone(t, 4, 1.0))
        groups = {-1: ["d0"]} | (relays or {k: relay_ids(k) for k in range(STAGES)})
        self.run("d0", lead.maybe_begin(0.0, t, leading=True, data_nodes=["d0"], stage0=relay_ids(0),
                                        groups=groups))
        for s in range(STAGES - 1, -2, -1):  # every member steps, the last stage first
            for n in sorted(self.stepping):
                if self.stage[n] == s:
                    self.stepping.discard(n)
                    self.run(n, self.nodes[n].on_step_done(2.0, t, *self.near(n)))
        assert t + 1 in self.opened

    def groups_at(self, t: int) -> dict[str, dict[int, set[str]]]:
        return {n: ph.groups[t] for n, ph in self.nodes.items() if t in ph.groups}


def test_groups_go_once_then_by_digest_and_every_node_applies_the_same() -> None:
    full, digest = Swarm(by_digest=False), Swarm()
    for t in range(3):
        full.iteration(t)
        digest.iteration(t)
        assert digest.groups_at(t) == full.groups_at(t) and len(digest.groups_at(t)) == 1 + STAGES * K
    assert digest.begin_bytes[0] == full.begin_bytes[0]  # the first BEGIN goes in full everywhere
    for t in (1, 2):
        assert abs(full.begin_bytes[t] - full.begin_bytes[0]) < 0.01 * full.begin_bytes[0]  # (the seqs differ)
        assert digest.begin_bytes[t] < 0.35 * full.begin_bytes[t], (digest.begin_bytes, full.begin_bytes)
    assert not digest.asked and digest.nodes["d0"].digests.stats.by_digest == 2 * K  # (iterations 1-2)
    relay = digest.nodes[relay_ids(0)[0]].digests.stats
    assert relay.full >= 1 and relay.by_digest == 2 * relay.full and relay.missing == 0  # (to each child)


def test_a_receiver_that_lacks_the_groups_asks_and_gets_them_in_full() -> None:
    sw = Swarm()
    sw.iteration(0)
    restarted = relay_ids(1)[2]
    sw.nodes[restarted] = Phases(restarted, 1, STAGES - 1, applied=1)  # (a restart: its groups are gone)
    sw.iteration(1)
    assert sw.asked[1] >= 1 and restarted in sw.groups_at(1)
    assert sw.groups_at(1)[restarted] == sw.groups_at(1)[relay_ids(1)[0]]
    assert sw.nodes[restarted].begin_msgs[1].groups and not by_digest(sw.nodes[restarted].begin_msgs[1])


def test_changed_groups_go_in_full_and_resends_keep_the_digest() -> None:
    sw = Swarm()
    sw.iteration(0)
    smaller = {0: relay_ids(0), 1: relay_ids(1)[:3], 2: relay_ids(2)}  # a relay of stage 1 left
    sw.iteration(1, smaller)
    assert sw.groups_at(1)[relay_ids(2)[0]] == {-1: {"d0"}} | {k: set(smaller[k]) for k in (1, 2)}  # (pruned)
    lead = sw.nodes["d0"].digests.stats
    assert lead.by_digest == K and lead.group_ids_sent == K * (1 + 3 * K) + K * 3 and not sw.asked
    # a BEGIN by digest that is lost goes again by digest (the retransmission timer) and is applied
    lost = relay_ids(0)[1]
    sw.lose.add((lost, 2))
    lead = sw.nodes["d0"]
    lead.report_done(0.0, IterationDone(2, 4, 1.0))
    sw.run("d0", lead.maybe_begin(0.0, 2, leading=True, data_nodes=["d0"], stage0=relay_ids(0),
                                  groups={-1: ["d0"]} | smaller))
    assert 2 not in sw.nodes[lost].begun
    resend = lead.on_timer(3.0, PhaseTimer(PhaseKind.BEGIN, 2))
    copies = [e.msg for e in resend if isinstance(e, Send)]
    assert len(copies) == 1 and all(g.digest and not g.peers for g in copies[0].groups)
    sw.run("d0", resend)
    assert 2 in sw.nodes[lost].begun and sw.nodes[lost].groups[2][0] == set(smaller[0])


def test_a_peer_forgotten_or_back_is_sent_full_groups() -> None:
    d = GroupDigests()
    groups = (StageMembers(0, ("a", "b")), StageMembers(1, ()))
    begin = BeginAggregation(1, 4, groups)
    d.acked("r", begin)
    assert d.outgoing("r", begin).groups == (StageMembers(0, (), group_digest(groups[0])), StageMembers(1, ()))
    changed = BeginAggregation(2, 4, (StageMembers(0, ("a",)), StageMembers(1, ())))
    assert d.outgoing("r", changed) is changed  # (a new group goes in full)
    assert d.outgoing("q", begin) is begin  # (another receiver: not acknowledged yet)
    d.forget("r")
    assert d.outgoing("r", begin) is begin
    assert GroupDigests(enabled=False).outgoing("r", begin) is begin


def test_a_receiver_keeps_the_newest_groups_and_checks_the_stage() -> None:
    d = GroupDigests()
    sets = [StageMembers(0, (f"p{i}",)) for i in range(GROUPS_KEPT + 1)]
    for g in sets:
        d.expand(BeginAggregation(1, 1, (g,)))
    named = BeginAggregation(2, 1, (StageMembers(0, (), group_digest(sets[-1])), StageMembers(1, ())))
    assert d.expand(named).groups == (sets[-1], StageMembers(1, ()))
    old = BeginAggregation(2, 1, (StageMembers(0, (), group_digest(sets[0])),))
    assert d.expand(old) == old and by_digest(old)  # dropped: the caller asks for it
    wrong_stage = BeginAggregation(2, 1, (StageMembers(3, (), group_digest(sets[-1])),))
    assert by_digest(d.expand(wrong_stage))
    assert group_digest(sets[0]) != group_digest(StageMembers(0, ("p", "0")))


def test_the_digest_round_trips_and_an_oversized_one_is_refused() -> None:
    begin = BeginAggregation(3, 2, (StageMembers(1, (), bytes(range(8))),))
    assert codec.decode(codec.encode("me", begin))[1] == begin
    ack = PhaseAck(PhaseKind.GROUPS, 3)
    assert codec.decode(codec.encode("me", ack))[1] == ack
    problem = check(BeginAggregation(3, 2, (StageMembers(1, (), bytes(40)),)), Context(n_stages=STAGES))
    assert problem is not None and "digest" in problem.why


@pytest.mark.parametrize("churn", [0.0, 0.1])
def test_the_simulator_trains_the_same_with_either(churn: float) -> None:
    from gwtf_node.sim.train import run_train

    runs = {g: run_train("table2-homogeneous", "gwtf", churn, 3, 0, begin_groups=g) for g in ("full", "digest")}
    full, digest = runs["full"], runs["digest"]
    assert digest["lost_microbatches"] == full["lost_microbatches"] == 0
    assert digest["unfinished_iterations"] == full["unfinished_iterations"] == 0
    if not churn:  # (the same messages at the same times: a copy by digest is as fast as a full one)
        assert digest["per_iteration"] == full["per_iteration"]
    bound = 1.0 if churn else 0.6  # (with churn the groups change: a new group goes in full)
    assert digest["phases"]["group_ids_sent"] < bound * full["phases"]["group_ids_sent"]
    assert digest["phases"]["groups_by_digest"] > 0 and full["phases"]["groups_by_digest"] == 0

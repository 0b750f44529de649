"""Several data nodes share the relays: each gets its own demand, never more (gwtf_node/protocol/flow/).

Section V-C of the paper: "Data nodes start with unpaired flows matching
their capacity.  Sending outflow reduces capacity by 1"; a data node's
demand is its capacity (the microbatches it pushes per iteration).

* Two data nodes of demand 4 over relays with room for both (one relay per
  stage of capacity 8, or two of capacity 4), link costs drawn from a seed, in
  the simulator (sim/engine.py): after every event no data node has more units
  out than its demand (`outflow_committed`, which counts a unit it is taking
  back as gone), and once the flows settle each data node sends and receives
  exactly its demand and both ends of every link agree; so with one stage
  (a relay linked to both sides of each data node) and with three.
* The machines alone: a data node at its demand says so in its bid
  (`LaunchBid.full`), and no relay relabels into it while its last bid says
  so; one handed one more unit by a relabel on an older bid takes it back
  (Withdraw to the relay that relabelled), and that relay does not relabel
  into it again until the data node bids again.
* Table VI at 36 nodes in the simulator (sim/train), where the data nodes ask
  for more than the swarm carries: no data node takes back a relabelled unit.
"""

from __future__ import annotations

import random

import pytest

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.flow import FlowConfig, FlowNode, relabel
from gwtf_node.protocol.messages import INF, FlowReply, LaunchBid, Relabel, RelabelCost, RelabelPair, Reply, Withdraw
from gwtf_node.sim.engine import Simulator
from support.helpers import sends

DATA = ("d0", "d1")
DEMAND = 4


class Checked:
    """A data node's machine whose committed outflow is checked against its demand after every event."""

    def __init__(self, machine: FlowNode) -> None:
        self.machine = machine
        self.most = 0  # the most units it ever had out (committed)

    def _check(self, eff: list) -> list:
        m = self.machine
        d = m.cfg.node_id
        self.most = max(self.most, m.outflow_committed(d))
        assert m.outflow_committed(d) <= m.launch.demand, (d, m.now, dict(m.out[d]), m.pending)
        return eff

    def start(self, now: float) -> list:
        return self._check(self.machine.start(now))

    def on_message(self, now: float, sender: str, msg) -> list:
        return self._check(self.machine.on_message(now, sender, msg))

    def on_timer(self, now: float, key: str) -> list:
        return self._check(self.machine.on_timer(now, key))


def swarm(relays_per_stage: int, capacity: int, seed: int, stages: int = 2):
    """Two data nodes and `relays_per_stage` relays per stage, every consecutive pair linked, costs from `seed`."""
    rng = random.Random(seed)
    tiers = [[f"r{s}.{k}" for k in range(relays_per_stage)] for s in range(stages)]
    costs: dict[tuple[str, str], float] = {}

    def cost(a: str, b: str) -> float:
        return costs.setdefault(tuple(sorted((a, b))), round(rng.uniform(0.5, 3.0), 2))

    cfgs = {d: FlowConfig(d, True, DEMAND, DATA, {r: cost(d, r) for r in tiers[0]},
                          {r: cost(d, r) for r in tiers[-1]}) for d in DATA}
    for s, tier in enumerate(tiers):
        nxt = tiers[s + 1] if s + 1 < stages else list(DATA)
        prv = tiers[s - 1] if s > 0 else list(DATA)
        for r in tier:
            cfgs[r] = FlowConfig(r, False, capacity, DATA, {x: cost(r, x) for x in nxt}, {x: cost(r, x) for x in prv},
                                 peers=tuple(x for x in tier if x != r))
    sim = Simulator(lambda a, b: 0.005)
    nodes = {nid: FlowNode(cfg, random.Random(f"{seed}:{nid}")) for nid, cfg in sorted(cfgs.items())}
    checked = {}
    for nid, node in nodes.items():
        if node.cfg.is_data:
            checked[nid] = Checked(node)
            sim.add(nid, checked[nid])
        else:
            sim.add(nid, node)
    sim.start_all()
    return sim, nodes, checked


@pytest.mark.parametrize("relays_per_stage, capacity", [(1, 8), (2, 4)])
@pytest.mark.parametrize("seed", range(6))
def test_each_data_node_gets_its_demand_and_never_more(relays_per_stage: int, capacity: int, seed: int) -> None:
    sim, nodes, checked = swarm(relays_per_stage, capacity, seed)
    sim.run_until(30.0)
    for d in DATA:
        m = nodes[d]
        assert sum(m.out[d].values()) == DEMAND and sum(m.inn[d].values()) == DEMAND, (d, m.out[d], m.inn[d])
        assert not m.pending and checked[d].most == DEMAND
    for nid, m in nodes.items():
        assert m.used() <= m.cfg.capacity or m.cfg.is_data
        for d, outs in m.out.items():
            for j, n in outs.items():
                assert nodes[j].inn[d].get(nid, 0) == n, (nid, j, d)  # both ends of the link agree


@pytest.mark.parametrize("stages", [1, 3])
def test_one_or_three_stages_each_data_node_gets_its_demand(stages: int) -> None:
    """With one stage a relay links both sides of every data node (it neither relabels nor cross-displaces)."""
    for seed in range(3):
        for relays_per_stage, capacity in ((1, 8), (2, 4)):
            sim, nodes, _ = swarm(relays_per_stage, capacity, seed, stages=stages)
            sim.run_until(40.0)
            for d in DATA:
                assert sum(nodes[d].out[d].values()) == sum(nodes[d].inn[d].values()) == DEMAND, (seed, d)
            for nid, m in nodes.items():
                for d, outs in m.out.items():
                    for j, n in outs.items():
                        assert nodes[j].inn[d].get(nid, 0) == n, (seed, nid, j, d)


# ---------------------------------------------------------------------------------------------- the machines alone


def test_a_data_node_at_its_demand_takes_back_a_unit_relabelled_to_it() -> None:
    m = FlowNode(FlowConfig("d1", True, 2, DATA, {"F": 2.0, "G": 1.0}, {"L": 3.0}), random.Random(0))
    m.start(0.0)
    m.out["d1"] = {"F": 1, "G": 1}  # its demand is placed
    eff = m.on_message(1.0, "F", Relabel("d0", "d1"))  # F turns one of d0's units into d1's: one too many
    w = sends(eff, Withdraw)
    assert [e.to for e in w] == ["F"] and m.out["d1"] == {"F": 2, "G": 1} and m.outflow_committed("d1") == 2
    m.on_message(1.1, "F", FlowReply(w[0].msg.req_id, "d1", Reply.APPROVED))
    assert m.out["d1"] == {"F": 1, "G": 1} and not m.pending
    # below its demand a relabelled unit is welcome
    m.out["d1"] = {"G": 1}
    assert not sends(m.on_message(2.0, "F", Relabel("d0", "d1")), Withdraw) and m.out["d1"] == {"F": 1, "G": 1}


def _first_stage_relay_sending_d0() -> FlowNode:
    """A first-stage relay F sending two units of d0 on to M, which tells it that d1's hops back are 3 cheaper."""
    first = FlowNode(FlowConfig("F", False, 4, DATA, {"M": 1.0}, {"d0": 6.0, "d1": 2.0}), random.Random(0))
    first.start(0.0)
    first.inn["d0"]["d0"] = 2
    first.out["d0"]["M"] = 2
    first.on_message(0.5, "M", RelabelCost("d0", "d1", 1.0))  # d1's hops are 3 cheaper
    return first


def test_a_relay_does_not_relabel_into_a_data_node_that_gave_a_relabelled_unit_back() -> None:
    first = _first_stage_relay_sending_d0()
    first.on_message(0.6, "d1", LaunchBid("d1", 1, INF))
    assert sends(first.on_timer(1.0, "tick"), Relabel, "d1")
    eff = first.on_message(1.1, "d1", Withdraw(7, "d1"))  # d1 was at its demand: it takes the unit back
    assert sends(eff, FlowReply, "d1")[0].msg.outcome == Reply.APPROVED and not first.inn["d1"]
    first.out["d1"] = {}  # (the relay's own withdrawal downstream, answered)
    first.on_message(1.2, "d0", LaunchBid("d0", 1, INF))
    assert not sends(first.on_timer(2.0, "tick"), Relabel)  # d1 is full: no relabel into it
    first.on_message(2.1, "d1", LaunchBid("d1", 2, 9.0))  # d1 lost a unit and bids again ...
    first.on_message(2.2, "d1", LaunchBid("d1", 3, INF))  # ... and cannot place it: a relabel is welcome again
    assert sends(first.on_timer(3.0, "tick"), Relabel, "d1")


def test_a_data_node_at_its_demand_says_so_in_its_bid() -> None:
    m = FlowNode(FlowConfig("d1", True, 2, DATA, {"F": 2.0, "G": 1.0}, {"L": 3.0}), random.Random(0))
    m.start(0.0)
    m.out["d1"] = {"F": 1}  # one short, without a route: INF, not full
    bids = [e.msg for e in m.on_timer(1.0, "tick") if isinstance(e, Send) and isinstance(e.msg, LaunchBid)]
    assert not bids  # an INF bid that is not full is what the others assume already
    m.out["d1"] = {"F": 1, "G": 1}  # its demand is placed
    bids = [e for e in m.on_timer(2.0, "tick") if isinstance(e, Send) and isinstance(e.msg, LaunchBid)]
    assert sorted(e.to for e in bids) == ["F", "G"] and all(e.msg.full and e.msg.cost == INF for e in bids)
    assert not [e for e in m.on_timer(3.0, "tick") if isinstance(e, Send) and isinstance(e.msg, LaunchBid)]
    m.out["d1"] = {"F": 1}  # a unit lost: not full any more, told although the cost stays INF
    bids = [e.msg for e in m.on_timer(4.0, "tick") if isinstance(e, Send) and isinstance(e.msg, LaunchBid)]
    assert bids and not any(b.full for b in bids) and bids[0].seq == 2


def test_a_relay_does_not_relabel_into_a_data_node_whose_bid_says_it_is_full() -> None:
    first = _first_stage_relay_sending_d0()
    first.on_message(0.6, "d0", LaunchBid("d0", 1, INF, full=True))
    first.on_message(0.6, "d1", LaunchBid("d1", 1, INF, full=True))
    assert not sends(first.on_timer(1.0, "tick"), Relabel)  # d1 is at its demand: a relabel would be given back
    first.on_message(1.1, "d1", LaunchBid("d1", 2, INF))  # d1 lost a unit and has no route: welcome
    assert sends(first.on_timer(2.0, "tick"), Relabel, "d1")


def test_table6_no_data_node_takes_back_a_relabelled_unit() -> None:
    from gwtf_node.sim.train import flows as F
    from gwtf_node.sim.train import run_train

    taken_back = []  # (data node, relay) of every Withdraw a data node sends a first-stage relay
    full_bids = []
    orig = F.FlowDriver._apply_flow

    def spy(self, nid, effects):
        for e in effects:
            if type(e) is Send and nid in self.data and type(e.msg) is Withdraw:
                taken_back.append((nid, e.to))
            if type(e) is Send and nid in self.data and type(e.msg) is LaunchBid and e.msg.full:
                full_bids.append(nid)
        return orig(self, nid, effects)

    F.FlowDriver._apply_flow = spy
    try:
        run_train("table6-x2", "gwtf", 0.0, 2, 0, placement="swarm")  # 24 units of demand, room for 24 ...
    finally:
        F.FlowDriver._apply_flow = orig
    assert full_bids  # ... so the data nodes reach their demand and say so
    assert not taken_back, taken_back


def test_the_relabel_costs_that_change_together_go_in_one_message_and_are_all_taken() -> None:
    three = ("d0", "d1", "d2")
    last = FlowNode(FlowConfig("M", False, 4, three, {"d0": 5.0, "d1": 2.0, "d2": 4.0}, {"F": 1.0, "G": 1.0}),
                    random.Random(0))
    last.start(0.0)
    last.out["d0"]["d0"] = 1  # a unit of d0 goes back to d0: relabelled, it would go to d1 (-3) or d2 (-1)
    eff: list = []
    relabel.relabel_costs(last, eff)
    told = sends(eff, RelabelCost)
    assert sorted(e.to for e in told) == ["F", "G"]  # one message to each previous-stage relay
    assert {(p.from_commodity, p.to_commodity, p.cost) for p in told[0].msg.pairs()} == {
        ("d0", "d1", -3.0), ("d0", "d2", -1.0)}
    first = FlowNode(FlowConfig("F", False, 4, three, {"M": 1.0}, {d: 1.0 for d in three}), random.Random(0))
    first.start(0.0)
    first.on_message(1.0, "M", RelabelCost("d0", "d1", -3.0, (RelabelPair("d0", "d2", -1.0),
                                                              RelabelPair("x", "d2", 0.0))))  # unknown: ignored
    assert first.relabelling.heard == {("d0", "d1"): {"M": -3.0}, ("d0", "d2"): {"M": -1.0}}

"""Cycles through a data node once the flows stand (`FlowConfig.cycles`, gwtf_node/protocol/flow/cycles.py).

* The machines alone: a data node whose flows stand (no route, every other
  bid INF, quiet) announces its retire label; one not cycling launches on no
  label that ends in a retire label; a relay's `cross_limit` holds back a
  crossing only when it does not end in one.
* In the simulator: on setting 5 seed 3 (a tuning seed) a trial and the cycle
  after it lower the cost at the same maximum flow; with one data node the
  option changes nothing.
"""

from __future__ import annotations

import dataclasses
import random

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.messages import INF, CostAnnounce, Label, LaunchBid, Side
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import load_flow_setting
from gwtf_node.sim.validate import check_routing

DATA = ("d0", "d1")
HOPS = ("r0", "r1")


def _data(did: str = "d0", cycles: int | None = 1) -> FlowNode:
    cfg = FlowConfig(did, True, 4, DATA, {r: 1.0 for r in HOPS}, {r: 1.0 for r in HOPS}, cycles=cycles)
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    return m


def _out_labels(eff, to: str) -> list[Label]:
    return [lab for e in eff if isinstance(e, Send) and e.to == to and isinstance(e.msg, CostAnnounce)
            for lab in e.msg.labels if lab.side == Side.OUT]


def _stand(m: FlowNode, now: float) -> list:
    """A unit of ours placed through r0, every other data node bids INF, nothing changes: tick up to `now`."""
    m.units.add_out("d0", "r0")
    m.on_message(0.1, "r0", LaunchBid("d1", 1, 5.0))
    m.on_message(0.2, "r0", LaunchBid("d1", 2, INF))
    eff = []
    for t in range(1, int(now) + 1):
        eff += m.on_timer(float(t), "tick")
        eff += m.on_timer(float(t) + 0.5, "announce")
        if m.cycles.on:
            break
    return eff


def test_a_data_node_whose_flows_stand_announces_its_retire_label():
    m = _data()
    eff = _stand(m, 4.0)
    assert m.cycles.on
    labs = _out_labels(eff, "r0")
    assert labs and labs[-1].cost == 0.0 and labs[-1].path[-1].endswith("~")
    # no cycle to launch and nothing to try: the phase ends, its normal OUT label (INF) goes out again
    eff = m.on_timer(9.0, "tick") + m.on_timer(9.5, "announce")
    assert not m.cycles.on and m.cycles.done and _out_labels(eff, "r0")[-1].cost == INF
    off = _data(cycles=None)
    assert not _out_labels(_stand(off, 4.0), "r0") and not off.cycles.on


def test_a_data_node_not_cycling_launches_on_no_label_ending_in_a_retire_label():
    m = _data()
    e = m.epoch["d0"]
    steal = Label("d0", Side.IN, 3.0, ("r0+", "r0-", "d1~"), e)  # takes d1's unit, which d1 retires
    m.on_message(0.1, "r0", CostAnnounce((steal,)))
    assert m.labels.dec_out.get("d0") is None and m.my_out["d0"].cost == INF
    assert m.lin["d0"]["r0"] == steal
    real = Label("d0", Side.IN, 7.0, ("r1+", "r1-", "d0+"), e)
    m.on_message(0.2, "r1", CostAnnounce((real,)))
    assert m.labels.dec_out["d0"][1] == "r1" and m.my_out["d0"].cost == 8.0


def _total(setting: int, seed: int, **kw):
    sc = load_flow_setting(setting, seed)
    base = FlowConfig("-", False, 0, (), {}, {}, **kw)
    g = run_gwtf(sc, seed=seed, base=base)
    check_routing(sc, g)
    return g


def test_a_trial_and_the_cycle_after_it_lower_the_cost_at_the_same_flow():
    off = _total(5, 3)
    on = _total(5, 3, cycles=3)
    assert on.num_flows == off.num_flows
    assert on.mean_cost * on.num_flows < off.mean_cost * off.num_flows - 0.5


def test_with_one_data_node_nothing_changes():
    off = _total(1, 0)
    on = _total(1, 0, cycles=3)
    assert [dataclasses.astuple(f) for f in on.flows] == [dataclasses.astuple(f) for f in off.flows]
    assert on.messages == off.messages

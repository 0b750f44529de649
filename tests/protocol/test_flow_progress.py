"""`FlowNode.progress`: what the flow machine waits for, as the daemon's status.json shows it (`flow_machine`)."""

from __future__ import annotations

import random

from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.messages import INF, CostAnnounce, FlowReply, Label, Reply, RequestFlow, Side

D = "d0"


def wave_label(node: str, cost: float, epoch: int = 1) -> Label:
    return Label(D, Side.IN, cost, (node + "+", node + "-", D + "+"), epoch, True)


def test_a_relay_shows_its_wave_its_route_and_how_long_its_unit_waits():
    m = FlowNode(FlowConfig("R", False, 1, (D,), {"N1": 3.0}, {"P1": 2.0}), random.Random(0))
    m.start(0.0)
    assert m.progress()[D]["out_cost"] is None  # no route yet
    m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0),)))
    m.on_message(0.15, "P1", RequestFlow(1, D, 13.0))  # taken, held until the labels are still (0.30)
    p = m.progress()[D]
    assert p["wave"] == 1 and p["out_cost"] == 13.0 and p["formation"] and not p["held"]
    assert p["moves_in_s"] == round(0.10 + m.cfg.launch_settle_s - 0.15, 3)
    assert "launches" not in p


def test_a_data_node_shows_its_launches():
    m = FlowNode(FlowConfig(D, True, 2, (D,), {"A": 1.0}, {"Z": 1.0}), random.Random(0))
    m.start(0.0)
    p = m.progress()[D]["launches"]
    assert p["demand"] == 2 and p["placed"] == 0 and p["out"] == 0 and p["next_in_s"] is None  # waiting for a route
    m.on_message(0.1, "A", CostAnnounce((Label(D, Side.IN, 10.0, ("A+", "A-", "Z+", "Z-", D + "+"), 1, True),)))
    eff = m.on_timer(1.0, "launch")
    (req,) = [e.msg for e in eff if isinstance(getattr(e, "msg", None), RequestFlow)]
    assert m.progress()[D]["launches"]["out"] == 1  # the launch is on its way
    m.on_message(1.1, "A", FlowReply(req.req_id, D, Reply.APPROVED, None))
    p = m.progress()[D]
    assert p["launches"]["placed"] == 1 and p["launches"]["out"] == 1 and p["out_cost"] != INF

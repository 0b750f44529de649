"""Ordered launches: each data node hears each other data node's bid once, through the relay it named
(`LaunchBid.feeds`, gwtf_node/protocol/flow/bids.py).

* The machines alone: a data node names, per other data node, the relay whose
  copy of its bid came first; a relay passes a bid on only to the data nodes
  that named it for that origin or named no relay for it; a data node that
  loses its feed relay names none again (every relay passes those bids on).
* Table VI in the simulator (sim/train): after every data node's second bid,
  no bid reaches a data node more than once, and the flows are the ones the
  machines formed when every relay passed every bid on.
"""

from __future__ import annotations

import collections
import random

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.messages import BidFeed, LaunchBid

DATA = ("d0", "d1", "d2")
RELAYS = ("r0", "r1", "r2")


def _relay(rid: str) -> FlowNode:
    cfg = FlowConfig(rid, False, 4, DATA, {"s1": 1.0}, {d: 1.0 for d in DATA})
    return FlowNode(cfg, random.Random(0))


def _data(did: str) -> FlowNode:
    cfg = FlowConfig(did, True, 4, DATA, {r: 1.0 for r in RELAYS}, {r: 1.0 for r in RELAYS})
    return FlowNode(cfg, random.Random(0))


def _bids_to(eff) -> list[str]:
    return sorted(e.to for e in eff if isinstance(e, Send) and isinstance(e.msg, LaunchBid))


def test_relay_passes_a_bid_on_to_the_data_nodes_that_named_it_or_nobody():
    r = _relay("r1")
    assert _bids_to(r.on_message(0.0, "d0", LaunchBid("d0", 1, 5.0))) == ["d1", "d2"]  # nobody named yet
    # d1 takes d0's bids from r0, d2 from r1 (this relay)
    r.on_message(0.1, "d1", LaunchBid("d1", 1, 6.0, (BidFeed("d0", "r0"), BidFeed("d2", "r1"))))
    r.on_message(0.1, "d2", LaunchBid("d2", 1, 7.0, (BidFeed("d0", "r1"),)))
    assert _bids_to(r.on_message(0.2, "d0", LaunchBid("d0", 2, 4.0))) == ["d2"]
    assert _bids_to(r.on_message(0.3, "d0", LaunchBid("d0", 2, 4.0))) == []  # a seq is passed on once
    # d1 names r1 for d2: d2's next bid goes to d1 here; d2 gone: nobody's feeds of it are kept
    assert _bids_to(r.on_message(0.4, "d2", LaunchBid("d2", 2, 7.5))) == ["d0", "d1"]
    r.remove_neighbour(0.5, "d1")
    assert "d1" not in r.bid.wants


def test_data_node_names_the_first_relay_and_forgets_it_when_it_leaves():
    d = _data("d1")
    d.on_message(0.0, "r2", LaunchBid("d0", 1, 5.0))
    d.on_message(0.01, "r0", LaunchBid("d0", 1, 5.0))  # a later copy of the same bid
    d.on_message(0.02, "r1", LaunchBid("d2", 1, 6.0))
    assert d.bid.feeds == {"d0": "r2", "d2": "r1"}
    d.remove_neighbour(1.0, "r2")
    assert d.bid.feeds == {"d2": "r1"}
    d.on_message(1.1, "r0", LaunchBid("d0", 2, 5.0))
    assert d.bid.feeds == {"d0": "r0", "d2": "r1"}


def test_table6_each_bid_reaches_each_data_node_once_after_the_feeds_are_told():
    from gwtf_node.sim.train import flows as F
    from gwtf_node.sim.train import run_train

    copies: collections.Counter = collections.Counter()  # (receiver, origin, seq) -> copies
    born: dict[tuple[str, int], float] = {}  # (origin, seq) -> when the origin sent it
    named: dict[tuple[str, str], float] = {}  # (data node, other data node) -> when it first named a feed for it
    orig = F.FlowDriver._apply_flow

    def spy(self, nid, effects):
        for e in effects:
            if type(e) is Send and type(e.msg) is LaunchBid:
                m = e.msg
                if nid == m.data_node:
                    born.setdefault((nid, m.seq), self.now)
                    for f in m.feeds:
                        named.setdefault((nid, f.data_node), self.now)
                elif e.to in self.data:
                    copies[(e.to, m.data_node, m.seq)] += 1
        return orig(self, nid, effects)

    F.FlowDriver._apply_flow = spy
    try:
        run_train("table6-x1", "gwtf", 0.0, 1, 0, placement="swarm")
    finally:
        F.FlowDriver._apply_flow = orig
    assert copies, "no bid was passed on"
    # a bid sent a second after its receiver named a feed for its origin (every relay heard the naming by then:
    # links take at most a few hundred ms) reaches that receiver once
    late = {k: n for k, n in copies.items() if (k[0], k[1]) in named and born[(k[1], k[2])] > named[(k[0], k[1])] + 1}
    assert late and max(late.values()) == 1, late
    assert max(copies.values()) > 1  # the first bids reach a data node through every shared relay

"""Ordered launches (several data nodes): the cheapest augmentation over all data nodes goes first.

Each data node's units are a commodity of their own, and shared relay
capacity makes this a multi-commodity flow; one shortest augmenting path per
data node at a time, all of them at once, stays well above the LP bound
(docs/bench_flow.md).  A data node announces the cost of its next launch (its
OUT label, INF when it will not launch) in a `LaunchBid` to its first-stage
relays, which pass each new bid (`seq`) on to their other data-node
neighbours.  A data node launches only when no known bid is lower (ties: the
smaller id), `ordered_settle_s` after its first bid since its last launch
(also its wait after a settled launch: the labels settle and the others' bids
arrive); its bid is frozen while its launch is out, so the others wait for
it.  A lower bid unchanged for `bid_patience_rounds` stops holding others back
(its data node may be stuck or gone).  Bids go out at most every
`path_announce_s` (a flapping OUT label).  A data node at its demand bids INF
with `full` (and bids again when that changes): relays do not relabel a unit
into it (relabel.py).

One copy per bid.  Two data nodes share many first-stage relays (all of them
in Table VI), and each would pass every bid on: a data node would hear each
bid once per shared relay.  So a data node picks, per other data node, the
relay whose copy of its bids came first (`BidState.feeds`: the fastest path)
and names it in its own bids (`LaunchBid.feeds`); a relay passes a bid on to a
data node only when that data node named it for the bid's origin, or named no
relay for it (at start, after a change, an older node: every relay passes it
on, as before).  The choice rides on the bids the data node sends anyway (a
bid of its own only for it would reset the others' patience).  A data node
that loses its feed relay forgets the choice (`neighbour_removed`), which its
next bid tells, and picks again from the copies that then come.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, BidFeed, LaunchBid
from . import cycles
from .state import EPS

if TYPE_CHECKING:
    from .node import FlowNode


@dataclass
class BidState:
    seq: int = 0  # data node: the seq of its last bid
    cost: float | None = None  # data node: the cost it last announced
    sent_at: float = float("-inf")  # ... and when
    first_at: float | None = None  # the first bid since the last launch (see `my_turn`)
    others: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # data node: (seq, cost, heard at)
    seen_seq: dict[str, int] = field(default_factory=dict)  # relay: the newest seq passed on per data node
    seen_cost: dict[str, float] = field(default_factory=dict)  # relay: its cost (relabelling waits for all INF)
    seen_full: dict[str, bool] = field(default_factory=dict)  # relay: its `full` (no relabel into it while True)
    full: bool = False  # data node: the `full` it last announced
    feeds: dict[str, str] = field(default_factory=dict)  # data node: origin -> the relay that passes its bids on
    wants: dict[str, dict[str, str]] = field(default_factory=dict)  # relay: data node -> its `feeds`


def update_bid(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Ordered launches, data node: announce the cost of its next launch when it changed (frozen while a
    launch is out: the data node in flight keeps the lowest bid, so the others wait for it)."""
    if node.units.token_pending or node.launch.pending > 0:
        return
    d = node.cfg.node_id
    lab = node.labels.my_out.get(d)
    full = node.outflow_committed(d) >= node.launch.demand
    will_launch = node.labels.dec_out.get(d) is not None and not full
    cost = lab.cost if lab is not None and will_launch else INF
    if will_launch:
        cost = cycles.bid_cost(node, cost)
    last = node.bid.cost
    if last is None and cost == INF and not full:
        return  # an unknown bid and an infinite one mean the same to the others
    if full == node.bid.full and last is not None and (abs(cost - last) <= EPS or (cost == INF and last == INF)):
        return
    if now < node.bid.sent_at + node.cfg.path_announce_s:  # at most one bid per path_announce_s (labels may flap)
        eff.append(SetTimer("bid", node.bid.sent_at + node.cfg.path_announce_s))
        return
    node.bid.seq += 1
    feeds = tuple(BidFeed(o, r) for o, r in sorted(node.bid.feeds.items()))
    node.bid.cost, node.bid.sent_at, node.bid.full = cost, now, full
    if node.bid.first_at is None:
        node.bid.first_at = now
    msg = LaunchBid(d, node.bid.seq, cost, feeds, full)
    for j in sorted(node.cfg.next_costs):
        eff.append(Send(j, msg))

def my_turn(node: FlowNode, now: float, eff: list[Effect]) -> bool:
    """Ordered launches: launch only when no other data node bids less (ties: the smaller id), and once
    our own bid has been out for `launch_settle_s`; a cheaper bid unchanged for `bid_patience_rounds` (its
    data node may be stuck or gone) is ignored."""
    cfg = node.cfg
    mine = node.bid.cost
    if mine is None or mine == INF:
        return True  # not announced yet (a route this instant): nothing to compare
    if node.bid.first_at is None:
        node.bid.first_at = now  # the same bid as before the last launch: not sent again
    wait = node.bid.first_at + cfg.ordered_settle_s  # let the others' bids arrive first
    if now >= wait:
        wait = INF
        me = cfg.node_id
        patience = cfg.bid_patience_rounds * cfg.round_s
        for e, (_, c, t) in node.bid.others.items():
            if c < mine - EPS or (c <= mine + EPS and e < me):
                if now < t + patience:
                    wait = min(wait, t + patience)
    if wait == INF:
        return True
    eff.append(SetTimer("launch", wait))
    return False

def on_launch_bid(node: FlowNode, now: float, sender: str, msg: LaunchBid, eff: list[Effect]) -> bool:
    """A data node hears another's bid; a relay passes a bid on, once per seq, to its data-node neighbours.
    True when the bid moves no unit here (a relay's always)."""
    origin = msg.data_node
    cfg = node.cfg
    if cfg.is_data:
        if origin != cfg.node_id and origin not in node.bid.feeds and sender in cfg.next_costs:
            node.bid.feeds[origin] = sender  # the first copy: its relay passes the origin's bids on from now on
        old = node.bid.others.get(origin)
        if origin == cfg.node_id or (old is not None and msg.seq <= old[0]):
            return True
        node.bid.others[origin] = (msg.seq, msg.cost, now)
        return False
    if sender == origin:
        node.bid.wants[origin] = {f.data_node: f.relay for f in msg.feeds}
    if msg.seq <= node.bid.seen_seq.get(origin, 0):
        return True
    node.bid.seen_seq[origin] = msg.seq
    node.bid.seen_cost[origin] = msg.cost
    node.bid.seen_full[origin] = msg.full
    cms = cfg.commodities
    me = cfg.node_id
    targets = {p for p in cfg.prev_costs if p in cms} | {j for j in cfg.next_costs if j in cms}
    wants = node.bid.wants
    for p in sorted(targets - {sender, origin}):
        feed = wants.get(p, {}).get(origin)
        if feed is None or feed == me:
            eff.append(Send(p, msg))
    return True

def neighbour_removed(node: FlowNode, peer: str) -> None:
    """`peer` left: a data node forgets it as a feed (its next bid names none: every relay passes those bids
    on until it picks again); a relay forgets a data node's feeds and its last bid (a data node gone must not
    hold relabelling back)."""
    node.bid.seen_cost.pop(peer, None)
    node.bid.seen_full.pop(peer, None)
    node.bid.wants.pop(peer, None)
    for o in [o for o, r in node.bid.feeds.items() if r == peer]:
        del node.bid.feeds[o]


def launched(node: FlowNode) -> None:
    """Data node: its launch is out; the next bid starts the wait again (`my_turn`)."""
    node.bid.first_at = None


def data_node_back(node: FlowNode, d: str) -> None:
    """The data node `d` restarted: its bids count from the start again."""
    b = node.bid
    for table in (b.seen_seq, b.seen_cost, b.seen_full, b.others, b.wants):
        table.pop(d, None)

"""How many messages the flow machines send while labels keep changing, with the announcements' backoff on
(`FlowConfig.coalesce_backoff_max_s`, gwtf_node/protocol/flow/announce.py, relabel.py), counted, not timed.

With several data nodes the labels run free (ordered launches) and every unit
that moves starts a cascade of label changes, a few milliseconds apart, that
explores path after path.  With the backoff a relay coalesces what changed and,
while its labels keep changing, waits twice as long after each flush, up to
`coalesce_backoff_max_s` (`announce.backoff`); its RelabelCosts go out with the
same window and only when they differ from what was told.  (Off by default:
see announce.py.)

* A relay whose next-stage IN label changes every 5 ms for 2 s tells its
  previous-stage peer far fewer labels than with the backoff off (a flush
  every `ordered_coalesce_s`), and the last one it tells is the current label.
* A RelabelCost that moves and comes back within one window is not sent; one
  that moves is sent once, when the window closes.
* The Table VI setting of the simulator at 36 nodes (6 data nodes), one
  iteration, with the backoff at 40 ms: the flow machines' messages stay under
  a bound that the default announcements exceed (271,166; about 135,000 with
  the backoff), and every microbatch completes.
"""

from __future__ import annotations

import heapq
import random

from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.messages import INF, CostAnnounce, Label, RelabelCost, Side

DATA = ("d0", "d1")


BACKOFF = {"coalesce_backoff_max_s": 0.04}


def relay(**extra) -> FlowNode:
    """Relay R between previous-stage relay P and next-stage relays M and N, two data nodes (ordered launches)."""
    cfg = FlowConfig("R", False, 4, DATA, {"M": 1.0, "N": 9.0}, {"P": 1.0}, **{**BACKOFF, **extra})
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    return m


class Clock:
    """Drives one machine: messages in at given times, its own timers fired when due, its Sends kept."""

    def __init__(self, machine: FlowNode) -> None:
        self.m = machine
        self.timers: list[tuple[float, int, str]] = []
        self.seq = 0
        self.sent: list[tuple[float, Send]] = []

    def _take(self, now: float, eff: list) -> None:
        for e in eff:
            if isinstance(e, SetTimer):
                self.seq += 1
                heapq.heappush(self.timers, (e.deadline, self.seq, e.key))
            elif isinstance(e, Send):
                self.sent.append((now, e))

    def until(self, t: float) -> None:
        while self.timers and self.timers[0][0] <= t:
            at, _, key = heapq.heappop(self.timers)
            if key != "tick":  # rounds (moves, relabelling) play no part here
                self._take(at, self.m.on_timer(at, key))

    def deliver(self, now: float, sender: str, msg) -> None:
        self.until(now)
        self._take(now, self.m.on_message(now, sender, msg))

    def told(self, to: str, typ) -> list:
        return [e.msg for _, e in self.sent if e.to == to and isinstance(e.msg, typ)]


def in_label(d: str, cost: float, via: str) -> Label:
    return Label(d, Side.IN, cost, (via + "+", via + "-", d + "+"))


def cascade(**extra) -> Clock:
    """M's IN label of d0 moves every 5 ms for 2 s (a cascade of cheaper and dearer routes)."""
    c = Clock(relay(**extra))
    rng = random.Random(7)
    for k in range(400):
        c.deliver(0.1 + 0.005 * k, "M", CostAnnounce((in_label("d0", round(rng.uniform(1.0, 50.0), 3), "M"),)))
    c.until(10.0)
    return c


def test_a_relay_whose_labels_keep_changing_announces_them_less_and_less_often() -> None:
    off = cascade(coalesce_backoff_max_s=0.0)  # the default
    on = cascade()
    n_off = sum(len(m.labels) for m in off.told("P", CostAnnounce))
    n_on = sum(len(m.labels) for m in on.told("P", CostAnnounce))
    assert n_off >= 150  # a flush every ordered_coalesce_s = 10 ms
    assert n_on <= n_off / 3, (n_on, n_off)
    # nothing is lost: the last IN label P was told is R's current one
    last = [lab for m in on.told("P", CostAnnounce) for lab in m.labels if lab.commodity == "d0"][-1]
    assert last.cost == on.m.my_in["d0"].cost and last.path == on.m.my_in["d0"].path


def test_the_window_is_back_to_its_least_after_a_quiet_spell() -> None:
    c = cascade()
    before = len(c.told("P", CostAnnounce))
    c.deliver(20.0, "M", CostAnnounce((in_label("d0", 0.5, "M"),)))
    c.until(20.0 + c.m.cfg.ordered_coalesce_s + 1e-9)
    assert len(c.told("P", CostAnnounce)) == before + 1


def test_a_relabel_cost_that_comes_back_within_the_window_is_not_sent() -> None:
    """(Without the backoff each RelabelCost goes out at once, as before.)"""
    c = Clock(relay())
    c.m.out["d0"]["M"] = 1  # R sends one unit of d0 on to M
    c.m.inn["d0"]["P"] = 1
    c.deliver(1.0, "M", RelabelCost("d0", "d1", 2.0))
    c.deliver(1.001, "M", RelabelCost("d0", "d1", 5.0))
    c.until(2.0)
    assert [(m.from_commodity, m.to_commodity, m.cost) for m in c.told("P", RelabelCost)] == [("d0", "d1", 5.0)]
    c.deliver(3.0, "M", RelabelCost("d0", "d1", INF))  # flips and comes back before the window closes
    c.deliver(3.001, "M", RelabelCost("d0", "d1", 5.0))
    c.until(4.0)
    assert len(c.told("P", RelabelCost)) == 1


def test_table6_at_36_nodes_forms_its_flows_with_a_bounded_number_of_messages() -> None:
    from gwtf_node.sim.train import run_train

    rep = run_train("table6-x2", "gwtf", 0.0, 1, 0, flow_options=BACKOFF)
    assert rep["throughput_per_iteration"] == 24.0
    assert rep["flow_messages"] < 200_000, rep["flow_messages"]


def test_without_the_backoff_relabel_costs_go_out_at_once() -> None:
    c = Clock(relay(coalesce_backoff_max_s=0.0))
    c.m.out["d0"]["M"] = 1
    c.m.inn["d0"]["P"] = 1
    c.deliver(1.0, "M", RelabelCost("d0", "d1", 2.0))
    assert [m.cost for _, e in c.sent if isinstance((m := e.msg), RelabelCost) and e.to == "P"] == [2.0]

"""Cycles (several data nodes, `FlowConfig.cycles`, off by default): exchanges across data nodes once flows stand.

With several data nodes the flows that ordered launches, relabelling and
cross displacement form are a local optimum of every single move
(docs/bench_flow.md): what is left needs units of two data nodes moved
together.  Such a move is a *cycle through a data node*: it launches one more
unit, which takes its route with the residual steps of the labels (cross
displacement included: it may take another data node's slot, whose unit is
routed again), and the chain ends by handing one of its units, or another
data node's, back to its data node, which *retires* it (does not place it
again).  The flow stays as large; its cost changes by the cycle's cost.

A data node whose flows stand (no route, every other bid INF, no flow change
for QUIET_ROUNDS) announces to its first hops, as its OUT label, the
*retire label*: cost 0, path (its tag with "~").  Labels then price cycles:
its own OUT label becomes the cheapest cycle through it (0 when none gains: a
unit launched to a first hop that hands it straight back).  It bids that cost
(bids.py: the cheapest goes first, over all data nodes) when it gains more
than GAIN_MIN, and launches it.

A data node not cycling ignores labels ending in a retire label (`usable`:
they would take a unit from another data node, not add one), and a relay's
`cross_limit` does not hold back crossings that end in one (`retiring`, read
by relabel.cross_in): the limit is there for formation, where stale labels
make crossings chase each other; a cycle goes when every label has settled.

Trials (`FlowConfig.cycles` of them).  Measured on settings 5-6, negative cycles are rare
on the flows formed: single moves are exhausted.  So a data node with no
cycle that gains launches, up to `cycles` times, the cheapest cycle
through a first hop not tried yet and carrying none of its units (a real
detour, cost c > 0).  The reverse of that cycle then costs -c: the next
cheapest cycle, over all data nodes, either undoes the trial or gains more,
so on settled labels a trial never leaves the flows dearer (stale ones can:
setting 6 seed 3, 1.0348 -> 1.0522 of the LP bound).

The phase ends (the retire label withdrawn, normal labels again) when no
data node has a cycle to launch (every bid INF, our own too) and nothing
changed for QUIET_ROUNDS;
a membership change at the data node allows another phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect
from ..messages import INF, Label, Side
from . import announce
from .state import label

if TYPE_CHECKING:
    from .node import FlowNode

QUIET_ROUNDS = 3.0  # a phase starts (and ends) once the flows have not changed for this long
GAIN_MIN = 0.5  # a cycle is launched when it gains more than this (link costs are whole numbers)


@dataclass
class CycleState:
    on: bool = False  # the data node announces its retire label (its flows stood)
    done: bool = False  # the phase ended; another only after a membership change
    cost: float = INF  # while `on`: the cheapest cycle through this data node
    tried: set[str] = field(default_factory=set)  # first hops a trial went through


def retire_tag(node: FlowNode) -> str:
    return node.labels.tag_out[:-1] + "~"


def retire_label(node: FlowNode, d: str) -> Label:
    """The data node's retire label: a unit handed back to it costs 0 and is not placed again (also a recall
    wave's, launches.py)."""
    return label(d, Side.OUT, 0.0, (retire_tag(node),))


def retiring(lab: Label) -> bool:
    """The label's route ends by handing a unit back to a data node that retires it."""
    return any(t[-1:] == "~" for t in lab.path)


def usable(node: FlowNode, lab: Label) -> bool:
    """Data node: a label it may launch on (a data node not cycling launches only real augmentations)."""
    return node.cycles.on or node.cfg.cycles is None or not retiring(lab)


def tick(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Tick of a data node: start a phase when its flows stand, end it when it has no cycle left."""
    cfg = node.cfg
    cy = node.cycles
    if cfg.cycles is None or len(cfg.commodities) < 2 or cy.done:
        return
    if node.units.token_pending or node.launch.pending > 0 or node.units.pending:
        return
    if now - node.stats.last_change < QUIET_ROUNDS * cfg.round_s:
        return
    d = cfg.node_id
    if any(c != INF for _, c, _ in node.bid.others.values()):
        return  # another data node launches (or, cycling, has a cycle to launch)
    if not cy.on:
        lab = node.labels.my_out.get(d)
        if lab is not None and lab.cost != INF:
            return
        cy.on = True
    elif choice(node) is None:
        cy.on, cy.done, cy.cost = False, True, INF
    else:
        return
    announce.refresh(node, [d], eff)


def membership_changed(node: FlowNode) -> None:
    """A neighbour came or went: the flows re-form (normal labels again: a route may have opened), and another
    phase may follow (the labels are recomputed by the caller)."""
    cy = node.cycles
    cy.on, cy.done, cy.cost = False, False, INF
    cy.tried.clear()


def announced(node: FlowNode, d: str, cost: float) -> Label | None:
    """labels.decide_data: while `on`, the OUT label the data node announces (its retire label); `cost`, its
    cheapest cycle, is kept here.  None: its OUT label as computed."""
    if not node.cycles.on:
        return None
    node.cycles.cost = cost
    return retire_label(node, d)


def choice(node: FlowNode) -> tuple[float, str, bool] | None:
    """While `on`: the cycle to launch, (cost, first hop, a trial?): the cheapest when it gains, else a trial."""
    cfg = node.cfg
    d = cfg.node_id
    dec = node.labels.dec_out.get(d)
    if dec is not None and node.cycles.cost < -GAIN_MIN:
        return node.cycles.cost, dec[1], False
    if len(node.cycles.tried) >= (cfg.cycles or 0):
        return None
    best = None
    tout = node.labels.tag_out
    for j, c in sorted(cfg.next_costs.items()):
        lab = node.labels.lin[d].get(j)
        if j in node.cycles.tried or node.units.out[d].get(j, 0) > 0 or lab is None or lab.cost == INF \
                or tout in lab.path:
            continue
        if best is None or c + lab.cost < best[0]:
            best = (c + lab.cost, j, True)
    return best


def bid_cost(node: FlowNode, cost: float) -> float:
    """bids.update_bid: while `on`, the bid is the cost of the cycle it would launch (INF: none)."""
    if not node.cycles.on:
        return cost
    ch = choice(node)
    return INF if ch is None else ch[0]


def launching(node: FlowNode, j: str, trial: bool) -> None:
    if trial:
        node.cycles.tried.add(j)

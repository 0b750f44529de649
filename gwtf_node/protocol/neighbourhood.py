"""Bounded flow neighbourhoods: the adjacent-stage relays a relay links its flows to, and auto's choice of them.

Every relay of a stage can link to every relay of the next one, and a flow
machine tells each of its IN labels to every previous-stage neighbour, so a
relay's flow messages grow with its stage's size: at 1000 relays x 16 stages
(62 a stage) label waves send 6,829 messages per node.  With a bound K
(`gwtf-node join --flow-neighbours K`, the simulators' `neighbours`), a relay
links to its K cheapest next-stage relays and to its K cheapest
previous-stage relays (link cost, ties by id); a link either end chose is a
link of both (so no relay is left without one on either side).  Data nodes
keep a link to every first- and last-stage relay (the source and sink of
every unit), and a stage of at most K relays is linked whole.

With K = 10 the same 1000 x 16 swarm sends 1,408-1,564 messages per node
(seeds 0-7), and the flow machines reach the optimum over every link on each
of them; but Table VI at 144 nodes (24 data nodes) takes 1.0586 s a
microbatch against 1.0032 with every link (seeds 0-4 on average as fast),
and 100 daemons with it stalled in stage 8's all-reduce (docs/bench_flow.md,
"Bounded neighbourhoods").  So several data nodes keep every link (`FLOW_NEIGHBOURS`).

Auto (`wide`, `auto_flows`; the daemon's default, `--flow-neighbours` and
`--scaled-formation` not given, and the simulators'): a swarm of one data
node and at least `SCALED_WIDTH` relays a stage on average forms its flows
by cost scaling first (flow/scaled.py), any other with label waves; one data
node's relays bound their links to `SCALED_NEIGHBOURS` from half that width
(a stage of at most 10 relays stays linked whole), and several data nodes
keep every link.  The waves' messages per node grow with a stage's width (272 / 1,293 /
6,829 at 10 / 20 / 62 relays a stage, 16 stages), those of scaled formation
over K = 10 stay within 1.6-2.6 x of each other from 10 to 62 (630-765 /
648-865 / 1,251-1,655, seeds 0-3).  From 10 a stage auto takes that bound
on growth, though at 10 a stage the waves send 2.3-2.9 x fewer
(docs/bench_flow.md, "Auto").  A node judges the width by the relays it knows
and the stages they are in; the data node decides once it has measured its
links, and a relay that knows one data node waits for scaled formation, as it
knows only the adjacent stages: one that waits for a formation the data node
does not open falls back to the waves at its first flow message, but one
that does not wait would stall a formation that is opened.  A relay bounds
its links from half the width (`wide(..., half=True)`).

Membership changes keep the bound loosely: a next-stage relay that arrives
later is linked when it is among the cheapest K of the links kept and itself
(`takes_newcomer`: no link is dropped for it, so a joiner gets the flows it
is cheap for), and a relay that loses next-stage links refills them from the
cheapest relays it knows (`refill`).

The daemon (runtime/node/flows.py) and the simulators (sim/flowsim.py,
sim/flowchurn.py, sim/train/flows.py) all choose with these functions.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .scenario import Scenario

FLOW_NEIGHBOURS = 0  # the bound of a swarm auto does not bound: 0, every relay of the adjacent stages
SCALED_WIDTH = 10  # auto: one data node and this many relays a stage on average: scaled formation over K links
SCALED_NEIGHBOURS = 10  # auto's K there


def wide(data_nodes: int, relays: int, stages: int, *, half: bool = False) -> bool:
    """Auto's choice for a node that knows `data_nodes` data nodes and `relays` relays in `stages` stages (a relay
    knows its own and the adjacent stages' relays, a data node every one, once it has measured its links): whether
    the swarm bounds its links and forms its flows by cost scaling (module doc).  `half` the width: a relay's bound,
    and whether the data node measures its links as for scaled formation before it decides."""
    need = SCALED_WIDTH * stages / (2 if half else 1)
    return data_nodes == 1 and stages > 0 and relays >= need


def auto_flows(scaled: bool | None, neighbours: int | None, is_wide: bool) -> tuple[bool, int]:
    """(scaled formation, K) for the options given (None: auto) in a swarm that is `wide` or not."""
    k = (SCALED_NEIGHBOURS if is_wide else FLOW_NEIGHBOURS) if neighbours is None else neighbours
    return (is_wide if scaled is None else scaled), k


def auto_whole(scaled: bool | None, neighbours: int | None, data_nodes: int, relays: int,
               stages: int) -> tuple[bool, int]:
    """(scaled formation, K) where every node knows the swarm whole (the simulators): the formation the data node
    chooses, the bound a relay chooses (from half the width)."""
    return (auto_flows(scaled, neighbours, wide(data_nodes, relays, stages))[0],
            auto_flows(scaled, neighbours, wide(data_nodes, relays, stages, half=True))[1])


FORMATIONS = ("auto", "waves", "scaling")  # the simulators' `formation`


def auto_choice(scenario: Scenario, formation: str = "auto", neighbours: int | None = None) -> tuple[str, int]:
    """The simulators' `formation` and `neighbours` (None: auto) for `scenario`: what every node of the daemon
    chooses that knows it whole (`auto_flows`); ("waves" or "scaling", K)."""
    if formation not in FORMATIONS:
        raise ValueError(f"formation is one of {', '.join(FORMATIONS)}, not {formation!r}")
    scaled, k = auto_whole({"auto": None, "waves": False, "scaling": True}[formation], neighbours,
                           len(scenario.data_nodes), len(scenario.relays), scenario.stages)
    return ("scaling" if scaled else "waves"), k


def nearest(costs: Mapping[str, float], k: int) -> dict[str, float]:
    """The `k` cheapest of `costs` (peer -> link cost; ties by peer id), all of them with `k` <= 0."""
    if k <= 0 or len(costs) <= k:
        return dict(costs)
    return dict(sorted(costs.items(), key=lambda pc: (pc[1], pc[0]))[:k])


def takes_newcomer(peer: str, cost: float, kept: Mapping[str, float], k: int) -> bool:
    """Whether a relay that keeps next-stage links `kept` links to a next-stage relay `peer` that arrived since."""
    return peer in kept or peer in nearest({**kept, peer: cost}, k)


def refill(kept: Iterable[str], candidates: Mapping[str, float], k: int) -> dict[str, float]:
    """The next-stage relays to link to now (peer -> cost): the cheapest `candidates` not kept, up to `k` links."""
    kept = set(kept)
    if k <= 0:
        return {p: c for p, c in candidates.items() if p not in kept}
    room = k - len(kept)
    if room <= 0:
        return {}
    return nearest({p: c for p, c in candidates.items() if p not in kept}, room)


def chosen(relay: str, nxt: Mapping[str, float], prv: Mapping[str, float], k: int) -> set[tuple[str, str]]:
    """The links `relay` chooses, as (upstream, downstream): its `k` cheapest of `nxt` (next-stage relays -> link
    cost) and of `prv` (previous-stage relays)."""
    return {(relay, b) for b in nearest(nxt, k)} | {(a, relay) for a in nearest(prv, k)}


def joiner_links(joiner: str, nxt: Mapping[str, float], prv: Mapping[str, float],
                 kept_next: Mapping[str, Mapping[str, float]], k: int) -> set[tuple[str, str]]:
    """The links of a relay that arrives later: those it chooses, and those of the previous-stage relays that take
    it (`takes_newcomer` over `kept_next[a]`, the next-stage links relay `a` keeps; a relay missing from
    `kept_next`, another newcomer, links by its own choice alone)."""
    return chosen(joiner, nxt, prv, k) | {(a, joiner) for a, c in prv.items()
                                          if a in kept_next and takes_newcomer(joiner, c, kept_next[a], k)}


def adjacent_relays(scenario: Scenario, nid: str, step: int) -> dict[str, float]:
    """`nid`'s links in `scenario` to the relays of the stage `step` after its own (-1: before), by link cost."""
    st = scenario.node(nid).stage
    return {p: l.cost for p, l in scenario.neighbours(nid).items()
            if not scenario.node(p).is_data and scenario.node(p).stage == st + step}


def bound_links(scenario: Scenario, k: int) -> Scenario:
    """`scenario` with the relay-to-relay links neither end chose dropped (`chosen`); data nodes' links all stay.
    The scenario itself when no link goes."""
    keep = set()
    for r in scenario.relays:
        keep |= chosen(r.id, adjacent_relays(scenario, r.id, 1), adjacent_relays(scenario, r.id, -1), k)
    links = tuple(l for l in scenario.links if scenario.node(l.a).is_data or scenario.node(l.b).is_data
                  or scenario.node(l.a).stage == scenario.node(l.b).stage
                  or (l.a, l.b) in keep or (l.b, l.a) in keep)
    if len(links) == len(scenario.links):
        return scenario
    return Scenario(scenario.name, scenario.stages, scenario.nodes, links, scenario.activation_mb)

"""The flow machine's configuration: what a node knows at start, and the knobs of every mechanism.

Frozen: a membership change replaces `FlowNode.cfg` with a copy (read
`node.cfg.next_costs`, not the mapping handed in at construction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

T0_DEFAULT = 1.7  # the paper's initial temperature (section V-C)
ALPHA_DEFAULT = 0.95  # the paper's cooling factor
T_MIN_DEFAULT = 0.05  # below this a worse move has p < exp(-20) for unit costs: stop exploring


@dataclass(frozen=True)
class FlowConfig:
    node_id: str
    is_data: bool
    capacity: int
    commodities: tuple[str, ...]  # the data nodes of the run
    next_costs: Mapping[str, float]  # linked peers of the next stage (data node: stage 0)
    prev_costs: Mapping[str, float]  # linked peers of the previous stage (data node: last stage)
    peers: tuple[str, ...] = ()  # same-stage relays known from discovery
    displace: bool = True  # IN labels may displace an upstream unit (residual backward edge)
    round_s: float = 1.0  # one round: each node ticks once
    path_announce_s: float = 0.1  # a changed route at an unchanged cost is announced at most this often
    launch_settle_s: float = 0.2  # data node: least wait after a unit settled (free-running) / OUT label still (waves)
    balance_grace_s: float = 0.3  # wait for the other half of an agreed move
    improve: bool | None = False  # Request Change / Request Redirect all the time (moves.py); None: on with several
    # data nodes.  Off: they lower the flow cost of setting 5 a little (formation 1.0243 -> 1.0217 of the LP bound,
    # re-formation after crashes 1.0987 -> 1.0548) but during training (sim train, Table II, 2 data nodes) they
    # cost time per microbatch (up to +9 %) for 5-58x the flow messages (docs/bench_flow.md)
    anneal: bool = False  # improvement moves also take worse moves by simulated annealing (t0, alpha): off, because
    # on top of ordered launches and relabelling the annealed moves raise the cost (docs/bench_flow.md)
    announce_coalesce_s: float = 0.02  # labels changed within this window go out in one CostAnnounce per peer
    launch_quiet_factor: float = 1.0  # data node: wait this x (the time the wave took to reach it) after its
    # last OUT label change
    noroute_grace_s: float = 0.5  # a relay with an unpaired unit and no route waits this long before a DENY
    waves: bool | None = None  # label waves per augmentation; None: only with a single data node (launches.py)
    same_wave_launches: bool = True  # waves: launch again on a wave while it still has a tight route (waves.py)
    formation_waits: bool = True  # waves: until the data node loses a unit or a neighbour goes, a unit moves on only
    # once the labels at its node are still (waves.py, "Formation waves").  Off: at 1000 x 16 the flows of seeds
    # 1-3 stall below the maximum (docs/bench_flow.md, "Other seeds, and formation waves")
    reform_free_back: bool = True  # waves, after a removal or a cost change: handing a unit back costs 0 (labels.py).
    # Off: the flows left by a change can hold a negative cycle, the labels fall around it, and re-formation after
    # flaps or crashes misses the maximum flow (docs/bench_flow.md, "Flaps")
    wave_order_s: float = 0.005  # waves: a label L above its previous wave's floor F goes out (L - F) x this later
    # (at most announce.WAVE_ORDER_CAP_S later)
    label_limits: bool = False  # label waves: a relay's IN labels go only to the previous-stage peers whose choice
    # they can change (limits.py).  Off: exact, 9167 -> 4420 messages per node at 1000 x 16, but more messages
    # than without on Table V settings 1, 2, 4 and slower re-formation after crashes (docs/bench_flow.md)
    label_limit_slack: float = 2.0  # ... a limit is the peer's threshold plus this, less the link's cost
    label_limit_step_s: float = 0.5  # ... without a usable forward candidate, the limits rise in steps this apart
    retry_epoch_rounds: float = 5.0  # several data nodes: a data node without a route starts a new wave this often
    joined: bool = False  # placed into a run whose flows already formed: run greedy moves at start (node.py)
    change_improve_rounds: float = 20.0  # rounds of Request Redirect/Change after joining / a membership change
    anneal_after_change: bool = False  # ... taking worse moves by annealing too, the temperature back at t0
    ordered_launches: bool | None = None  # several data nodes: the cheapest launch goes first (LaunchBid); None: on
    # with several data nodes and free-running labels (bids.py)
    ordered_coalesce_s: float = 0.01  # ordered launches: free-running labels go out at most this often (0: at once)
    coalesce_backoff_max_s: float = 0.0  # ... and while they keep changing, twice as long after each flush that
    # came within twice the window of the previous one, up to this (announce.py; 0 or below the window: off).  Off:
    # at 0.04 s it halves the messages of Table VI at 36 nodes and quarters them at 72 at about the same time per
    # microbatch, but the flows of `sim flow` setting 6 (4 data nodes, 8 stages) cost 3 % more
    # (docs/bench_optimality.md)
    relabel: bool | None = None  # several data nodes: first-stage relays turn a unit into another data node's when
    # that data node's first and last hops are cheaper (Relabel); None: on with several data nodes (relabel.py)
    relabel_limit: int = 4  # relabels a first-stage relay starts at most (two of them could undo each other's)
    cross_displace: bool = True  # relabelling on: an IN label may displace another data node's unit (relabel.py)
    cross_limit: int = 1  # ... at most this many times per relay (stale labels can make them chase each other)
    ordered_settle_s: float = 1.0  # ordered launches: launch_settle_s for them (labels still before the next bid)
    bid_patience_rounds: float = 5.0  # ordered launches: a cheaper bid unchanged for this long no longer holds us back
    cycles: int | None = None  # several data nodes: once the flows stand, cycles through a data node, with this
    # many trials per data node (cycles.py); None: off.  Off: with 2, setting 6 1.0655 -> 1.0589 of the LP bound
    # on the tuning seeds 0-9 (seed 3 dearer), 1.0816 -> 1.0776 on seeds 200-219 (worst 1.1726 -> 1.1767), for
    # 2.2-2.7x the flow messages: far from the bound (`python scripts/bench_flow.py --cycles 2`)
    t0: float = T0_DEFAULT  # annealing: initial temperature (moves.Annealer)
    cooling: tuple[float, float] = (ALPHA_DEFAULT, T_MIN_DEFAULT)  # ... the factor per accepted move, and the
    # temperature below which no worse move is taken


FORMED_QUIET_S = 3.0  # a data node starts pushing once its flows have not changed for this long (some placed)
FORMED_WAIT_S = 60.0  # ... or after this long, whatever is placed


def flows_formed(placed: int, demand: int, quiet_s: float, waited_s: float) -> bool:
    """A data node's flows are formed enough to start pushing microbatches (the daemon and the simulator).

    Its whole demand is placed, or some of it is and the flows have not changed
    for `FORMED_QUIET_S`, or it has waited `FORMED_WAIT_S` (whatever is placed:
    a microbatch with no unit waits for one)."""
    return placed >= demand or (placed > 0 and quiet_s > FORMED_QUIET_S) or waited_s >= FORMED_WAIT_S

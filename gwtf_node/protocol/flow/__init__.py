"""Flow formation: the decentralized min-cost flow of GWTF (section V-C).

A *unit* of flow is one microbatch slot on a route data node -> one relay per
stage -> the same data node.  Units are fungible within a *commodity* (the
data node they return to).  Each node runs one `FlowNode`, which knows only
its own links, its same-stage peers and what they tell it; the flows form back
to front from cost-to-sink labels, and a data node launches one unit at a
time along a shortest augmenting path of the residual network (successive
shortest paths).  One module per mechanism:

* config.py: `FlowConfig`, what a node knows at start and every knob;
* state.py: the vocabulary (route, request and step kinds, unit counts);
* labels.py: IN / OUT labels over the residual network, folded in in O(1);
* announce.py: which labels go out, to whom and when (coalesced, Dijkstra order);
* limits.py: label limits, IN labels only to the peers whose choice they can change (off by default);
* units.py: Request Flow, DENY, Reroute, Withdraw, and rebalancing;
* launches.py: the data node's launches, label waves, settlement;
* waves.py: several units per wave, retreats, held units;
* bids.py: ordered launches across data nodes (`LaunchBid`);
* relabel.py: relabelling and cross displacement across data nodes;
* cycles.py: once the flows stand, cycles through a data node (exchanges across data nodes, off by default);
* moves.py: Request Change / Request Redirect with simulated annealing (`Annealer`);
* node.py: `FlowNode`, the entry points and membership changes;
* pool.py: pooled formation, several data nodes' units formed as one commodity (`PoolMachine` around each
  `FlowNode`), then sent home (homing.py: suffix swaps and exchanges over the units' paths).

Each mechanism owns its state, one dataclass (`LabelState`, `UnitState`,
`WaveState`, ...) that `FlowNode` holds and that only the module defining it
changes; the others read it or call that module's functions
(tests/protocol/test_state_owners.py checks it).

Measured quality and cost against the optimum: docs/bench_flow.md and
docs/bench_flow_churn.md.
"""


from .announce import send_all as _send_all
from .config import ALPHA_DEFAULT, FORMED_QUIET_S, FORMED_WAIT_S, T0_DEFAULT, T_MIN_DEFAULT, FlowConfig, flows_formed
from .moves import Annealer
from .node import FlowNode
from .state import FlowStats

__all__ = ["ALPHA_DEFAULT", "T0_DEFAULT", "T_MIN_DEFAULT", "Annealer", "FlowConfig", "FlowNode", "FlowStats",
           "_send_all"]

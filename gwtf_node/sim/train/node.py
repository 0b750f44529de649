"""One simulated node: the machines the daemon's node holds, and what the simulator keeps of it."""

from __future__ import annotations

from dataclasses import dataclass

from ...protocol.leader import LeaderMachine
from ...protocol.phases import Phases
from ...protocol.recovery import RecoveryNode


@dataclass(eq=False)
class SimNode:
    """A node of the simulated run (a data node or a relay), as the daemon's node holds its machines: the
    microbatch machine (`rec`), the aggregation phase (`phases`), a data node's election (`leader`, None on a
    relay), and when its compute queue is free (`busy_until`: its computations run one at a time, in the order
    they were started).  The stage each node serves is the run's directory (`TrainSim.stage`, crashed nodes
    included), not a node's own.  `presuming` says that its microbatch machine may hold a peer presumed dead and
    not reported gone, the only case in which the liveness check has anything to un-presume (`TrainSim._unpresume`):
    it is set when the machine's `presumed_dead` counter moved since `presumed_seen` (a hop deadline missed) or
    when a peer reported gone comes back as a neighbour, and cleared when the check finds no such peer."""

    id: str
    rec: RecoveryNode
    phases: Phases
    leader: LeaderMachine | None = None
    leader_seen: str | None = None  # the leader its Phases was last told of (data nodes)
    busy_until: float = 0.0
    presuming: bool = False  # its machine may hold a peer presumed dead, not gone (`TrainSim._unpresume`)
    presumed_seen: int = 0  # the machine's `stats.presumed_dead` when the simulator last looked

"""The task pool of the hybrid parameter-server design (section 3.2 of ../shared/papers/hybrid-ps-taskpool.txt) as
a third recovery policy of the training simulator: `sim train --policy taskpool`.

What the paper does.  Each stage has frontal servers (FS: they hold the
activations coming in) and backward servers (BS: they hold what goes out),
and unreliable clients do the stage's work.  Work is pulled: "if one client
completes its task faster, it can request additional activations".  When an
FS finds a client unresponsive (after a timeout) it posts the forward task to
the pool; when a BS gets no activations from a client it posts the task to all
FS; *any* client of the stage that finishes its work takes the next task from
the pool.  The re-execution rule: a client that takes a backward task asks the
BS for the gradient and the FS for the matching activation, *recomputes the
activation* and completes the backward.  Nothing is lost as long as the
servers live.

How it maps onto our pipeline.  There are no reliable servers per stage
here: the node that sent a microbatch into a stage keeps its output (the
stash, as GWTF's relays do) and plays the FS; the next stage's holder keeps
the gradient it sent back and plays the BS; the data node keeps the ledger.
So:

* *The pool instead of the flows*: a node hands its output to whichever live
  node of the next stage has a free slot, the one with the most free slots it
  knows of (its capacity minus what it sent there and is still held; a peer
  that refused, `MbDeny`, is skipped until it offers room again, `Room`), ties
  broken by the node's own seeded RNG: "any free node of the stage takes it".
  Link costs play no part and there are no flows or flow machines.  A task no
  node can take waits with its sender (parked) until a slot frees: the pool.
* *Posting after a timeout, and re-execution*: a hop deadline that passes
  posts the task again (the output is resent from the stash to a free node);
  a crashed holder of a microbatch in its backward pass is repaired with the
  re-execution rule: the holder of the stage before it sends its stashed
  activation to a free node of the crashed stage (`Recover`), which recomputes
  the stage's forward and completes the backward from the gradient the next
  stage kept (`Resume`).  These are the repair rounds of GWTF's microbatch
  machine (protocol/recovery/, "Backward pass, GWTF"), so the machine is
  GWTF's with its next-hop choice replaced (`PoolRouting.choose_next`); its
  ledger (nothing lost, nothing completed twice) is the same.
* Detection: the same as GWTF's (hop deadlines, the data node's watchdog and
  the membership layer's report, `gwtf_acts_on_gone`), so the column measures
  where the work goes (the pool, blind to the links) rather than how fast
  crashes are seen.

What the hybrid design has that is left out: its frontal servers split a
batch among clients in proportion to their computing power and its
parameter servers aggregate with delayed parameter updates; here every
microbatch is whole and the aggregation is the simulator's (all policies).
"""

from __future__ import annotations

from ...protocol.recovery import RecoveryNode
from ...protocol.recovery.routing import Routing
from .driver import TrainSim
from .options import TrainSimOptions


class PoolRouting(Routing):
    """GWTF's next-hop choice replaced by the stage's pool (module docstring)."""

    def choose_next(self, node: RecoveryNode, d: str, exclude: set, *, fresh: bool = False) -> str | None:
        if not node.is_data and node.stage == node.cfg.last_stage:
            return d
        free = []
        for j in self.live_next(node):
            if j in node.full or j in exclude:
                continue
            room = node.peer_cap.get(j, 1) - self.inflight(node, j)
            if room > 0:
                free.append((room, j))
        if not free:
            return None
        most = max(r for r, _ in free)
        return self.rng.choice(sorted(j for r, j in free if r == most))


class TaskPoolNode(RecoveryNode):
    """GWTF's microbatch machine whose next hop comes from the stage's pool (`PoolRouting`)."""

    routing_class = PoolRouting


class TaskPoolSim(TrainSim):
    """`TrainSim` with every node running `TaskPoolNode` (policy "taskpool")."""

    machine_class = TaskPoolNode

    def __init__(self, setting, options: TrainSimOptions) -> None:
        if options.policy != "taskpool":
            raise ValueError(f"TaskPoolSim runs the task pool, not {options.policy!r}")
        if options.routing != "machines" or options.flows is not None:
            raise ValueError("the task pool has no flows: no routing or flows option applies")
        super().__init__(setting, options)
        self.routing = "pool"

    def machine_policy(self) -> str:
        return "gwtf"  # GWTF's repair rounds carry the re-execution rule (module docstring)

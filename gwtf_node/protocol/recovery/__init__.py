"""Microbatch lifecycle with crash handling (sections V-D and V-E of the GWTF paper).

One `RecoveryNode` per node (data node or relay).  It is pure: it is handed
`now`, the events (messages, timers, finished computations) and a seeded
`random.Random`, and returns effects: `Send`, `SetTimer`, `CancelTimer` (see
`effects.py`), `Compute` (run a stage computation, then call
`on_compute_done`), `OpenIteration` (a data node opened an iteration) and
`IterationSettled` (a data node's microbatches of an iteration are all
completed or deferred: the driver reports it to the leader through
`phases.Phases`).  The simulator (`sim/train/`)
executes them in virtual time; the daemon runs the same machine with torch.

The invariant, and how it holds by construction
-----------------------------------------------
*The data node is the single owner of each of its microbatches' fate.*  A
ledger entry leaves INFLIGHT only at its data node, and only to COMPLETED
(the backward came back through the embedding) or DEFERRED (the data node
gave the attempt up: it is pushed again, as a new ledger entry, in the next
iteration).  Relays never decide a microbatch's fate; they execute, report
and answer.  Three rules make that safe:

1. *Attempt numbers.*  Every microbatch message carries the data node's
   attempt number (`attempt`).  A relay's record is stamped with the attempt
   that created it; a message of an older attempt than the record is stale
   and ignored, a newer `Forward` replaces the record.  The attempt changes
   only when the data node abandons one (SWARM's restart, or giving up) and
   then tells every node that reported holding it (`Release`).
2. *A watchdog per microbatch.*  While a microbatch is in flight its data node
   always has a timer armed for it (`wd`, or `pr` while it collects probe
   answers).  Every firing either sees progress, orders a repair, or, after
   `MAX_ROUNDS` rounds, gives the attempt up (DEFERRED).  So nothing is
   pending forever: no lost microbatch and no stalled iteration, whatever
   the crash schedule (tests/test_recovery.py checks it over random
   schedules with Hypothesis).
3. *Recovery decisions are made by the data node, from a snapshot.*  Every
   relay that takes a microbatch tells its data node (`MbState`, a small
   control message), so the data node knows each stage's holder.  On
   trouble it probes every holder of the path directly (`Probe`; answer
   `MbState` with what the relay holds: none | fwd | sending | sent | bwd |
   grad | done; no answer within `probe_wait_s` = dead) and decides from the
   answers, deterministically (`_decide`), which live node repairs what
   (`RepairOrder`).  No node guesses where the backward is, so no circular
   state.  Every action is idempotent (duplicates are ignored by phase), so
   a decision taken on a slightly stale snapshot is harmless.

Forward pass (both policies; V-D "as in SWARM")
-----------------------------------------------
A node that computed a stage sends `Complete` to the node it got the input
from, hands its output to a next hop and keeps it (the stash) until the
backward came back through it.  The hand-off waits for the next hop's
`Complete`: deadline `now + K * est(peer) * (1 + my hand-offs to that peer
still waiting) + MARGIN_S`, `est` an EWMA of measured hand-off -> Complete
times initialised from the prior of `priors.py` (the link's transfer plus a
compute allowance; the daemon and the simulator both use it).
No `Complete` in time: the next hop is presumed dead, its units of flow move
to live peers of its stage with room (local flow repair), and the output is
resent from the stash to another next hop (GWTF: along the flows; SWARM:
greedy).  A receiver without room answers `MbDeny`; a peer that sent
`MbDeny` gets no new work until it sends `Room` (a relay sends `Room` to
the peers it denied when a slot frees, when a next-stage peer sends it
`Room` or joins, never while it has no live next-stage peer).  With no next
hop that has room (or no live one at all), a relay *parks* the microbatch:
it keeps its output, its slot and any repair order, and tries again on a
`Room`, on a slot of its own freeing, on a next-stage joiner, or once after
a deadline (K x its slowest next-stage estimate, if a peer is left); that
retry failing, it sends `MbDeny` upstream and drops it (or, executing a
repair order, reports `BackwardStuck`); recursively up to the data node,
which parks it with its embedding output (a new attempt, the holders
released, no recompute) while others are in flight and retries on every
slot-freeing event (`_launch`), or defers it.  A data node whose recovery
finds every live stage-0 relay full parks it the same way.
Capacity counts microbatches whose activations
a node holds (taken until its backward is computed); the gradient a node
sent upstream is kept (one tensor, for recovery) until the microbatch is
released or the iteration aggregates.

Backward pass, GWTF (V-D)
-------------------------
The sink computes the loss and sends `Backward` to the last relay; each
relay computes its backward, adds the microbatch to its contributions, sends
`Complete` downstream and the gradient upstream, and waits for the upstream
`Complete`; missing: `BackwardStuck` to the data node (the paper's "it
notifies the data node").  The data node (on `BackwardStuck`, on its own
hop deadline, or on its watchdog) runs a *round*: probe, then `_decide`:

* g = the lowest stage whose holder has computed its backward (bwd, grad,
  done), else the sink.  Stages below g still need their stashed activation.
* A *bad* stage below g is one whose holder is dead or holds nothing.  For
  each run a..b of bad stages, the live holder of stage a-1 (the data node
  if a = 0) is ordered to send its stash (`Recover`) to a live node of stage
  a chosen by its flows; that node recomputes stage a's forward, goes on to
  stage a+1 the same way while it is bad, and at the first good stage sends
  `Resume`: that node links its upstream to the recovering node and, if it
  holds its gradient, resends it.  The order carries the holders after the
  run up to the next bad stage (`rest`), so if the node to resume at died
  meanwhile its stage is recomputed too and the chain resumes at the next
  one.  A `Resume` is a control message answered at once: its deadline is
  `probe_wait_s + margin_s`, and its answer is not a hand-off time sample.
  The backward resumes from the stored
  gradient: one stage forward recomputed per crashed stage, no pipeline
  restart.
* No bad stage: if stage g is computing, nothing to do; otherwise the
  gradient from g to g-1 got lost in a crash race: g resends it (`Resume`).
* Forward pass not at the sink yet: the highest live holder with a stash is
  ordered to resend it onward (its next hop acknowledged, then died).

Backward pass, SWARM (the paper's baseline)
--------------------------------------------
Greedy next hop (the cheapest live next-stage peer, SWARM's "closest node"),
assuming every peer has `swarm_assumed_capacity` slots (SWARM assumes equal
memory: a peer that has less answers `MbDeny` after the transfer); resend
after a forward timeout (same deadline rule).  Relays do not report backward
trouble (`BackwardStuck` is GWTF's); the data node detects a failed backward
by its own timeouts (its hop deadline, its watchdog: `K_E2E` x the measured
end-to-end time) and restarts the microbatch: a new attempt, `Release` of the
old one everywhere, the whole pipeline recomputed from the embedding.  With
`cfg.act_on_gone`, a data node told by the membership layer (`peer_gone`)
that a holder of a microbatch in its backward pass is gone acts at once
(SWARM: restart; GWTF: a round) instead of waiting for its timeouts; a
microbatch whose forward was still on its way to the sink when the report came
is acted on when its loss is computed (SWARM: restarted instead of sending the
gradient down a path that cannot carry it).

Lending (GWTF, `cfg.lend`; the simulator turns it on with the flow machines)
----------------------------------------------------------------------------
The flow machines place each data node's units first come, first served (on
the heterogeneous Table II settings a maximum flow of 4 is often split 1 / 3),
and a data node pushes its microbatches in waves on its own units, so the
iteration lasts as many waves as the smallest share needs while the other
data node's units sit idle once it is done.  With `lend`, unit by unit: a
data node with nothing left to launch in the iteration (nothing waiting or
parked) sends `Lend(iteration, hop)` to the other data nodes each time one of
its microbatches completes, naming the stage-0 relay of the unit that freed;
a receiver adds it to its own units at that relay for the iteration (so it
launches there while its count allows; a unit lent to two data nodes may
answer `MbDeny` to one of them, which then tries elsewhere or parks).  And a
relay with no free unit of a microbatch's data node uses a free unit of
another data node's flows before repairing locally (greedy), so the borrowed
microbatch follows the idle flow's path.  Lent units end with the iteration
(`_open` starts from the flows again).  Off by default; the daemon and the
simulator turn it on for GWTF.

Fastest unit first (GWTF, `cfg.fastest_unit`; on in the simulator and the daemon)
-------------------------------------------------------------------------------
The flows minimise the cost of the units, and a relay picks among its free
units the cheapest link; but the data node launches a microbatch, and what
matters to it is when the microbatch comes back.  A data node measures, per
stage-0 relay, the launch -> final time of its microbatches through it
(`rt`, an EWMA over those that needed no repair and no new attempt) and
launches each new microbatch on the free unit (own or lent) with the lowest
`rt` (a relay not measured yet counts as the data node's end-to-end
estimate; ties by link cost).  It is not a makespan plan: round trips
differ with the data node (a far data node's trips through the same unit are
longer), and a data node holding a microbatch back for its own fast unit
would lend that unit later (`--no-fastest-unit` in `sim train` measures it).

One wave (`cfg.one_wave`, off by default; the simulator's `one_wave`)
---------------------------------------------------------------------
The paper's reading of an iteration (V-D: DENY "can continue recursively up
to the source, which may defer the batch to the next iteration"): a data
node launches at the opening of the iteration what its first hops take and
defers the rest at once; a microbatch denied back to it is deferred instead
of parked; a relay with no next hop with room answers `MbDeny` upstream at
once instead of parking (a recovery chain or a repair order still parks: it
carries a microbatch in its backward pass).  Each iteration offers the
deferred microbatches first, topped up with new ones to `capacity`.

Bounded rounds
--------------
At most `MAX_ROUNDS` rounds (GWTF) or restarts (SWARM) per microbatch and
iteration, then the data node gives the attempt up: `Release` to every
holder, DEFERRED, pushed again next iteration.

Aggregation (V-E)
-----------------
The aggregation phase is `phases.Phases`, driven next to this machine by the
same driver (daemon or simulator).  This machine tells the driver when a data
node's iteration is settled (`IterationSettled`; `reported` holds the settled
iterations), and the driver tells it when BEGIN AGGREGATION of an iteration
arrived (`begin_aggregation`: a relay drops what is left of the iteration's
microbatches and names the contributions that count), when the step is
applied (`aggregation_done`) and when a data node opens the next iteration
(`open_iteration`).  A relay that began iteration t and has not applied its
step answers `MbDeny` to a microbatch of t+1 (its parameters are not t+1's
yet) and sends `Room` once its step is applied.

Contributions lost inside a crashed relay (the rule)
----------------------------------------------------
A relay accumulates the gradient of every microbatch whose backward it
computed (`contrib[iteration]`, a set: one contribution per key and node).
If it dies before its stage's all-reduce, those contributions die with it.
Rule: the stage's update is the sum of the gradients the survivors hold
divided by the number of microbatches they hold (`Compute.count`); the
microbatch stays COMPLETED and is *not* re-queued (the other stages learnt
from it; training them again would count it twice).  The driver counts these
cases (`lost_contributions`).  A `Release` drops the released attempt's
contributions (SWARM's restarted attempts, duplicate branches), so a
microbatch contributes at most once per stage among the nodes the data node
knows of.

A data node that dies (`peer_gone`, `_data_node_gone`) takes its
microbatches with it: relays drop them, and its contributions count only if
the leader had its report, i.e. only if the BEGIN of their iteration names
them (`orphaned`: a relay may hear of the death before or after the BEGIN
that names them; either way the whole pipeline counts the same).  Its report
to a leader that has not begun is dropped by `Phases.forget`.
"""

from .node import RecoveryNode
from .records import (
    EWMA_ALPHA, K_DEADLINE, K_E2E, MARGIN_S, MAX_ROUNDS, MB_MESSAGES, POLICIES, TIMERS, Compute, DataRecord,
    IterationSettled, Key, RecoveryConfig, RecoveryStats, RelayRecord,
)

__all__ = ["EWMA_ALPHA", "K_DEADLINE", "K_E2E", "MARGIN_S", "MAX_ROUNDS", "MB_MESSAGES", "POLICIES", "TIMERS",
           "Compute", "DataRecord", "IterationSettled", "Key", "RecoveryConfig", "RecoveryNode", "RecoveryStats",
           "RelayRecord"]

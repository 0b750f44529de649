"""Microbatch lifecycle with crash handling (sections V-D and V-E of the GWTF paper).

One `RecoveryNode` per node (data node or relay).  It is pure: it is handed
`now`, the events (messages, timers, finished computations) and a seeded
`random.Random`, and returns effects: `Send`, `SetTimer`, `CancelTimer` (see
`effects.py`), `Compute` (run a stage computation, then call
`on_compute_done`, or `on_compute_failed` where its inputs are gone: a relay
forgets the microbatch for its data node to repair, a data node defers it),
`OpenIteration` (a data node opened an iteration) and
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
   the crash schedule (tests/protocol/test_recovery.py checks it over random
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

Where each mechanism is described
---------------------------------
The machine is `RecoveryNode` (node.py), which composes one object per
mechanism, each the only writer of its state (node.py tells how), and each
module's docstring tells its part: next hops and deadlines (routing.py);
the neighbours and the driver's news of them (neighbours.py); the forward
pass, hand-off deadlines, denials and parking (relay.py); the backward pass
and its recovery rounds, GWTF's and SWARM's, and their bound (rounds.py);
lending, the fastest unit first and the one-wave iteration (data.py); the
aggregation phase, the contributions lost inside a crashed relay and a data
node that dies (node.py).
"""

from .data import DataRecord
from .node import RecoveryNode
from .records import (
    EWMA_ALPHA, K_DEADLINE, K_E2E, MARGIN_S, MAX_ROUNDS, MB_MESSAGES, POLICIES, TIMERS, Compute, ComputeKind,
    IterationSettled, Key, MbTimer, Policy, RecoveryConfig, RecoveryEffect, RecoveryStats, RelayPhase, Sink, Source,
    TimerKind,
)
from .relay import RelayRecord

__all__ = ["EWMA_ALPHA", "K_DEADLINE", "K_E2E", "MARGIN_S", "MAX_ROUNDS", "MB_MESSAGES", "POLICIES", "TIMERS",
           "Compute", "ComputeKind", "DataRecord", "IterationSettled", "Key", "MbTimer", "Policy", "RecoveryConfig",
           "RecoveryEffect", "RecoveryNode", "RecoveryStats", "RelayPhase", "RelayRecord", "Sink", "Source",
           "TimerKind"]

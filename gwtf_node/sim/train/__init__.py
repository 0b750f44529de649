"""`gwtf-node sim train`: training iterations with churn in virtual time (Table II of the GWTF paper).

Every node runs the daemon's pure machines: `protocol.recovery.RecoveryNode`
(its microbatches), `protocol.phases.Phases` (the aggregation phase) and, on
a data node, `protocol.leader.LeaderMachine` (the election); GWTF's nodes
also run `protocol.flow.FlowNode`.  This package only executes their effects
(`driver.py`, with `aggregation.py` and `flows.py`): messages over virtual
links, timers, and computations on a per-node FIFO compute queue, all events
in the queue of `sim/engine.py`.  `setting.py` holds the Table II setting,
`report.py` the metrics.

The Table II setting, as modelled here (our choices where the paper is vague)
---------------------------------------------------------------------------
* 18 nodes = 2 persistent data nodes + 16 relays.  The paper's "6 stages" are
  the data nodes' stage (embedding, 1 block, data, loss) plus 5 relay stages of
  3 blocks; relays per stage 4, 3, 3, 3, 3.
* Each data node pushes 4 microbatches per iteration.  Relay capacity
  (microbatches held at once) 4 (homogeneous) or uniform 1-3 (heterogeneous).
* Links: every node gets a location drawn from the 12 of
  `gwtf_node/data/geo12-links.json` (a copy of ../shared/data/geo12-links.json; latency, bandwidth as published; one
  location: 1 ms and 17 Gbit/s; the NL-London 2 Mbit/s entry, flagged there
  as a typo, is read as 2 Gbit/s).  A transfer on a directed link takes
  latency + size/bandwidth and links are FIFO (one transfer at a time).
* Sizes: activation of a microbatch (4 x 512 x 1024, fp32) = 8 MiB, times 32
  as the paper does to mimic larger models: 256 MiB; gradients the same.
* Compute: profiled from the real stages (`scripts/profile_stages.py`: the
  paper's LLaMA-like, d=1024, vocab 32000, microbatch 4 x 512, run with our
  `DataPart` / `RelayPart` on this machine's CPU; `gwtf_node/data/
  stage_profile.json`), with one absolute anchor since this CPU is not the
  paper's RTX A4000: a relay stage's forward (3 blocks on 2048 tokens, ~0.17
  TFLOP; an A4000 at ~7 TFLOP/s effective shared by ~3.6 logical nodes, 18
  nodes on 5 GPUs) FORWARD_S = 0.35 s; every other time is FORWARD_S times
  its measured ratio to the relay forward: the relay backward (~2.1 x), the
  data node's embedding + block forward (~0.33 x), its norm + head + loss
  with their backward at the sink (~3.3 x: the 32000-word head is the
  biggest matmul of the model) and its block + embedding backward (~0.7 x).
  (Before the profile these were FLOP guesses: backward 2 x, data node
  0.15 / 0.3 / 0.25 s.)  Communication dominates anyway (a 256 MiB hop at
  ~100 Mbit/s is ~20 s).
* Aggregation: the data nodes elect their leader (`LeaderMachine`, its
  heartbeats and votes as control messages); a data node whose iteration is
  settled reports it (`IterationDone`) to the leader it knows, and the
  acting leader's BEGIN AGGREGATION, the relays' passing it on and CAN TAKE
  are `Phases`' messages, resent until acknowledged.  The leader names the
  members of every stage it knows (not reported gone).  A step is the
  daemon's within-stage all-reduce (owner-based reduce-scatter and
  all-gather of the stage's fp32 gradient over the links, 2 (n-1)/n of it
  sent and received per member; redone among the survivors when a member
  dies before doing its part) and the optimizer step (`allreduce.py`).  A
  node left out of an aggregation or out of step loads its stage's state
  from a group member (`resyncs`, `joining.py`).
* Timing priors: the recovery machines' first hand-off and end-to-end
  estimates are the daemon's rule (`protocol/recovery/priors.py`: the link's
  transfer plus a compute allowance); `priors="modelled"` gives them the
  peer's profiled compute times its capacity instead.
* Churn P: at the start of every iteration each live relay crashes with
  probability P at a uniform random time within the length of the previous
  iteration (so in the forward pass, the backward pass or the aggregation).
  A crashed relay's machine comes back REJOIN_S later as a new node and
  joins as the daemon's do (`joining.py`: it asks the elected leader, whose
  membership machine places it, possibly in another stage, and names a
  state source; the state after the current iteration's step comes over the
  link; then its neighbours take it).  A stage whose members all died has
  no state left to hand over after iteration 0, so it stays empty (the
  daemon brings such a stage back only from a relay's checkpoint): churn
  spares the last live relay of a stage, as `gwtf-node local --churn` spares
  a relay of every stage (`spare_last`, default on; scripted crashes are
  never spared).
  `joining="restart"`: the model before, the relay back in its own stage
  with the state of a live stage peer (or from nowhere if none is left),
  announced as soon as its download finished if the iteration is in
  training (`join_mid_iteration`), else when the next iteration opens.
* Membership (both policies): every live node learns of a crash DETECT_S
  after it (the daemon's liveness check: pings every 1 s, dead after 6 s of
  silence; `RecoveryNode.peer_gone`, `Phases.forget`; `detect_s=60`,
  heartbeats or DHT entries expiring, is a bench row): no more work goes to
  the dead node and nobody waits for it in an aggregation.  With
  `detect=False` only the aggregation phase hears the report (the all-reduce
  needs its live group); the microbatch and flow machines find the crash by
  their own timeouts.  Like the daemon's liveness check, a node that presumed
  a peer dead on a hop deadline and still hears it (the peer is alive, or
  crashed less than SILENCE_S ago) un-presumes it (`RecoveryNode.peer_alive`;
  `unpresume`, default on).  A data node then acts at once on a microbatch
  in its backward pass whose stage held by the dead node has not reported
  its backward yet: SWARM restarts it (`swarm_reacts_to="membership"`, the
  default and the generous reading of SWARM; "timeouts": it waits for its own
  backward timeout, the paper's description of its baseline), GWTF runs a
  repair round (`gwtf_acts_on_gone`, default on as in the daemon; off, it
  waits for its relays' BackwardStuck).

Flow routing (GWTF, `routing="machines"`, the default): every node runs its
flow machine (`protocol/flow/`'s `FlowNode`) inside this virtual time, next
to its microbatch machine, as the daemon does (`runtime/node.py`,
`runtime/flows.py`, `runtime/microbatches.py`).  Each machine knows only what discovery gives it: its
links to the live adjacent stages (cost d(i, j) of Equation 1, as
`_scenario`'s links), its live same-stage relays and the data nodes.  Flow
messages are control messages (one-way link latency, no tensor queue); timers
are the machine's own (round_s 1 s).  The relays' microbatch machines get
their flow machine's `out` whenever it changed (`RecoveryNode.set_flows`,
as the daemon's microbatch component); a data node opens iteration 0 once its
flows are formed (`protocol.flow.flows_formed`, the daemon's predicate).  A
crash: the membership report (DETECT_S after it) makes every live machine
linked to the dead node call `remove_neighbour` (as the daemon's components
do); a joiner starts a machine with `FlowConfig.joined`
and its neighbours `add_neighbour` it when it is announced.  Nothing is
recomputed globally: the flows after a change are the machines' own work.
Until the machines moved a unit, a relay repairs locally (protocol/recovery/: a
presumed-dead next hop's units move to live peers with room).  The
machines run with flow/'s defaults, as the daemon's do (FLOW_OPTIONS).  What this costs GWTF against the oracle below: the machines'
flows after iteration 0 cost 1.037 / 1.014 x the optimum for the same units per data node in the
homogeneous / heterogeneous setting (seeds 0-9, no churn; worst 1.20 / 1.05; with label waves 1.022 /
1.010, worst 1.12 / 1.05), they re-form only
after the membership report, and the units are split between the two data
nodes first come first served (e.g. 1 and 3 units of a maximum flow of 4),
so the iteration would last as many waves as the smaller share needs: with
`lend` (default on) a data node with nothing left to launch lends each unit
as it frees (`Lend`; protocol/recovery/, "Lending"; protocol messages, no global
knowledge), as the daemon does.
`routing="oracle"` (the model before the machines ran, for comparison): the
optimal multi-commodity routing of `baselines.optimal_routing`
(`initial_flows`), the relays' capacity shared fairly among the data nodes
with microbatches left, installed on every node at the start and
FLOW_CONVERGE_S after every change (a crash, joiners, a data node done: its
units lent to the others); `reflow=False`: its initial flows and local
repairs only.
DT-FM (`routing="dtfm"`, `sim train --routing dtfm`, Table VI settings `table6-xK`): DT-FM's scheduler
(`sim/schedule/`) places the relays in stages and forms one pipeline per data node before the run; GWTF's
microbatch machine follows those pipelines as fixed flows (no flow machine, no lending) and the schedule is
recomputed after each membership report, its CPU time as the delay (`sim/schedule/routing.py`).
The task pool (`policy="taskpool"`, `taskpool.py`): GWTF's microbatch machine whose next hop is any free node
of the next stage, blind to links, with no flows.
SWARM: no flows, greedy next hop (the cheapest link), assuming every relay has
the homogeneous capacity (4): SWARM assumes equal memory (paper, section I),
so in the heterogeneous setting a relay with less room answers DENY after the
transfer and the sender tries the next cheapest; with none left it keeps its
output until one has room (parks, as GWTF's relays do: SWARM's peers queue
requests rather than drop them).  Detection of a failed backward is by the
data node's own timeouts (its hop, its end-to-end watchdog) or the
membership layer (above), then the whole pipeline is recomputed
(protocol/recovery/).  This is SWARM as the GWTF paper defines it.  Checked
against SWARM as published (Ryabinin et al. 2023 and its code,
yandex-research/swarm: `moe/client/balancer.py`, `balanced_expert.py`), the
differences all favour published SWARM, so none was added to this baseline:
its trainers pick the next server by interleaved weighted round-robin over
measured throughput (load balancing, not the closest link); servers queue
requests (no memory refusal: they keep no activations, the trainer does);
and a backward is sent with the saved input to any live server of the stage
(recomputed there, retried on another one on error or timeout), i.e. a
per-stage retry, not a pipeline restart.  Why the paper's SWARM loses
throughput at 0% churn in the heterogeneous setting (2.96 vs 3.6 microbatches
per iteration in Table II; both far below 8): there an iteration is one wave
and a microbatch that finds no relay with memory is deferred, and SWARM,
assuming equal memory, sends to full relays; in this model (both policies) a
data node keeps a denied microbatch with its output (parks) and relaunches it
when a slot frees, so every iteration completes its 8 microbatches in several
waves, and SWARM's misdirected sends cost it only the refused transfers.
That is a choice made for both policies (no recomputed embedding, nothing
deferred), not a SWARM behaviour, so it stays.  `one_wave=True` (`sim train
--one-wave`) runs the paper's reading instead, for both policies (protocol/recovery/,
"One wave"): there GWTF completes its maximum flow per iteration (~4.3 of 8 in
the heterogeneous setting) while SWARM, whose refused microbatches are retried
hop by hop until slots free, completes ~7.3, so the paper's throughput gap does
not appear in this model either (docs/bench_churn.md).

Metrics per iteration (means over iterations are reported)
----------------------------------------------------------
* time per microbatch: the longest iteration over the data nodes (open to
  next open, aggregation included) / microbatches completed in it (an
  iteration that completes none is left out of the mean);
* throughput: microbatches completed end to end in the iteration;
* communication time: seconds of tensor transfers (forward, backward,
  recovery; resends included) of the iteration's microbatches, per completed
  microbatch;
* wasted compute: compute seconds spent on the iteration's microbatches minus
  the compute of the completed ones along their final path (stage forward +
  backward per stage, data node work): so it counts dead attempts, SWARM's
  recomputed pipelines, GWTF's recomputed stage forwards (one per crashed
  stage), work done for microbatches that were deferred and duplicate
  branches.  Not in it: the backward of a completed microbatch whose
  gradient then died with its relay before the all-reduce (the same for both
  policies, a matter of when the crash falls, not of recovery): reported
  apart as `lost_contribution_compute_s`;
* lost microbatches: ledger entries neither completed nor deferred once an
  iteration closed, plus microbatches completed twice (must be 0);
* lost contributions: gradients of completed microbatches that died with a
  relay before its stage's all-reduce (see the rule in protocol/recovery/).

`TrainSim.trace`: set it to a list before `run` to record every computation,
tensor transfer, control message, crash, iteration open and completed path
(tuples, see `_apply`, `_trace_compute`): docs/bench_churn.md's analyses.
"""

from __future__ import annotations

import time

from .driver import TrainSim
from .options import TrainSimOptions
from .joining import JOININGS
from .events import (
    LEADER_MSGS, PHASE_MSGS, TENSOR_MSGS, ComputeDone, Crash, Deliver, EventQueue, FlowDeliver, FlowTimer, Gone, Halt,
    JoinLookup, JoinTimer, LeaveWaited, MachineTimer, Reflow, Rejoin, SimEvent, StateArrives, StepRetry,
)
from .setting import (
    ACTIVATION_MB, ALLREDUCE_TIMEOUT_S, BACKWARD_S, DAEMON_DETECT_S, DATA_FINAL_S, DATA_FWD_S,
    DATA_LOSS_S, DATA_NODES, DETECT_S, FLOW_CONVERGE_S, FLOW_OPTIONS,
    FORWARD_S, IDEAL_MB_S, LINKS_FILE, MAX_SIM_S_PER_ITERATION, MICROBATCHES, OPTIMIZER_STEP_S, PRIOR_RULES,
    PROFILE_FILE, REJOIN_S, ROUTINGS,
    SETTINGS, SILENCE_S, STAGE_SIZES, STAGE_STATE_MB, SWARM_REACTIONS, Net, Setting, compute_s, gradient_mb,
    initial_flows, make_net, make_setting,
)
from .setting import (
    GEO12_REGIONS, GEO12_SETTINGS, TABLE6_SCALES, TABLE6_SETTINGS, make_geo12, make_table6, swarm_placement,
)

# given: the setting's stages (relays started with `--stage N`); dtfm: DT-FM's search's; swarm: place_swarm's;
# opfence: FusionLLM's OP-Fence's (sim/schedule/opfence.py)
PLACEMENTS = ("given", "dtfm", "swarm", "opfence")

# taskpool: the hybrid design's task pool (taskpool.py); random: SWARM's machinery with random next hops (the
# daemon's --policy random)
POLICIES = ("gwtf", "swarm", "taskpool", "random")
TASKPOOL_POLICIES = ("taskpool",)


def run_train(setting: str, policy: str, churn: float, iterations: int, seed: int, *, breakdown: bool = False,
              data_nodes: int | None = None, dtfm_options: dict | None = None, scheduler_cost: bool = False,
              **options) -> dict:
    """One run; `options` are the other fields of `TrainSimOptions` (routing, reflow, lend, flow_options, detect,
    join_mid_iteration, swarm_reacts_to, gwtf_acts_on_gone, unpresume, can_take, one_wave, ...: options.py).
    `data_nodes`: None for the setting's own number.  `routing="dtfm"`: DT-FM's scheduler (`sim/schedule/`,
    `dtfm_options`: its method, population, generations) arranges the setting first and the run follows its
    pipelines; the report gets `dtfm` (the schedule's cost and CPU time).  `placement="dtfm"`: the relays take
    the stages DT-FM's search gives them (its placement alone), and the run routes as `routing` says (GWTF's
    flows by default): the two routings compared on DT-FM's placement.  `placement="swarm"`: every relay in
    the stage the leader gives a swarm forming from scratch (`protocol/swarmplace.place_new_swarm` over every
    link's cost, `setting.swarm_placement`).  `placement="opfence"`: every relay in the stage FusionLLM's
    OP-Fence gives it (`sim/schedule/opfence.py`); `routing="dtfm"` with `dtfm_options={"method": "opfence"}`
    runs OP-Fence's own fixed pipelines instead (recomputed after each membership report, as DT-FM's).
    `breakdown`: trace the run and add `waste_breakdown_s` (seconds per iteration by cause,
    `TrainSim.waste_breakdown`).  `scheduler_cost`: add `flow_cpu_s` and `flow_formation` (CPU times: they
    differ from run to run, so they are not in the report by default), and with `placement="swarm"`
    `placement_cpu_s` (the whole-swarm placement's; OP-Fence's with `placement="opfence"`)."""
    s = make_setting(setting, seed, data_nodes)
    sched = None
    placement = options.pop("placement", "given")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: one of {PLACEMENTS}")
    if placement == "dtfm":  # GWTF's flows over the stages DT-FM's search gave the relays
        from ..schedule.routing import dtfm_routing

        s = dtfm_routing(s, seed, **(dtfm_options or {})).setting
    elif placement == "swarm":  # every relay placed at once by protocol/swarmplace.py
        t0 = time.process_time()
        s = swarm_placement(s)
        placement_cpu_s = time.process_time() - t0
    elif placement == "opfence":  # GWTF's flows over the stages OP-Fence gave the relays
        from ..schedule.routing import opfence_placement

        s, placement_cpu_s = opfence_placement(s, seed)
    if options.get("routing") == "dtfm":
        from ..schedule.routing import dtfm_routing

        sched = dtfm_routing(s, seed, **(dtfm_options or {}))
        s = sched.setting
        options["scheduler"] = sched
    opts = TrainSimOptions(policy=policy, churn=churn, seed=seed, **options)
    if policy in TASKPOOL_POLICIES:
        from .taskpool import TaskPoolSim

        sim = TaskPoolSim(s, opts)
    else:
        sim = TrainSim(s, opts)
    if breakdown:
        sim.trace = []
    sim.run(iterations)
    rep = sim.report(iterations)
    if scheduler_cost:
        rep["flow_cpu_s"] = sim.flow_cpu_s
        rep["flow_formation"] = dict(sim.formation)
        if placement in ("swarm", "opfence"):
            rep["placement_cpu_s"] = placement_cpu_s
    if sched is not None:
        rep["dtfm"] = dict(sched.schedule.to_json(), recomputations=sched.recomputations)
    if breakdown:
        n = max(1, sum(1 for p in rep["per_iteration"] if p["finished"]))
        rep["waste_breakdown_s"] = {k: v / n for k, v in sim.waste_breakdown(iterations).items()}
    return rep

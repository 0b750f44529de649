"""`gwtf-node sim train`: training iterations with churn in virtual time (Table II of the GWTF paper).

Theory of operation.  `TrainSim(setting, options)` (driver.py) runs one training job over a `Setting`
(setting.py: the nodes, their stages and capacities, the links, the profiled compute times) as one
`TrainSimOptions` (options.py) says: the policy, the churn and the seed, scripted crashes, and the model
switches, each defaulting to what the daemon does.

* Nodes.  Every simulated node is a `SimNode` (node.py) holding the machines the daemon's node holds:
  `protocol.recovery.RecoveryNode` (its microbatches), `protocol.phases.Phases` (the aggregation phase) and,
  on a data node, `protocol.leader.LeaderMachine` (the election), plus its compute queue.  GWTF's nodes also
  run `protocol.flow.FlowNode` (flows.py); joiners and the leader's placement run `protocol.membership`'s
  machines (joining.py).  The simulator writes into none of them: it hands them events and the time.
* Events.  One queue (events.py) holds typed, frozen events (`Deliver`, `MachineTimer`, `ComputeDone`,
  `Crash`, `Gone`, ...) in (virtual time, push order); `TrainSim.run` takes them out and hands each to the
  handler its type names in one table.  A timer event carries the version of its key when it was set, so a
  timer set again or cancelled since fires as nothing.
* Effects.  What a machine returns (send this message, set this timer, start this computation, open this
  iteration, step) is carried out through the simulator's `protocol.driver.Driver`, one `SimDriver` per
  (node, machine) in interpret.py, as each of the daemon's components carries out its own.  A
  tensor message waits for its directed link (FIFO) and takes latency + size / bandwidth; a control message
  takes the link's latency; a computation waits for its node's compute queue and takes its profiled time.
* Mechanisms.  The simulator's own models of what happens around the machines are kept by mechanism:
  churn.py (crashes, leaves, the pause while a stage is empty), aggregation.py (the phase and the
  election), allreduce.py (the step's within-stage all-reduce), flows.py (flow machines, or an oracle's or
  DT-FM's flows; pooled and scaled formation first: pooling.py, scaled.py), joining.py (joiners, stage
  states), report.py (the metrics).  taskpool.py is a third
  recovery policy (the hybrid design's task pool).
* Determinism.  Every RNG is seeded from the options; the same options give the same run, bit for bit
  (scripts/golden_train.py checks the reports of a matrix of runs against stored hashes).

What is modelled, the choices made where the paper is vague, the baselines (oracle routing, DT-FM, the task
pool, SWARM) and the metrics: docs/sim_train.md.
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
    FORWARD_S, IDEAL_MB_S, IDLE_DETECT_S, LINKS_FILE, LOOSE_S_PER_PEER, MAX_SIM_S_PER_ITERATION, MICROBATCHES,
    OPTIMIZER_STEP_S, PRIOR_RULES, PROFILE_FILE, REJOIN_S, ROUTINGS,
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
        if sim.options.pooled_formation:
            rep["flow_formation"]["pooled"] = dict(sim.pool_stats)
        if sim._scaled:
            rep["flow_formation"]["scaled"] = sim.scaled_stats()
        if placement in ("swarm", "opfence"):
            rep["placement_cpu_s"] = placement_cpu_s
    if sched is not None:
        rep["dtfm"] = dict(sched.schedule.to_json(), recomputations=sched.recomputations)
    if breakdown:
        n = max(1, sum(1 for p in rep["per_iteration"] if p["finished"]))
        rep["waste_breakdown_s"] = {k: v / n for k, v in sim.waste_breakdown(iterations).items()}
    return rep

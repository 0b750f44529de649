"""What one training simulation runs: the run's identity (policy, churn, seed), the scripted faults, and the
simulator's model switches, one frozen `TrainSimOptions` handed to `TrainSim(setting, options)`.

Every switch's default is what the daemon does; a switch set the other way names a model the simulator keeps
for comparison (the figures in docs/ say which).  `TrainSimOptions` checks what it can on its own (the named
choices, DT-FM's routing with its scheduler); `TrainSim` resolves what depends on the policy (`resolved`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...protocol.phasefan import FAN_OUT
from ...protocol.phases import CanTakeRule
from ...protocol.phasewaits import WAIT_BOUND_S
from .joining import JOININGS
from .setting import (
    DETECT_S, FLOW_OPTIONS, IDLE_DETECT_S, LOOSE_S_PER_PEER, MIDDLE_DATA_DETECT_S, PRIOR_RULES, ROUTINGS, SWARM_REACTIONS,
)


@dataclass(frozen=True)
class TrainSimOptions:
    """One training simulation's options (module docstring)."""

    policy: str = "gwtf"  # the microbatch machines' policy: "gwtf", "swarm", "random" ("taskpool": TaskPoolSim)
    churn: float = 0.0  # the chance that a relay crashes during an iteration
    seed: int = 0  # seeds every machine's RNG and the crash draws
    crash_plan: tuple = ()  # scripted crashes: (virtual time, node id) pairs
    rejoin: bool = True  # a crashed relay comes back (after REJOIN_S)
    flows: dict | None = None  # fixed flows installed as an oracle would (no flow machines)
    reflow: bool = True  # oracle and dtfm routing: re-install the optimum FLOW_CONVERGE_S after a change
    detect: bool = True  # the membership layer reports crashes to the flow and microbatch machines
    join_mid_iteration: bool = True  # `joining="restart"`: a joiner serves the iteration in training at once
    swarm_reacts_to: str = "membership"  # what makes a SWARM data node restart a microbatch (SWARM_REACTIONS)
    gwtf_acts_on_gone: bool = True  # a GWTF (or task pool) machine acts on the membership layer's report
    routing: str = "machines"  # "machines": GWTF's flow machines; "oracle": the LP optimum; "dtfm": DT-FM's
    flow_options: dict | None = None  # FlowConfig fields of every flow machine (None: FLOW_OPTIONS)
    # GWTF's flow machines: a bound K > 0 on each relay's flow (and so microbatch) links, as the daemon's
    # `--flow-neighbours K` (protocol/neighbourhood.py); 0: every relay of the adjacent stages; None, the daemon's
    # default: auto's choice (`auto_flows`)
    flow_neighbours: int | None = None
    # several data nodes form their flows pooled first (pooling.py), as the daemon's `--pooled-formation` (off)
    pooled_formation: bool = False
    # one data node forms its flows by cost scaling first (scaled.py), as the daemon's `--scaled-formation`
    # (True) and `--waves-formation` (False); None, the default: auto's choice
    scaled_formation: bool | None = None
    lend: bool = True  # machines routing: the lending of protocol/recovery/
    one_wave: bool = False  # the paper's one-wave iteration with deferral ("One wave", protocol/recovery/)
    detect_s: float = DETECT_S  # how long after a crash the membership layer reports it
    middle_data_detect_s: float = MIDDLE_DATA_DETECT_S  # ... a data node's to the relays of middle stages
    idle_detect_s: float = IDLE_DETECT_S  # ... a relay's to the relays near it that do not work with it (churn.py)
    loose_per_peer_s: float = LOOSE_S_PER_PEER  # ... both later for a watcher with many loose peers (0: never)
    fastest_unit: bool = True  # GWTF's "Fastest unit first" (protocol/recovery/)
    unpresume: bool = True  # a peer presumed dead that is still heard is alive again
    can_take: str = CanTakeRule.ALL.value  # phases.CanTakeRule
    phase_fan_out: int | None = FAN_OUT  # parents per stage member of the phase signals (phasefan.py; None: all)
    begin_groups: str = "digest"  # BEGIN's groups once per receiver, then by digest (phasegroups.py); "full": always
    scheduler: object = None  # routing "dtfm": a `sim.schedule.routing.DtfmRouting` built on the setting
    priors: str = "links"  # "links": the daemon's timing priors (recovery/priors.py); "modelled": `TrainSim._prior`
    joining: str = "machines"  # "machines": a relay back joins through the leader; "restart": back in its stage
    spare_last: bool = True  # churn spares the last live relay of a stage
    pause_empty: bool = True  # a data node does not open an iteration while a stage is empty (churn.py)
    join_links: bool = True  # JoinRequest and UtilizationReport carry link costs (joining.py)
    phase_wait_bound_s: float | None = WAIT_BOUND_S  # a phase wait past it is resolved (None: never)

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, not {self.routing!r}")
        if (self.routing == "dtfm") != (self.scheduler is not None):
            raise ValueError("routing 'dtfm' runs DT-FM's schedule: pass scheduler= (sim.schedule.dtfm_routing), "
                             "and only with that routing")
        if self.routing == "dtfm" and self.policy != "gwtf":
            raise ValueError("routing 'dtfm' executes a schedule with the gwtf microbatch machine, "
                             f"not {self.policy!r}")
        if self.priors not in PRIOR_RULES:
            raise ValueError(f"priors must be one of {PRIOR_RULES}, not {self.priors!r}")
        if self.joining not in JOININGS:
            raise ValueError(f"joining must be one of {JOININGS}, not {self.joining!r}")
        if self.swarm_reacts_to not in SWARM_REACTIONS:
            raise ValueError(f"swarm_reacts_to must be one of {SWARM_REACTIONS}, not {self.swarm_reacts_to!r}")
        CanTakeRule(self.can_take)  # (a ValueError naming the rule)
        if self.begin_groups not in ("digest", "full"):
            raise ValueError(f"begin_groups must be 'digest' or 'full', not {self.begin_groups!r}")
        if self.phase_fan_out is not None and self.phase_fan_out < 1:
            raise ValueError(f"phase_fan_out must be at least 1 (or None: every member), not {self.phase_fan_out}")

    @property
    def machines(self) -> bool:
        """GWTF's flows come from the flow machines (not an oracle's optimum, nor fixed flows)."""
        return self.policy == "gwtf" and self.routing == "machines" and self.flows is None

    def resolved(self) -> TrainSimOptions:
        """The options in effect: the crash plan in time order, the flow machines' options filled in, and
        with the flow machines no re-installed optimum (`reflow`) but lending (`lend`, the oracle lends by
        recomputing the flows without the finished data node).  Resolving twice changes nothing."""
        return dataclasses.replace(
            self, crash_plan=tuple(sorted(self.crash_plan or ())), reflow=self.reflow and not self.machines,
            lend=self.lend and self.machines,
            flow_options=dict(FLOW_OPTIONS if self.flow_options is None else self.flow_options))

"""DT-FM's scheduler (Yuan et al., "Decentralized Training of Foundation Models in Heterogeneous Environments",
section 3 and its reference code): the "optimal schedule" baseline of Table VI of the GWTF paper.

DT-FM assigns every device one stage and one macro-batch before training, so
that the stages' data-parallel groups and the pipelines between them use the
fast links.  `costmodel.py` holds its bi-level cost model (Eq. 1-4: the
data-parallel cost of each group, the coarsened graph of min-max perfect
matchings between groups, the travelling-salesman order of the stages),
`search.py` its hybrid genetic algorithm with its own local search and the
paper's two ablations (Kernighan-Lin local search, random assignment),
`pipelines.py` turns a partition into the pipelines and the units of flow the
training simulator routes along (`sim train --routing dtfm`), and
`problems.py` builds the problem from a scenario file or a training setting.
`opfence.py` holds FusionLLM's OP-Fence (Louvain clusters of the bandwidth
graph, connected runs of stages per cluster), a second placement baseline
that `problems.schedule(..., "opfence")` returns as a Schedule too.

How DT-FM's assumptions differ from GWTF's
------------------------------------------
* A static GPipe schedule: the assignment is computed once, centrally, with
  the whole latency and bandwidth matrix, and every device then serves one
  macro-batch of one stage; nothing is routed per microbatch.  GWTF's nodes
  only know their own links and form the flows with messages.
* No capacities: one tasklet per device, so every group has exactly D_DP
  devices (D_DP x D_PP = N).  GWTF's relays hold as many microbatches as
  their memory allows, and stages may differ in size.
* No churn: a device that leaves breaks its pipeline until the whole
  schedule is recomputed (a global recomputation, its CPU time a delay in
  `scripts/bench_optimality.py`); GWTF re-forms the flows locally.
* Stage placement is the scheduler's choice: any device may host any stage.
  In GWTF a relay's stage is given (it holds those weights; the leader
  places joiners).  So on the same devices DT-FM searches a larger space.
* Its cost is communication only (computation overlaps with it, section
  3.5), and the data-parallel cost counts in the objective: GWTF optimises
  the path costs of the microbatches (Eq. 1-2 of the GWTF paper) and leaves
  the all-reduce to the aggregation phase.

In a GWTF run the data nodes host the first and last stage of their own
microbatches, so the data nodes form a pinned group and the pipeline is a
closed tour through it (`CostModel.anchor`); without an anchor the model is
the paper's open loop.  The gradient size of every group is that of a relay
stage (the data nodes' embedding and head are larger; the model keeps one
c_dp, as the paper does).
"""

from .costmodel import CostModel, Costs, Partition, bottleneck_matching, tsp_path
from .pipelines import Arrangement, arrange, flows_of, repin
from .opfence import Plan, Workload, clusters, opfence, valid_plan, workload
from .problems import (
    SCHEDULE_METHODS, STAGE_GRADIENT_MB, Instance, Schedule, instance_from_scenario, instance_from_setting,
    opfence_schedule, schedule,
)
from .search import GENERATIONS, METHODS, POPULATION, Problem, SearchResult, search, valid

__all__ = ["GENERATIONS", "METHODS", "POPULATION", "SCHEDULE_METHODS", "STAGE_GRADIENT_MB", "Arrangement",
           "CostModel", "Costs", "Instance", "Partition", "Plan", "Problem", "Schedule", "SearchResult",
           "Workload", "arrange", "bottleneck_matching", "clusters", "flows_of", "instance_from_scenario",
           "instance_from_setting", "opfence", "opfence_schedule", "repin", "schedule", "search", "tsp_path",
           "valid", "valid_plan", "workload"]

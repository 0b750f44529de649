"""`gwtf-node sim join`: the node-addition experiment (section V-B, Table IV, Figure 5 of GWTF).

The system.  One data node d0 and 96 relays (97 nodes) spread over S stages,
plus 20 candidates waiting to join (the paper's "97 nodes" are the running
system: (N-1)/S relays per stage is 12 for S = 8 and 8 for S = 12; the 20
candidates come on top).  Per Table IV, every number is floor(U(lo, hi)):

| setting | S  | capacity | inter-stage cost | intra-stage cost      | relays per stage |
|---------|----|----------|------------------|-----------------------|------------------|
| 1       | 8  | U(1,20)  | U(1,100)         | phi + U(50,100)       | 12               |
| 2       | 8  | U(1,20)  | U(20,100)        | phi + U(50,100)       | 12               |
| 3       | 8  | U(1,5)   | U(1,100)         | phi + U(50,100)       | 12               |
| 4       | 12 | U(1,20)  | U(1,100)         | phi + U(50,100)       | 8                |
| 5*      | 8  | U(1,20)  | U(1,100)         | phi + U(50,100)       | random, >= 1 each    |

Every relay links to every relay of the next stage, d0 to every relay of the
first and the last stage (as in the flow tests).  A link is one physical pair
of machines, so its cost is drawn once: a candidate has one cost to every
existing node and to every other candidate, and uses those of its stage's
neighbours (stages s-1 and s+1, d0 at the ends) wherever it is placed; that
is what "each node knows its costs for each stage" means.  phi (Table IV) is
the largest inter-stage cost of a node for the stage it is in or proposed for;
its intra-stage cost for that stage is phi + floor(U(50,100)).  The data node's
capacity is the total capacity of everyone: it is never the bottleneck.

Routing and cost.  The routing of an assignment is the maximum flow at
minimum total cost (what GWTF's flow algorithm converges to and what
`baselines.optimal_routing` computes): F microbatches in flight, C the sum of
their path costs.  With complete links between consecutive stages, F is the
smallest stage capacity (every cut must cut a whole stage).  The cost of a
system is the time to push a batch of B = BATCH_MICROBATCHES microbatches:

    cost = (B / F) rounds x (C / F) mean path cost per round = B * C / F^2

(equivalently B over the throughput F^2 / C that Little's law gives for F
microbatches in flight with mean latency C / F).  More flow and cheaper
flow both lower it; B cancels in improvement = (cost_now - cost_after) /
cost_now, which is what Figure 5 plots.

Intra-stage costs.  We read them as the cost for a node to talk to its own
stage: on joining, the download of the stage's weights and optimizer state
from a stage peer (V-B), later the within-stage aggregation.  They do not
enter the routing, so they are not in `cost` (the steady-state figure of
Figure 5).  Each policy reports `join_delay`, the largest intra-stage cost
among the newcomers (downloads run in parallel; the new routing is usable
when the slowest has its state), and our GWTF uses it to break ties.

How the paper's experiment is read (line ~179 of the paper, V-B, Table IV).

- Who joins.  "Iteratively, 20 nodes are added" and "20
  candidates added": all 20 candidates join under every policy, and a policy
  only chooses their stages.  The paper never mentions a larger pool from
  which some are left out (a pool would let "random nodes" pick weak ones and
  explain its random << capacity-first, but its size would be ours to invent,
  and it would decide the ratios): no pool.
- Rounds of S.  "each combination of S candidate nodes added to each of the
  S stages", "every permutation of candidates" and V-B's "the candidate with
  the highest capacity will be added to the stage with highest utilization,
  the second highest to the stage with second highest, and so on" describe
  the same step: a period adds up to S candidates, one per stage, and the next
  period sees the new utilization.  20 candidates are periods of 8, 8, 4 (S = 8)
  or 12, 8 (S = 12).  This shapes the two rules that follow the paper's text
  (`gwtf_paper`, `capacity_first`).  The final cost depends on the final
  assignment only, so for the other policies the rounds change nothing.
- The optimum.  The paper enumerates, per round, the permutations of the
  round's candidates over the stages; the task asks for "every assignment of
  candidates to stages".  We take that: S^20 assignments, a superset
  of the paper's (per-round permutations chained greedily), so our optimum is
  at least the paper's and the targets are, if anything, harder.
- The baselines.  "Adding highest capacity first" names the order of the
  candidates, not their stages; the stage choice is what GWTF adds (the
  utilization query).  So the baseline takes the candidates by capacity and
  deals them over the stages in index order, one per stage per round: no
  load information.  Giving each to the stage with the fewest nodes (a member
  count per stage is a load query, a cheap utilization) is reported as
  `capacity_first_by_size`: with it the paper's own rule loses to the
  baseline in setting 5*, contradicting "in all cases GWTF outperforms the
  two baselines".  "Adding random nodes": each candidate to a
  uniformly random stage.  A random permutation per round instead would be,
  with equal stages (settings 1-4), statistically the same policy as
  capacity-first dealt in order: the paper's 1.5x vs 3.5x rules that out.
- The cost is not defined in the paper; ours is the one above.
  The paper's own time per microbatch in Table II (slowest path per
  iteration / microbatches) would need the longest path of a min-sum routing,
  which depends on how the flow is split into paths; the mean path (C / F)
  has no such ambiguity.

The policies (a policy chooses the stages of the 20 candidates):

- `gwtf_paper`: V-B as written.  Periods of up to S candidates: the leader
  floods the utilization query (each stage: flows / capacity), takes the S
  waiting candidates of highest capacity (ties: id) and gives the highest to
  the most utilized stage, the second to the second, and so on; the next
  period sees the capacities added.  Every microbatch crosses every stage, so
  the flows are F everywhere and "most utilized" is "smallest capacity": it
  is blind to link costs.
- `waterfill`: protocol/membership.place:
  highest capacity first, each to the most utilized stage re-evaluated after
  every placement, so several candidates can go to one stage in a period
  (capacity water-filling).  Better than `gwtf_paper` when one stage is far
  behind (setting 5*).
- `gwtf` (ours): the leader's stage search (protocol/placement.search_stages)
  from `gwtf_paper` and `waterfill`, given the whole layered cost graph: each
  node's link costs to the next stage and the candidates' links.  It
  evaluates `cost` exactly (here with a HiGHS LP: the flow polytope is totally
  unimodular; the protocol's pure-Python min-cost flow gives the same values)
  and moves one candidate to another stage while that lowers `cost` (first
  improvement, candidates in index order, at most GWTF_PASSES passes over the
  20 x (S-1) moves, a few hundred evaluations).  Ties in `cost` go to the
  lower join delay.
  The lesson: the most utilized stage is not always the right place.  Pushing
  F up to the last unit forces the extra microbatches through expensive
  links; the refined assignment often stops the bottleneck lower (e.g. F 106
  instead of 142) and spends the other candidates on stages where their links
  are cheap, which lowers C/F^2 far more.  Never worse than either start.
  `policy_gwtf(lp_starts=True)` adds a third start, the LP relaxation of the
  assignment (below) rounded at flows around the best one found
  (docs/bench_join_lpstarts.md has its figures and CPU time).
- `leader`: the daemon's leader, run by its own code
  (protocol/membership.place_by_search) on what the daemon reports to it:
  stage capacities and each candidate's cost to each stage, no link costs
  between members; the same search within its evaluation budget.
- `capacity_first`: highest capacity first, dealt over the stages in index
  order (rank r to stage r mod S).  `capacity_first_by_size`: the other
  reading, each to the stage with the fewest nodes (same in settings 1-4).
- `random`: each candidate to a uniformly random stage (seeded).
- `optimal`: the assignment minimizing `cost`.  S^20 assignments are far too
  many (8^20 ~ 1e18), so it is exhaustive only when S^n <= EXHAUSTIVE_LIMIT
  (small test instances: `optimal_method` "exhaustive", exact).  Otherwise
  `optimal_method` is "local-search": the best of the other policies'
  answers, improved by the local search with moves *and* swaps of two
  candidates, up to OPTIMAL_PASSES passes: an assignment, so its improvement
  is a LOWER bound on the optimal one; never below any other policy.

How far the true optimum can be (`optimal_bound` in the output).
`optimum_bound` proves an UPPER bound on the optimal improvement: the LP
relaxation of the assignment (a candidate may be spread fractionally over
the stages, sum_s x[v, s] = 1, its copy in s carrying <= cap_v x[v, s]),
solved for every possible max flow F, with the bottleneck stage imposed where
it matters; ~60-500 LPs, 10-20 s an instance, so the bench reports it for
every instance.  The true optimum lies between `optimal` and `optimal_bound`.
`milp_optimum` closes the gap exactly (Dinkelbach iterations of a MILP with
binary assignment, one-hot max flow and bottleneck indicators; exact on the
test instances) but takes minutes per full instance: scripts/join_exact.py
runs it on a sample (docs/bench_join_exact.md).  The bottleneck indicator
matters: without it the MILP is valid but loose (an assignment routing fewer
units than its max flow is cheaper per B*C/F^2).
"""

from __future__ import annotations

from .evaluation import BATCH_MICROBATCHES, Evaluation, FlowModel, stage_flows
from .experiment import POLICIES, run_join, summary
from .instances import CANDIDATES, JOIN_SETTINGS, SYSTEM_NODES, JoinInstance, JoinSetting, generate_join, to_scenario
from .optimum import MilpResult, OptimumBound, milp_optimum, optimum_bound
from .policies import (
    GWTF_PASSES, OptimalResult, placement_problem, policy_capacity_first, policy_capacity_first_by_size,
    policy_gwtf, policy_gwtf_paper, policy_leader, policy_optimal, policy_random, policy_waterfill,
)

__all__ = [
    "BATCH_MICROBATCHES", "CANDIDATES", "GWTF_PASSES", "JOIN_SETTINGS", "POLICIES", "SYSTEM_NODES", "Evaluation",
    "FlowModel", "JoinInstance", "JoinSetting", "MilpResult", "OptimalResult", "OptimumBound", "generate_join",
    "milp_optimum", "optimum_bound", "placement_problem", "policy_capacity_first", "policy_capacity_first_by_size",
    "policy_gwtf", "policy_gwtf_paper", "policy_leader", "policy_optimal", "policy_random", "policy_waterfill",
    "run_join", "stage_flows", "summary", "to_scenario",
]

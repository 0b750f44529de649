"""One node-addition experiment: every policy on one instance, as the JSON `sim join --json` prints."""

from __future__ import annotations

from .evaluation import BATCH_MICROBATCHES, FlowModel
from .instances import JoinInstance, generate_join
from .optimum import optimum_bound
from .policies import (
    policy_capacity_first, policy_capacity_first_by_size, policy_gwtf, policy_gwtf_paper, policy_leader,
    policy_optimal, policy_random, policy_waterfill,
)

POLICIES = ("gwtf", "leader", "gwtf_paper", "waterfill", "capacity_first", "capacity_first_by_size", "random",
            "optimal")


def run_join(setting: int, seed: int, *, instance: JoinInstance | None = None, with_bound: bool = True,
             lp_starts: bool = False, leader_evaluations: int | None = None) -> dict:
    """Every policy on one instance; the JSON object that `sim join --json` prints."""
    inst = instance or generate_join(setting, seed)
    model = FlowModel(inst)
    now = model.evaluate(())  # no candidate placed: the copies are all dropped
    assigns = {
        "gwtf": policy_gwtf(inst, model, lp_starts=lp_starts),
        "gwtf_paper": policy_gwtf_paper(inst),
        "waterfill": policy_waterfill(inst),
        "leader": policy_leader(inst) if leader_evaluations is None else policy_leader(inst, leader_evaluations),
        "capacity_first": policy_capacity_first(inst),
        "capacity_first_by_size": policy_capacity_first_by_size(inst),
        "random": policy_random(inst, seed),
    }
    opt = policy_optimal(inst, model, incumbents=tuple(assigns.values()))
    assigns["optimal"] = opt.assign
    bound = optimum_bound(inst, model) if with_bound else None
    out_policies = {}
    for name in POLICIES:
        a = assigns[name]
        ev = model.evaluate(a)
        out_policies[name] = {
            "flow": ev.flow, "total_cost": ev.total_cost, "cost": round(ev.cost, 6),
            "improvement": round((now.cost - ev.cost) / now.cost, 6),
            "join_delay": inst.join_delay(a),
            "stages": {v: s for v, s in zip(inst.candidates, a)},
        }
    return {
        "scenario": inst.name, "setting": setting, "seed": seed, "stages": inst.stages,
        "nodes": 1 + len(inst.relay_stage), "candidates": len(inst.candidates),
        "batch_microbatches": BATCH_MICROBATCHES,
        "cost_definition": "B*C/F^2: F max flow, C its min total path cost, B microbatches per batch",
        "now": {"flow": now.flow, "total_cost": now.total_cost, "cost": round(now.cost, 6)},
        "policies": out_policies,
        "improvement": {name: out_policies[name]["improvement"] for name in POLICIES},
        "optimal_method": opt.method,
        "optimal_evaluations": opt.evaluations,
        # A proved upper bound on the optimal improvement (`optimum_bound`); None without `with_bound`.
        "optimal_bound": None if bound is None else {
            "cost": round(bound.cost, 6), "flow": bound.flow, "lps": bound.flows_checked,
            "improvement": round((now.cost - bound.cost) / now.cost, 6)},
    }


def summary(res: dict) -> str:
    now = res["now"]
    lines = [
        f"node addition {res['scenario']}: setting {res['setting']} of Table IV, seed {res['seed']}: "
        f"{res['nodes']} nodes in {res['stages']} stages, {res['candidates']} candidates",
        f"cost = B*C/F^2 (B = {res['batch_microbatches']} microbatches, F max flow, C its min total cost)",
        f"now: flow {now['flow']}  total cost {now['total_cost']:g}  cost {now['cost']:.2f}",
        f"{'policy':<15} {'flow':>5} {'total cost':>10} {'cost':>9} {'improvement':>12} {'join delay':>11}",
    ]
    for name, p in res["policies"].items():
        lines.append(f"{name:<15} {p['flow']:>5} {p['total_cost']:>10g} {p['cost']:>9.2f} "
                     f"{100 * p['improvement']:>11.2f}% {p['join_delay']:>11}")
    note = {"exhaustive": "exact, every assignment tried",
            "local-search": "best found by a local search (moves and swaps) from the best other policy: "
                            "an upper bound on the optimal cost, so a lower bound on its improvement"}
    lines.append(f"optimal: {note[res['optimal_method']]}")
    if res.get("optimal_bound"):
        b = res["optimal_bound"]
        lines.append(f"no assignment does better than {100 * b['improvement']:.2f}% (LP relaxation of the "
                     f"assignment, tightest at flow {b['flow']}; {b['lps']} LPs)")
    return "\n".join(lines)


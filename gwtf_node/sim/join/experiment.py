"""One node-addition experiment: every policy on one instance, as the JSON `sim join --json` prints."""

from __future__ import annotations

import time
from typing import Callable

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
             lp_starts: bool = False, leader_evaluations: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict:
    """Every policy on one instance; the JSON object that `sim join --json` prints.  `progress` is told, one line
    at a time, what runs and what each step found and took (the CLI writes it to stderr)."""
    say = progress or (lambda line: None)
    inst = instance or generate_join(setting, seed)
    say(f"setting {setting}, seed {seed}: {1 + len(inst.relay_stage)} nodes in {inst.stages} stages, "
        f"{len(inst.candidates)} candidates")
    model = FlowModel(inst)
    now = model.evaluate(())  # no candidate placed: the copies are all dropped
    policies: dict[str, Callable[[], tuple]] = {
        "gwtf": lambda: policy_gwtf(inst, model, lp_starts=lp_starts),
        "gwtf_paper": lambda: policy_gwtf_paper(inst),
        "waterfill": lambda: policy_waterfill(inst),
        "leader": lambda: policy_leader(inst) if leader_evaluations is None else policy_leader(inst,
                                                                                               leader_evaluations),
        "capacity_first": lambda: policy_capacity_first(inst),
        "capacity_first_by_size": lambda: policy_capacity_first_by_size(inst),
        "random": lambda: policy_random(inst, seed),
    }
    assigns = {}
    for name, policy in policies.items():
        t0 = time.perf_counter()
        assigns[name] = policy()
        say(f"policy {name}: cost {model.evaluate(assigns[name]).cost:.2f} (now {now.cost:.2f}), "
            f"{time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    say("optimal: searching (exhaustive where the instance is small, else a local search)")
    opt = policy_optimal(inst, model, incumbents=tuple(assigns.values()))
    assigns["optimal"] = opt.assign
    say(f"optimal ({opt.method}): cost {model.evaluate(opt.assign).cost:.2f}, {opt.evaluations} evaluations, "
        f"{time.perf_counter() - t0:.1f} s")
    bound = None
    if with_bound:
        t0 = time.perf_counter()
        say("bound on the optimum: solving LP relaxations (--no-bound skips it)")
        bound = optimum_bound(inst, model)
        say(f"bound on the optimum: cost {bound.cost:.2f}, {bound.flows_checked} LPs, "
            f"{time.perf_counter() - t0:.1f} s")
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


#!/usr/bin/env python3
"""Homing's time (protocol/flow/homing.py) against pricing every candidate in full, on the units pooled formation
really hands it.

For each `--instance D,R,S` (D data nodes, R relays over S stages, Table V setting-1 capacities and costs, seed
`--seed`), runs pooled formation in the flow simulator (`run_pooled`), takes the units, link costs and demand the
pool homes, and times `home_units`' four steps (ours) and the same steps pricing every candidate in full (the
reference below, the steps as homing.py's doc defines them) on them, side by side; checks that both give the same
units.  CPU seconds of this process.

    python scripts/bench_homing.py                                   # 4,320,8 and 8,960,8
    python scripts/bench_homing.py --instance 2,160,8 --json

The reference's functions are also the oracle of tests/protocol/test_flow_homing_bounds.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

from gwtf_node.protocol.flow import pool
from gwtf_node.protocol.flow.homing import (
    GAIN_EPS, INF, Loads, _cheapest_home, _segments, exchange, place_away, spread, swap_suffixes, unit_cost,
)


def ref_swap_suffixes(units, cost):
    made = 0
    while True:
        best = None
        for i, a in enumerate(units):
            if a[0] == a[2]:
                continue
            for k, b in enumerate(units):
                if k == i or b[0] != a[2] or b[2] == b[0]:
                    continue
                now = unit_cost(cost, a) + unit_cost(cost, b)
                for j in range(1, len(a[1]) + 1):
                    a2 = (a[0], a[1][:j] + b[1][j:], b[2])
                    b2 = (b[0], b[1][:j] + a[1][j:], a[2])
                    after = unit_cost(cost, a2) + unit_cost(cost, b2)
                    if after < INF and (best is None or now - after > best[0]):
                        best = (now - after, i, k, a2, b2)
        if best is None:
            return made
        _, i, k, a2, b2 = best
        units[i], units[k] = a2, b2
        made += 1


def ref_exchange(units, cost, demand, max_passes=50, segments=True):
    data = sorted(demand)
    room = {d: demand[d] - sum(1 for u in units if u[0] == d) for d in data}
    made = 0
    for _ in range(max_passes):
        gained = False
        for i, k in itertools.combinations(range(len(units)), 2):
            a, b = units[i], units[k]
            now = unit_cost(cost, a) + unit_cost(cost, b)
            for i0, j in _segments(len(a[1]), segments):
                pa, pb = a[1][:i0] + b[1][i0:j] + a[1][j:], b[1][:i0] + a[1][i0:j] + b[1][j:]
                room[a[0]] += 1
                room[b[0]] += 1
                da = _cheapest_home(pa, data, cost, room)
                if da is not None:
                    room[da] -= 1
                db = _cheapest_home(pb, data, cost, room)
                a2, b2 = (da, pa, da), (db, pb, db)
                if db is not None and unit_cost(cost, a2) + unit_cost(cost, b2) < now - GAIN_EPS:
                    room[db] -= 1
                    units[i], units[k] = a2, b2
                    made, gained = made + 1, True
                    break
                if da is not None:
                    room[da] += 1
                room[a[0]] -= 1
                room[b[0]] -= 1
        if not gained:
            break
    return made


def ref_spread(units, cost, max_moves=200):
    if not units:
        return 0
    loads, made = Loads(units, cost), 0
    for _ in range(max_moves):
        top = max(loads.load)
        i = loads.load.index(top)
        a, best = units[i], None
        for k, b in enumerate(units):
            if k == i:
                continue
            now = unit_cost(cost, a) + unit_cost(cost, b)
            for i0, j in _segments(len(a[1]), True):
                pa, pb = a[1][:i0] + b[1][i0:j] + a[1][j:], b[1][:i0] + a[1][i0:j] + b[1][j:]
                if pa == a[1]:
                    continue
                a2, b2 = (a[0], pa, a[0]), (b[0], pb, b[0])
                if unit_cost(cost, a2) + unit_cost(cost, b2) > now + GAIN_EPS:
                    continue
                key = loads.trial(i, k, a2, b2)  # (None: the highest load is INF)
                if key is not None and key[0] < top - GAIN_EPS and (best is None or key < best[0]):
                    best = (key, k, a2, b2)
        if best is None:
            return made
        _, k, a2, b2 = best
        loads.replace(i, a2)
        loads.replace(k, b2)
        loads.refresh()
        made += 1
    return made


def captured(d: int, r: int, s: int, seed: int):
    """The (units, cost, demand) the pool of a pooled formation homes, on a generated D-data-node instance."""
    from gwtf_node.protocol.scenario import parse_scenario
    from gwtf_node.sim.pooled import run_pooled
    from gwtf_node.sim.scenarios import FlowSetting, generate_layered

    seen, home = [], pool.home_units

    def keep(units, cost, demand):
        seen.append((list(units), cost, dict(demand)))
        return home(units, cost, demand)

    pool.home_units = keep
    try:
        run_pooled(parse_scenario(generate_layered("homing", FlowSetting(d, r, s, (1, 3), (1, 20)), seed)), seed=0,
                   rounds=400)
    finally:
        pool.home_units = home
    if not seen:
        raise SystemExit(f"{d},{r},{s}: the pool never homed (no formation within 400 rounds)")
    return seen[0]


def timed(steps, units, cost, demand) -> tuple[list, list[float]]:
    out, secs = list(units), []
    for step in steps:
        t = time.process_time()
        step(out, cost, demand)
        secs.append(time.process_time() - t)
    return out, secs


OURS = (lambda u, c, d: swap_suffixes(u, c), place_away, exchange, lambda u, c, d: spread(u, c))
FULL = (lambda u, c, d: ref_swap_suffixes(u, c), place_away, ref_exchange, lambda u, c, d: ref_spread(u, c))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instance", nargs="+", default=["4,320,8", "8,960,8"], help="D,R,S (data nodes, relays, stages)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for spec in a.instance:
        d, r, s = (int(x) for x in spec.split(","))
        units, cost, demand = captured(d, r, s, a.seed)
        ours, t_ours = timed(OURS, units, cost, demand)
        full, t_full = timed(FULL, units, cost, demand)
        row = {"instance": spec, "units": len(units), "ours_s": [round(x, 3) for x in t_ours],
               "full_s": [round(x, 3) for x in t_full], "ratio": round(sum(t_full) / max(sum(t_ours), 1e-9), 1),
               "same_units": ours == full, "cost": sum(unit_cost(cost, u) for u in ours)}
        if a.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{spec}: {len(units)} units, ours {sum(t_ours):.2f} s (steps {row['ours_s']}), every candidate in "
                  f"full {sum(t_full):.2f} s (steps {row['full_s']}): {row['ratio']} x, same units: "
                  f"{row['same_units']}", flush=True)
        if not row["same_units"]:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

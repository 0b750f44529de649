"""Homing's bounds (protocol/flow/homing.py) make the decisions of pricing every trial in full.

Steps 1, 3 and 4 price each candidate from the few links it changes and price
in full only what the bound leaves; the reference (scripts/bench_homing.py)
prices every candidate in full, as the steps are defined.  On random instances (integer costs, so
ties are common; real costs; unknown links) both give the same units and the
same counts.
"""

from __future__ import annotations

import random

from gwtf_node.protocol.flow.homing import exchange, place_away, spread, swap_suffixes
from support.helpers import load_script

REF = load_script("bench_homing")  # the steps pricing every candidate in full


def instance(rng: random.Random):
    stages, per, nd = rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 4)
    data = [f"d{i}" for i in range(nd)]
    relays = [[f"s{s}r{r}" for r in range(per)] for s in range(stages)]
    ints, missing = rng.random() < 0.5, rng.choice([0.0, 0.0, 0.05, 0.2])
    table = {}
    pairs = [(d, r) for d in data for r in relays[0]] + [(r, d) for r in relays[-1] for d in data]
    pairs += [(a, b) for s in range(stages - 1) for a in relays[s] for b in relays[s + 1]]
    for p in pairs:
        if rng.random() >= missing:
            table[p] = float(rng.randint(1, 5)) if ints else rng.uniform(0.1, 3000.0)
    units = [(data[u % nd], tuple(rng.choice(st) for st in relays), rng.choice(data))
             for u in range(rng.randint(2, 14))]
    demand = {d: sum(1 for u in units if u[0] == d) + rng.randint(0, 1) for d in data}
    return units, (lambda a, b: table.get((a, b))), demand


def test_the_bounded_steps_decide_as_pricing_every_trial_in_full():
    rng, moved = random.Random(11), 0
    for _ in range(300):
        units, cost, demand = instance(rng)
        ours, ref = list(units), list(units)
        assert swap_suffixes(ours, cost) == REF.ref_swap_suffixes(ref, cost)
        assert ours == ref
        place_away(ours, cost, demand)
        place_away(ref, cost, demand)
        segments = rng.random() < 0.7
        homed = list(ours)
        made = exchange(ours, cost, demand, segments=segments)
        assert made == REF.ref_exchange(ref, cost, demand, segments=segments) and ours == ref
        back, back_ref = list(homed), list(homed)
        made2 = spread(back, cost)
        assert made2 == REF.ref_spread(back_ref, cost) and back == back_ref
        moved += made + made2
    assert moved > 400  # (the instances exercise the steps, not only their bounds)

"""Homing: units formed as one commodity, sent back to the data node they left (pooled formation, pool.py).

Formed as one commodity, a unit leaves some data node and ends at whichever
data node was cheapest for the relays' paths; several data nodes need every
unit to end where it left.  `home_units` repairs that over the units' paths
and the costs of the links between the relays they use, in four steps:

1. *Suffix swaps*: while a unit A ends at another data node d' than it left, a
   unit B that leaves d' and ends elsewhere swaps with A everything after the
   stage where that costs least (each suffix with its last hop): B then ends
   where it left.  No relay gains or loses a unit, so capacities hold; the
   pair that costs least goes first.
2. A unit still away (no such B: the data nodes sent and took back unequal
   numbers) goes to the data node cheapest for its first and last hops with
   room for it.
3. *Exchanges*: two units swap their paths after some stage, each then taken
   by the data node cheapest for it (with room), while one lowers the cost;
   at most `max_passes` passes over the pairs.
4. *Spreading*: a link's cost counts one unit's transfer, but the units that
   share a link wait for each other, so a unit takes about the sum over its
   links of cost x units on the link (`Loads`).  While swapping a run of
   stages of the slowest unit with another unit's, at no higher cost, makes
   the slowest of all faster, the swap that does most is made (each unit
   stays with its data node); at most `max_moves`.  Among the flows of one
   cost it picks those whose slow links carry fewest units: on Table VI at 144
   nodes, seed 3, 1.1236 s per microbatch against 1.4899 without it; swaps
   at a higher cost too made it 1.0207 but put settings 5-6 7.6 % above the
   LP bound (docs/bench_optimality.md).

Pure: the caller hands in the units, a cost function over the links the
relays reported (None: no such link) and each data node's demand.
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence

Unit = tuple[str, tuple[str, ...], str]  # (data node it leaves, its relay per stage, data node it ends at)
CostFn = Callable[[str, str], "float | None"]
INF = float("inf")
GAIN_EPS = 1e-9  # an exchange must lower the cost by more than this (float noise cannot loop)


def hops(unit: Unit) -> list[tuple[str, str]]:
    """The links `unit` crosses, from the data node it leaves to the one it ends at."""
    h = (unit[0], *unit[1], unit[2])
    return list(zip(h, h[1:]))


def unit_cost(cost: CostFn, unit: Unit) -> float:
    """The cost of `unit`'s hops, INF where one of its links is unknown."""
    total = 0.0
    for a, b in hops(unit):
        c = cost(a, b)
        if c is None:
            return INF
        total += c
    return total


def swap_suffixes(units: list[Unit], cost: CostFn) -> int:
    """Step 1, in place; returns how many swaps were made."""
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


def _cheapest_home(path: tuple[str, ...], data: Sequence[str], cost: CostFn, room: Mapping[str, int],
                   leaving: str | None = None) -> str | None:
    """The data node cheapest for `path`'s first and last hops with room (`leaving` gives its unit's place up)."""
    best, where = INF, None
    for d in data:
        if room[d] <= 0 and d != leaving:
            continue
        c = unit_cost(cost, (d, path, d))
        if c < best:
            best, where = c, d
    return where


def place_away(units: list[Unit], cost: CostFn, demand: Mapping[str, int]) -> int:
    """Step 2, in place; returns how many units it moved (a unit with no data node it can reach is dropped)."""
    data = sorted(demand)
    room = {d: demand[d] - sum(1 for u in units if u[0] == u[2] == d) for d in data}
    moved, kept = 0, []
    for u in units:
        if u[0] == u[2]:
            kept.append(u)
            continue
        d = _cheapest_home(u[1], data, cost, room)
        moved += 1
        if d is not None:
            room[d] -= 1
            kept.append((d, u[1], d))
    units[:] = kept
    return moved


def _segments(stages: int, segments: bool) -> list[tuple[int, int]]:
    """The stage ranges [i, j) two units may exchange: every suffix after the first stage, and with `segments`
    every run of stages in between too."""
    if not segments:
        return [(j, stages) for j in range(1, stages)]
    return [(i, j) for i in range(0, stages) for j in range(i + 1, stages + 1) if (i, j) != (0, stages)]


def exchange(units: list[Unit], cost: CostFn, demand: Mapping[str, int], max_passes: int = 50,
             segments: bool = True) -> int:
    """Step 3, in place (every unit already home); returns how many exchanges were made."""
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


class Loads:
    """Step 4's bookkeeping: the units on each link, and each unit's load (its links' cost x units on them)."""

    def __init__(self, units: list[Unit], cost: CostFn) -> None:
        self.units, self.cost = units, cost
        self.on: dict[tuple[str, str], set[int]] = {}
        for i, u in enumerate(units):
            for link in hops(u):
                self.on.setdefault(link, set()).add(i)
        self.load = [self._load(u, {}) for u in units]

    def _load(self, unit: Unit, delta: Mapping[tuple[str, str], int]) -> float:
        total = 0.0
        for link in hops(unit):
            c = self.cost(*link)
            if c is None:
                return INF
            total += c * (len(self.on.get(link, ())) + delta.get(link, 0))
        return total

    def trial(self, i: int, k: int, a2: Unit, b2: Unit) -> tuple[float, float]:
        """(the highest load, the sum of loads) were units i and k replaced by a2 and b2."""
        a, b = self.units[i], self.units[k]
        delta: dict[tuple[str, str], int] = {}
        for link in hops(a) + hops(b):
            delta[link] = delta.get(link, 0) - 1
        for link in hops(a2) + hops(b2):
            delta[link] = delta.get(link, 0) + 1
        new = {i: self._load(a2, delta), k: self._load(b2, delta)}
        for link, n in delta.items():
            if n:
                c = self.cost(*link)
                for u in self.on.get(link, ()):
                    if u not in (i, k):
                        new[u] = new.get(u, self.load[u]) + c * n
        loads = [new.get(u, v) for u, v in enumerate(self.load)]
        return max(loads), sum(loads)

    def replace(self, i: int, unit: Unit) -> None:
        for link in hops(self.units[i]):
            self.on[link].discard(i)
        self.units[i] = unit
        for link in hops(unit):
            self.on.setdefault(link, set()).add(i)

    def refresh(self) -> None:
        self.load = [self._load(u, {}) for u in self.units]


def spread(units: list[Unit], cost: CostFn, max_moves: int = 200) -> int:
    """Step 4, in place (every unit home); returns how many swaps were made."""
    if not units:
        return 0
    loads = Loads(units, cost)
    made = 0
    for _ in range(max_moves):
        top = max(loads.load)
        i = loads.load.index(top)
        a, best = units[i], None
        ca = unit_cost(cost, a)
        for k, b in enumerate(units):
            if k == i:
                continue
            now = ca + unit_cost(cost, b)
            for i0, j in _segments(len(a[1]), True):
                pa, pb = a[1][:i0] + b[1][i0:j] + a[1][j:], b[1][:i0] + a[1][i0:j] + b[1][j:]
                if pa == a[1]:
                    continue
                a2, b2 = (a[0], pa, a[0]), (b[0], pb, b[0])
                if unit_cost(cost, a2) + unit_cost(cost, b2) > now + GAIN_EPS:
                    continue  # (the units' cost stays as steps 1-3 left it)
                key = loads.trial(i, k, a2, b2)
                if key[0] < top - GAIN_EPS and (best is None or key < best[0]):
                    best = (key, k, a2, b2)
        if best is None:
            break
        _, k, a2, b2 = best
        loads.replace(i, a2)
        loads.replace(k, b2)
        loads.refresh()
        made += 1
    return made


def home_units(units: Sequence[Unit], cost: CostFn, demand: Mapping[str, int]) -> tuple[list[Unit], dict]:
    """Steps 1-4 (module doc): every unit ends where it left, within each data node's demand; and what each step
    did (`swaps`, `placed_away`, `exchanges`, `spread`)."""
    out = list(units)
    swaps = swap_suffixes(out, cost)
    away = place_away(out, cost, demand)
    made = exchange(out, cost, demand)
    spreads = spread(out, cost)
    return out, {"swaps": swaps, "placed_away": away, "exchanges": made, "spread": spreads}

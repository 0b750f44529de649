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

Steps 1, 3 and 4 price a candidate swap first from the few links it changes
(the two crossing at each end of the swapped stages, the end hops; `_crossings`)
and price in full, in the order of the definitions above, only the candidates
that bound leaves: the decisions are those of pricing every candidate in full
(tests/protocol/test_flow_homing_bounds.py).  A pair of units that gained
nothing is not tried again until one of them or the data nodes' room changes.

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
ROUNDING = 4e-14  # relative: what float rounding can put between a bound and the exact sum it bounds


def hops(unit: Unit) -> list[tuple[str, str]]:
    """The links `unit` crosses, from the data node it leaves to the one it ends at."""
    h = (unit[0], *unit[1], unit[2])
    return list(zip(h, h[1:]))


def unit_cost(cost: CostFn, unit: Unit) -> float:
    """The cost of `unit`'s hops, INF where one of its links is unknown."""
    return _sum_known(cost, hops(unit))


def _sum_known(cost: CostFn, links: Sequence[tuple[str, str]]) -> float:
    """The summed cost of `links`, INF where one of them is unknown."""
    total = 0.0
    for x, y in links:
        c = cost(x, y)
        if c is None:
            return INF
        total += c
    return total


def _suffix_afters(cost: CostFn, a: Unit, b: Unit, now: float) -> list[float]:
    """Per j (1 .. stages): a and b's summed cost after swapping everything after stage j (`swap_suffixes`),
    from the links that change (the two crossing at j, or at j = stages the last hops); INF where one is
    unknown."""
    pa, pb = a[1], b[1]
    g = _crossings(cost, pa, pb)
    out = [now + g[j] for j in range(1, len(pa))]
    n1, n2 = cost(pa[-1], b[2]), cost(pb[-1], a[2])
    out.append(INF if n1 is None or n2 is None else now - cost(pa[-1], a[2]) - cost(pb[-1], b[2]) + n1 + n2)
    return out


def swap_suffixes(units: list[Unit], cost: CostFn) -> int:
    """Step 1, in place; returns how many swaps were made.  Each swap is the pair and stage of the largest gain
    (the first of equal ones): every candidate is priced from the links that change (`_suffix_afters`), and only
    those within float rounding of the best are priced again in full, in order."""
    made = 0
    costs = [unit_cost(cost, u) for u in units]
    priced: dict[tuple[int, int], list] = {}  # (i, k) -> afters, kept until unit i or k changes
    while True:
        cands, top, scale = [], -INF, 0.0
        for i, a in enumerate(units):
            if a[0] == a[2]:
                continue
            for k, b in enumerate(units):
                if k == i or b[0] != a[2] or b[2] == b[0]:
                    continue
                now = costs[i] + costs[k]
                if now == INF:  # (priced in full: its gain is INF wherever the swap's links are known)
                    cands.append((i, k, now, [None] * len(a[1])))
                    continue
                if (i, k) not in priced:
                    priced[i, k] = _suffix_afters(cost, a, b, now)
                afters = priced[i, k]
                cands.append((i, k, now, afters))
                top, scale = max(top, now - min(afters)), max(scale, abs(now))
        best, slack = None, 2 * ROUNDING * (1.0 + scale)
        for i, k, now, afters in cands:
            a, b = units[i], units[k]
            for j, fast in enumerate(afters, 1):
                if fast is not None and now - fast < top - slack:
                    continue
                a2 = (a[0], a[1][:j] + b[1][j:], b[2])
                b2 = (b[0], b[1][:j] + a[1][j:], a[2])
                after = unit_cost(cost, a2) + unit_cost(cost, b2)
                if after < INF and (best is None or now - after > best[0]):
                    best = (now - after, i, k, a2, b2)
        if best is None:
            return made
        _, i, k, a2, b2 = best
        units[i], units[k] = a2, b2
        costs[i], costs[k] = unit_cost(cost, a2), unit_cost(cost, b2)
        priced = {p: v for p, v in priced.items() if i not in p and k not in p}
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


def _homed_ends(cost: CostFn, room: Mapping[str, int], ends_a: tuple[str, str], ends_b: tuple[str, str]) -> float:
    """The cheapest first and last hops of two paths (their first and last relays) taken by two data nodes of
    `room` (each with room for them: one data node takes both only with room for two)."""
    ca = {d: _hop_pair(cost, d, *ends_a) for d in room}
    cb = {d: _hop_pair(cost, d, *ends_b) for d in room}
    return min((ca[x] + cb[y] for x in room for y in room if x != y or room[x] > 1), default=INF)


def _hop_pair(cost: CostFn, d: str, first: str, last: str) -> float:
    x, y = cost(d, first), cost(last, d)
    return INF if x is None or y is None else x + y


def _crossings(cost: CostFn, pa: tuple[str, ...], pb: tuple[str, ...]) -> list[float]:
    """Per stage boundary t (1 .. len - 1): what crossing the two paths there (pa[:t] + pb[t:] and pb[:t] + pa[t:])
    adds to their summed relay-to-relay links (INF where a new link is unknown); 0 at both ends."""
    g = [0.0] * (len(pa) + 1)
    for t in range(1, len(pa)):
        n1, n2 = cost(pa[t - 1], pb[t]), cost(pb[t - 1], pa[t])
        g[t] = INF if n1 is None or n2 is None else n1 + n2 - cost(pa[t - 1], pa[t]) - cost(pb[t - 1], pb[t])
    return g


def _end_floors(cost: CostFn, data: Sequence[str], unit: Unit) -> tuple[float, float, float]:
    """Over every data node: the cheapest first and last hops of `unit`'s path, its cheapest first hop, its
    cheapest last hop (floors of `_homed_ends` whatever the room)."""
    first, last = unit[1][0], unit[1][-1]
    ins = [c for c in (cost(d, first) for d in data) if c is not None]
    outs = [c for c in (cost(last, d) for d in data) if c is not None]
    return (min((_hop_pair(cost, d, first, last) for d in data), default=INF), min(ins, default=INF),
            min(outs, default=INF))


def _least(g: list[float], ends: tuple[float, float, float]) -> float:
    """The least of g[i0] + g[j] plus the ends' term over every stage range but the whole path; `ends` are the
    end hops' costs (head: ranges from stage 0, tail: ranges to the last stage, own: the others)."""
    stages = len(g) - 1
    two = sorted(g[1:stages])[:2]
    head, tail, own = ends
    return min(min(head, tail) + two[0] if two else INF, own + two[0] + two[1] if len(two) == 2 else INF)


def _ranges_below(g: list[float], inner: float, ends: tuple[float, float, float], below: float,
                  segs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges of `segs` whose bound (`inner` + the crossings `g` at their boundaries + the ends' term) is
    below `below`."""
    if inner + _least(g, ends) >= below:
        return []
    head, tail, own = ends
    stages = len(g) - 1
    return [(i0, j) for i0, j in segs
            if inner + g[i0] + g[j] + (head if i0 == 0 else tail if j == stages else own) < below]


def _worth_trying(cost: CostFn, a: Unit, b: Unit, now: float, room: Mapping[str, int], segs: list[tuple[int, int]],
                  floors: Callable[[Unit], tuple[float, float, float]]) -> list[tuple[int, int]]:
    """The stage ranges of `segs` whose exchange could lower `now` (a and b's summed cost) by more than GAIN_EPS:
    a lower bound on each range's cost after, from the links at its two boundaries and the cheapest end hops
    (first each unit's `floors` over every data node, then the data nodes with room once a and b give theirs
    up), with a margin for float rounding; every range where a unit's cost is unknown."""
    if now == INF:
        return segs
    pa, pb = a[1], b[1]
    g = _crossings(cost, pa, pb)
    inner = now - cost(a[0], pa[0]) - cost(pa[-1], a[2]) - cost(b[0], pb[0]) - cost(pb[-1], b[2])
    below = now - GAIN_EPS + ROUNDING * (1.0 + abs(now))
    fa, fb = floors(a), floors(b)
    rough = fb[1] + fa[2] + fa[1] + fb[2]
    if inner + _least(g, (rough, rough, fa[0] + fb[0])) >= below:
        return []
    free = {d: m for d, n in room.items() if (m := n + (d == a[0]) + (d == b[0])) > 0}
    own = _homed_ends(cost, free, (pa[0], pa[-1]), (pb[0], pb[-1]))
    swapped = _homed_ends(cost, free, (pb[0], pa[-1]), (pa[0], pb[-1]))
    return _ranges_below(g, inner, (swapped, swapped, own), below, segs)


def exchange(units: list[Unit], cost: CostFn, demand: Mapping[str, int], max_passes: int = 50,
             segments: bool = True) -> int:
    """Step 3, in place (every unit already home); returns how many exchanges were made.  Each pair's stage
    ranges are bounded first (`_worth_trying`, a few link costs a boundary): the exact trial runs only where the
    bound leaves room for a gain, with the decisions of trying every range in turn."""
    data = sorted(demand)
    room = {d: demand[d] - sum(1 for u in units if u[0] == d) for d in data}
    segs = _segments(len(units[0][1]), segments) if units else []
    costs = [unit_cost(cost, u) for u in units]
    ver, room_ver = [0] * len(units), 0
    settled: dict[tuple[int, int], tuple[int, int, int]] = {}  # a pair that gained nothing, as it was then
    floors: dict[Unit, tuple[float, float, float]] = {}  # `_end_floors` per unit

    def floors_of(unit: Unit) -> tuple[float, float, float]:
        if unit not in floors:
            floors[unit] = _end_floors(cost, data, unit)
        return floors[unit]

    made = 0
    for _ in range(max_passes):
        gained = False
        for i, k in itertools.combinations(range(len(units)), 2):
            if settled.get((i, k)) == (ver[i], ver[k], room_ver):
                continue  # (the same units and room: the same trials, no gain)
            settled[i, k] = (ver[i], ver[k], room_ver)
            a, b = units[i], units[k]
            now = costs[i] + costs[k]
            for i0, j in _worth_trying(cost, a, b, now, room, segs, floors_of):
                pa, pb = a[1][:i0] + b[1][i0:j] + a[1][j:], b[1][:i0] + a[1][i0:j] + b[1][j:]
                room[a[0]] += 1
                room[b[0]] += 1
                da = _cheapest_home(pa, data, cost, room)
                if da is not None:
                    room[da] -= 1
                db = _cheapest_home(pb, data, cost, room)
                a2, b2 = (da, pa, da), (db, pb, db)
                after = (unit_cost(cost, a2), unit_cost(cost, b2))
                if db is not None and after[0] + after[1] < now - GAIN_EPS:
                    room[db] -= 1
                    units[i], units[k] = a2, b2
                    costs[i], costs[k] = after
                    ver[i], ver[k] = ver[i] + 1, ver[k] + 1
                    room_ver += sorted((a[0], b[0])) != sorted((da, db))
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
        self.refresh()

    def _load(self, unit: Unit, delta: Mapping[tuple[str, str], int]) -> float:
        total = 0.0
        for link in hops(unit):
            c = self.cost(*link)
            if c is None:
                return INF
            total += c * (len(self.on.get(link, ())) + delta.get(link, 0))
        return total

    def trial(self, i: int, k: int, a2: Unit, b2: Unit, bar: float = INF,
              above: float = INF) -> tuple[float, float] | None:
        """(the highest load, the sum of loads) were units i and k replaced by a2 and b2; None where the highest
        load is `bar` or more, or more than `above` (the sum is not needed then)."""
        a, b = self.units[i], self.units[k]
        delta: dict[tuple[str, str], int] = {}
        for link in hops(a) + hops(b):
            delta[link] = delta.get(link, 0) - 1
        for link in hops(a2) + hops(b2):
            delta[link] = delta.get(link, 0) + 1
        new = {i: self._load(a2, delta), k: self._load(b2, delta)}
        for link, n in delta.items():
            c = self.cost(*link)
            if n and c is not None:  # (the units on an unknown link stay at INF)
                for u in self.on.get(link, ()):
                    if u not in (i, k):
                        new[u] = new.get(u, self.load[u]) + c * n
        top = max(new.values())
        for u in self.order:  # (the highest load that does not change)
            if u not in new:
                top = max(top, self.load[u])
                break
        if top >= bar or top > above:
            return None
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
        self.order = sorted(range(len(self.units)), key=self.load.__getitem__, reverse=True)


def _spread_trials(cost: CostFn, a: Unit, b: Unit, now: float,
                   segs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The stage ranges of `segs` whose swap (each unit keeping its data node) could cost no more than `now`,
    priced from the links that change, with a margin for float rounding; every range where a cost is unknown."""
    if now == INF:
        return segs
    pa, pb, ha, hb = a[1], b[1], a[0], b[0]
    own = cost(ha, pa[0]) + cost(pa[-1], ha) + cost(hb, pb[0]) + cost(pb[-1], hb)
    head = _sum_known(cost, ((ha, pb[0]), (pa[-1], ha), (hb, pa[0]), (pb[-1], hb)))
    tail = _sum_known(cost, ((ha, pa[0]), (pb[-1], ha), (hb, pb[0]), (pa[-1], hb)))
    below = now + GAIN_EPS + 2 * ROUNDING * (1.0 + abs(now))  # (strictly below: one rounding margin more)
    return _ranges_below(_crossings(cost, pa, pb), now - own, (head, tail, own), below, segs)


def spread(units: list[Unit], cost: CostFn, max_moves: int = 200) -> int:
    """Step 4, in place (every unit home); returns how many swaps were made.  A partner's stage ranges are
    priced from the links that change first (`_spread_trials`), and a trial whose slowest load is no better
    stops before the sum: the decisions of trying every range in full."""
    if not units:
        return 0
    loads = Loads(units, cost)
    segs = _segments(len(units[0][1]), True)
    costs = [unit_cost(cost, u) for u in units]
    made = 0
    for _ in range(max_moves):
        top = max(loads.load)
        i = loads.load.index(top)
        a, best = units[i], None
        for k, b in enumerate(units):
            if k == i:
                continue
            now = costs[i] + costs[k]
            for i0, j in _spread_trials(cost, a, b, now, segs):
                pa, pb = a[1][:i0] + b[1][i0:j] + a[1][j:], b[1][:i0] + a[1][i0:j] + b[1][j:]
                if pa == a[1]:
                    continue
                a2, b2 = (a[0], pa, a[0]), (b[0], pb, b[0])
                if unit_cost(cost, a2) + unit_cost(cost, b2) > now + GAIN_EPS:
                    continue  # (the units' cost stays as steps 1-3 left it)
                key = loads.trial(i, k, a2, b2, top - GAIN_EPS, best[0][0] if best else INF)
                if key is not None and (best is None or key < best[0]):
                    best = (key, k, a2, b2)
        if best is None:
            break
        _, k, a2, b2 = best
        loads.replace(i, a2)
        loads.replace(k, b2)
        loads.refresh()
        costs[i], costs[k] = unit_cost(cost, a2), unit_cost(cost, b2)
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

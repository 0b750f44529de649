"""Which latency and bandwidth to emulate between named local nodes (`--links`).

Two inputs are accepted:

* a scenario file (`specs/scenario.md`): node ids are the names of the local
  nodes (`d0`, `r0_1`, ...); links given by `latency_ms` and `bandwidth_mbps`
  are emulated as given (a pair means [a->b, b->a]); links given only by a
  `cost` are not shaped (there is nothing physical to emulate);
* a location file like `data/geo12-links.json` (`locations`, `links` between
  locations, `intra_location`): the local nodes are placed on the locations
  round-robin in the order the launcher lists them, and each pair of nodes
  gets the link of their two locations.

`resolve_links` turns either into the one form nodes read: a JSON object
`{"links": [{"a": name, "b": name, "latency_ms": x, "bandwidth_mbps": y}]}`
with one entry per direction; `load_links` reads that into
`{(a, b): (one-way latency ms, bandwidth Mbit/s)}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...protocol.scenario import published_bandwidth_mbps


class LinksError(ValueError):
    """A links file we cannot use; the message says what to fix."""


def _num(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise LinksError(f"{what} must be a non-negative number, got {v!r}")
    return float(v)


def _pair(v: Any, what: str) -> tuple[float, float]:
    if isinstance(v, list):
        if len(v) != 2:
            raise LinksError(f"{what} must be a number or a list [a->b, b->a], got {v!r}")
        return _num(v[0], what), _num(v[1], what)
    x = _num(v, what)
    return x, x


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(Path(path).read_text())
    except OSError as e:
        raise LinksError(f"cannot read links file {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise LinksError(f"links file {path} is not valid JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("links"), list):
        raise LinksError(f"links file {path} has no 'links' list (see specs/scenario.md)")
    return obj


def resolve_links(path: Path, names: list[str]) -> dict:
    """The per-direction links between `names` described by a scenario or a location file."""
    obj = _read_json(path)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    if "locations" in obj:
        locs = obj["locations"]
        if not isinstance(locs, list) or not locs:
            raise LinksError(f"links file {path}: 'locations' must be a non-empty list")
        table: dict[tuple[str, str], tuple[float, float]] = {}
        for i, ln in enumerate(obj["links"]):
            try:
                a, b = ln["a"], ln["b"]
                lat = _pair(ln["latency_ms"], f"links[{i}].latency_ms")
                bw = _pair(ln["bandwidth_mbps"], f"links[{i}].bandwidth_mbps")
            except KeyError as e:
                raise LinksError(f"links file {path}: links[{i}] lacks {e}") from None
            table[(a, b)] = (lat[0], published_bandwidth_mbps(bw[0]))
            table[(b, a)] = (lat[1], published_bandwidth_mbps(bw[1]))
        intra = obj.get("intra_location", {"latency_ms": 1, "bandwidth_mbps": 10000})
        same = (_num(intra.get("latency_ms", 1), "intra_location.latency_ms"),
                _num(intra.get("bandwidth_mbps", 10000), "intra_location.bandwidth_mbps"))
        where = {n: locs[i % len(locs)] for i, n in enumerate(names)}
        for a in names:
            for b in names:
                if a == b:
                    continue
                la, lb = where[a], where[b]
                val = same if la == lb else table.get((la, lb))
                if val is None:
                    raise LinksError(f"links file {path} has no link between locations {la} and {lb}")
                out[(a, b)] = val
    else:
        known = set(names)
        for i, ln in enumerate(obj["links"]):
            if not isinstance(ln, dict) or "a" not in ln or "b" not in ln:
                raise LinksError(f"links file {path}: links[{i}] needs 'a' and 'b'")
            if "latency_ms" not in ln or "bandwidth_mbps" not in ln:
                continue  # a cost-only link: nothing physical to emulate
            a, b = ln["a"], ln["b"]
            if a not in known or b not in known:
                continue  # nodes of the scenario that this local swarm does not run
            lat = _pair(ln["latency_ms"], f"links[{i}].latency_ms")
            bw = _pair(ln["bandwidth_mbps"], f"links[{i}].bandwidth_mbps")
            out[(a, b)] = (lat[0], bw[0])
            out[(b, a)] = (lat[1], bw[1])
    for (a, b), (lat, bw) in out.items():
        if bw <= 0:
            raise LinksError(f"links file {path}: bandwidth {a}->{b} must be positive")
    return {"links": [{"a": a, "b": b, "latency_ms": lat, "bandwidth_mbps": bw}
                      for (a, b), (lat, bw) in sorted(out.items())]}


def load_links(path: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """`{(a, b): (one-way latency ms, bandwidth Mbit/s)}` from a file written by `resolve_links`."""
    obj = _read_json(path)
    out = {}
    for i, ln in enumerate(obj["links"]):
        try:
            out[(ln["a"], ln["b"])] = (_num(ln["latency_ms"], f"links[{i}].latency_ms"),
                                       _num(ln["bandwidth_mbps"], f"links[{i}].bandwidth_mbps"))
        except (KeyError, TypeError):
            raise LinksError(f"links file {path}: links[{i}] needs a, b, latency_ms and bandwidth_mbps") from None
    return out

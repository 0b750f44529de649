"""Scaled formation's arcs are fixed when it opens, so a node measures the links of the peers heard of while it
measured before opening it (runtime/node/scaledformation.py `measure_whole`)."""

from __future__ import annotations

import trio

from gwtf_node.runtime.node.scaledformation import WHOLE_ROUNDS, measure_whole


def _run(known_later: dict[str, list[str]], scaled: bool, nxt=("a",), prv=("b",)):
    """`known_later[p]`: the peers heard of while the link to `p` is measured (next-stage ids start with "n")."""
    measured: list[tuple[str, bool]] = []
    heard: list[str] = []

    async def measure(peer: str, next_side: bool) -> None:
        await trio.sleep(0)
        measured.append((peer, next_side))
        heard.extend(known_later.get(peer, []))

    def side(prefix):
        base = list(nxt) if prefix == "n" else list(prv)
        return lambda: base + [p for p in heard if p.startswith(prefix) and p not in base]

    got = trio.run(measure_whole, measure, "me", list(nxt), list(prv),
                   (side("n"), side("p")) if scaled else None)
    return got, measured


def test_peers_heard_of_while_measuring_are_measured_before_formation_opens():
    (nxt, prv), measured = _run({"a": ["p1"], "p1": ["n1"]}, scaled=True)
    assert nxt == ["a", "n1"] and prv == ["b", "p1"]
    assert measured == [("a", True), ("b", False), ("p1", False), ("n1", True)]  # each once, its side


def test_without_scaled_formation_one_round_measures_what_was_asked():
    (nxt, prv), measured = _run({"a": ["p1"]}, scaled=False)
    assert (nxt, prv) == (["a"], ["b"]) and measured == [("a", True), ("b", False)]


def test_a_swarm_that_keeps_growing_stops_after_a_bound_of_rounds():
    chain = {f"n{i}" if i else "a": [f"n{i + 1}"] for i in range(50)}
    (nxt, _), measured = _run(chain, scaled=True)
    assert len(measured) == WHOLE_ROUNDS + 1 and len(nxt) == WHOLE_ROUNDS  # those heard of later: added after it
    assert {p for p, _ in measured} >= set(nxt)  # every link it returns is measured

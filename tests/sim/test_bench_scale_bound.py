"""The throughput bound of `scripts/bench_scale.py` (`sim/bound.py`): the maximum flow of microbatches through the
stages, with the CPU the nodes share as a budget on it, on a hand-made swarm whose answer is worked out below."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gwtf_node.sim.bound import throughput_bound

from support.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script("bench_scale")


# d0 (20 microbatches/s) -> stage 0: a (10/s), b (5/s) -> stage 1: c (10/s), e (10/s) -> d0
STAGE = {"d0": -1, "a": 0, "b": 0, "c": 1, "e": 1}
RATE = {"d0": 20.0, "a": 10.0, "b": 5.0, "c": 10.0, "e": 10.0}
CPU = {"d0": 0.05, "a": 0.1, "b": 0.2, "c": 0.1, "e": 0.1}  # CPU seconds per microbatch


def links(slow: float = math.inf) -> dict[tuple[str, str], float]:
    out = {("d0", "a"): math.inf, ("d0", "b"): math.inf, ("c", "d0"): math.inf, ("e", "d0"): math.inf}
    for x in ("a", "b"):
        for y in ("c", "e"):
            out[(x, y)] = slow if x == "a" else math.inf
    return out


def test_bound_is_the_max_flow_through_nodes_and_links() -> None:
    bound = throughput_bound
    assert bound(STAGE, RATE, links())["microbatches_per_s"] == pytest.approx(15.0)  # stage 0: 10 + 5
    # a's two links carry 4 each: a passes 8 of its 10
    got = bound(STAGE, RATE, links(slow=4.0))
    assert got["microbatches_per_s"] == pytest.approx(13.0) and got["limited_by"] == "flow"
    # a link that skips a stage (d0 -> stage 1) is no edge of the pipeline
    skip = links() | {("d0", "c"): math.inf}
    assert bound(STAGE, RATE, skip)["microbatches_per_s"] == pytest.approx(15.0)


def test_shared_cores_take_the_cheapest_paths_first() -> None:
    bound = throughput_bound
    # via a: 0.05 + 0.1 + 0.1 = 0.25 CPU s per microbatch (up to 10/s); via b: 0.35 (up to 5/s)
    two = bound(STAGE, RATE, links(), CPU, cores=2.0)
    assert two["microbatches_per_s"] == pytest.approx(8.0, rel=1e-4)  # 2 / 0.25, all through a
    assert two["limited_by"] == "cpu" and two["flow_only"] == pytest.approx(15.0)
    three = bound(STAGE, RATE, links(), CPU, cores=3.0)
    assert three["microbatches_per_s"] == pytest.approx(10 + 0.5 / 0.35, rel=1e-4)  # a full, b on the rest
    plenty = bound(STAGE, RATE, links(), CPU, cores=10.0)  # 10 x 0.25 + 5 x 0.35 = 4.25 CPU s: the flow binds
    assert plenty["microbatches_per_s"] == pytest.approx(15.0) and plenty["limited_by"] == "flow"


def test_swarm_bound_turns_measurements_into_capacities() -> None:
    bench = _bench()
    status = {n: {"role": "data" if s < 0 else "relay", "stage": None if s < 0 else s} for n, s in STAGE.items()}
    window = {n: {"microbatches": 10.0, "sent_bytes": 10.0 * 125_000, "cpu_s": 5.0, "seconds": 20.0} for n in STAGE}
    part = {-1: 0.05, 0: 0.1, 1: 0.1}  # every part's CPU seconds per microbatch, alone
    # 125 kB per microbatch at 10 Mbit/s (1.25 MB/s): 10 microbatches/s through each node's network card
    got = bench.swarm_bound(status, window, {n: 10.0 for n in STAGE}, 100.0, part)
    assert got["node_rate"]["d0"] == pytest.approx(10.0)  # its NIC, not its compute (20/s), binds
    assert got["node_rate"]["b"] == pytest.approx(10.0)
    assert got["microbatches_per_s"] == pytest.approx(10.0) and got["limited_by"] == "flow"
    assert got["cores_used"] == pytest.approx(5 * 5.0 / 20.0)  # what the processes used over the window
    # fast links, 2 cores: 0.25 CPU s per microbatch on every path
    cpu = bench.swarm_bound(status, window, {n: 1000.0 for n in STAGE}, 2.0, part)
    assert cpu["microbatches_per_s"] == pytest.approx(8.0, rel=1e-4) and cpu["limited_by"] == "cpu"


def test_flow_shares_give_each_node_a_cpu_weight_in_proportion_to_its_parts_work() -> None:
    bench = _bench()
    carries = {"d0": 16, "r0_0": 8, "r0_1": 8, "r1_0": 8, "r1_1": 8}
    # the data node: 16 microbatches x 0.24 s; a relay: 8 x 0.12 (stage 0) or 8 x 0.06 (stage 1)
    nice = bench.flow_nice({-1: 0.24, 0: 0.12, 1: 0.06}, carries)
    assert nice["d0"] == 0  # the busiest
    assert nice["r0_0"] == nice["r0_1"] == 6  # 4x less work: 1.25^6 = 3.8
    assert nice["r1_0"] == nice["r1_1"] == 9  # 8x less: 1.25^9 = 7.5
    assert bench.flow_nice({-1: 1e-12, 0: 100.0, 1: 100.0}, carries)["d0"] == 19  # within nice's range


@pytest.mark.parametrize("argv, says", [(["--settings", "fp16"], "--settings fp16: use fp32, bf16, bf16+adatopk"),
                                        (["--rates", "fast"], "--rates takes positive Mbit/s"),
                                        (["--iterations", "1"], "--iterations must be at least 2"),
                                        (["--cpu-shares", "fair"], "--cpu-shares: invalid choice: 'fair'")])
def test_bad_flags_get_one_line(argv: list[str], says: str) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_scale.py"), *argv], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_swarm_cpu_splits_what_a_microbatch_cost_and_bounds_the_flow_with_it() -> None:
    bench = _bench()
    from bench_scale_measure import swarm_cpu

    # 10 microbatches: compute 1 s, products 0.5 s of the aggregations' 2 s, the process 4 s in all
    w = {"microbatches": 10.0, "cpu_s": 4.0, "compute_cpu_s": 1.0, "work_cpu_s": 1.5, "products_cpu_s": 0.5,
         "aggregation_cpu_s": 2.0, "sent_bytes": 1.0, "seconds": 20.0}
    got = swarm_cpu({"a": w})["a"]
    assert got["compute"] == pytest.approx(0.1) and got["products"] == pytest.approx(0.05)
    assert got["outside_torch"] == pytest.approx(0.1)  # 4 - 2 (aggregations) - 1 (compute), per microbatch
    assert got["pipeline"] == pytest.approx(0.2) and got["total"] == pytest.approx(0.25)
    assert got["aggregation_rest"] == pytest.approx(0.15)
    status = {n: {"role": "data" if s < 0 else "relay", "stage": None if s < 0 else s} for n, s in STAGE.items()}
    window = {n: {"microbatches": 10.0, "sent_bytes": 1.0, "cpu_s": 5.0, "seconds": 20.0} for n in STAGE}
    part = {-1: 0.05, 0: 0.1, 1: 0.1}
    # the nodes' own costs, twice the parts' alone: half the flow on 2 cores
    own = bench.swarm_bound(status, window, {n: 1000.0 for n in STAGE}, 2.0, part, {n: 2 * CPU[n] for n in STAGE})
    assert own["microbatches_per_s"] == pytest.approx(4.0, rel=1e-4) and own["limited_by"] == "cpu"

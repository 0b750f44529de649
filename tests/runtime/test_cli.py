"""The gwtf-node command line: `sim gen-flow` and `sim flow`, as a subprocess and in-process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gwtf_node import cli
from gwtf_node.protocol.scenario import parse_scenario
from support.scenarios import SMALL_TWO_STAGE

SMALL = SMALL_TWO_STAGE
KEYS = {"scenario", "policy", "seed", "flows", "num_flows", "total_cost", "mean_cost", "max_cost",
        "rounds", "converged_round", "messages"}


def run(*args):
    return subprocess.run([sys.executable, "-m", "gwtf_node.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.json"
    p.write_text(json.dumps(SMALL))
    return str(p)


def test_gen_flow_subprocess_valid_and_repeatable():
    a = run("sim", "gen-flow", "--setting", "1", "--seed", "3")
    b = run("sim", "gen-flow", "--setting", "1", "--seed", "3")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    sc = parse_scenario(json.loads(a.stdout))
    assert sc.stages == 8 and len(sc.relays_of_stage(0)) == 5


def test_gen_flow_in_process(capsys):
    assert cli.main(["sim", "gen-flow", "--setting", "1", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert cli.main(["sim", "gen-flow", "--setting", "1", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first
    parse_scenario(json.loads(first))
    assert cli.main(["sim", "gen-flow", "--setting", "1", "--seed", "4"]) == 0
    assert capsys.readouterr().out != first


def check_json(out, policy, seed=0):
    obj = json.loads(out)
    assert KEYS <= set(obj)
    assert obj["scenario"] == "small" and obj["policy"] == policy and obj["seed"] == seed
    assert obj["num_flows"] == len(obj["flows"]) == 3
    for f in obj["flows"]:
        assert set(f) == {"data_node", "path", "cost"} and f["data_node"] == "d0" and len(f["path"]) == 2
    assert obj["total_cost"] == sum(f["cost"] for f in obj["flows"])
    assert obj["max_cost"] == max(f["cost"] for f in obj["flows"])
    return obj


@pytest.mark.parametrize("policy", ["gwtf", "swarm", "optimal"])
def test_flow_json_in_process(small, capsys, policy):
    assert cli.main(["sim", "flow", "--scenario", small, "--policy", policy, "--json"]) == 0
    obj = check_json(capsys.readouterr().out, policy)
    if policy != "swarm":
        assert obj["total_cost"] == 34.0  # optimum: d0-a0-b0-d0 (4) + d0-a0-b1-d0 (15) + d0-a1-b1-d0 (15)
    if policy == "gwtf":
        assert obj["messages"] > 0 and 0 <= obj["converged_round"] <= obj["rounds"]


@pytest.mark.parametrize("policy", ["gwtf", "swarm", "optimal"])
def test_flow_json_subprocess(small, policy):
    r = run("sim", "flow", "--scenario", small, "--policy", policy, "--json", "--seed", "2")
    assert r.returncode == 0, r.stderr
    check_json(r.stdout, policy, seed=2)


def test_flow_summary_readable(small, capsys):
    assert cli.main(["sim", "flow", "--scenario", small, "--policy", "optimal"]) == 0
    out = capsys.readouterr().out
    assert "scenario small" in out and "policy optimal" in out and "flows 3" in out
    assert "d0" in out and " -> " in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    r = run("sim", "flow", "--scenario", small)
    assert r.returncode == 0 and "policy gwtf" in r.stdout and "converged in round" in r.stdout


def mutate(fn):
    obj = json.loads(json.dumps(SMALL))
    fn(obj)
    return json.dumps(obj)


BAD = {
    "unknown-node": (mutate(lambda o: o["links"].append({"a": "a0", "b": "ghost", "cost": 1})), "ghost"),
    "bad-stage": (mutate(lambda o: o["nodes"][1].update(stage=2)), "stage"),
    "negative-stage": (mutate(lambda o: o["nodes"][1].update(stage=-1)), "stage"),
    "duplicate-id": (mutate(lambda o: o["nodes"].append({"id": "a0", "role": "relay", "stage": 0,
                                                          "capacity": 1})), "duplicate"),
    "negative-cost": (mutate(lambda o: o["links"][0].update(cost=-3)), "cost"),
    "negative-capacity": (mutate(lambda o: o["nodes"][2].update(capacity=-1)), "capacity"),
    "malformed-json": ('{"name": "x", "stages": 2, "nodes": [', "JSON"),
}


def write_bad(tmp_path, key):
    if key == "missing-file":
        return str(tmp_path / "nope.json"), "does not exist"
    text, word = BAD[key]
    p = tmp_path / f"{key}.json"
    p.write_text(text)
    return str(p), word


ALL_BAD = [*BAD, "missing-file"]


@pytest.mark.parametrize("key", ALL_BAD)
def test_bad_scenario_in_process(tmp_path, capsys, key):
    path, word = write_bad(tmp_path, key)
    assert cli.main(["sim", "flow", "--scenario", path]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert cap.out == ""
    assert len(err.splitlines()) == 1 and word.lower() in err.lower() and "Traceback" not in err


@pytest.mark.parametrize("key", ALL_BAD)
def test_bad_scenario_subprocess(tmp_path, key):
    path, word = write_bad(tmp_path, key)
    r = run("sim", "flow", "--scenario", path, "--policy", "optimal")
    assert r.returncode == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and word.lower() in err.lower() and "Traceback" not in r.stderr
    assert r.stdout == ""


BAD_FLAGS = [
    ["--policy", "magic"],
    ["--rounds", "0"],
    ["--rounds", "x"],
    ["--seed", "-1"],
]


@pytest.mark.parametrize("flags", BAD_FLAGS)
def test_bad_flags(small, capsys, flags):
    assert cli.main(["sim", "flow", "--scenario", small, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("args", [
    ["sim", "flow", "--scenario", "{s}", "--policy", "magic"],
    ["sim", "flow", "--scenario", "{s}", "--rounds", "0"],
    ["sim", "gen-flow", "--setting", "9"],
    ["sim"],
    [],
])
def test_bad_flags_subprocess(small, args):
    r = run(*[a.replace("{s}", small) for a in args])
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1

"""`scripts/bench_flow_delays.py`: the flow machines with message delays unrelated to the links' costs."""

from __future__ import annotations

import json

import pytest

from support.helpers import load_script


def _bench():
    return load_script("bench_flow_delays")


def test_each_range_against_the_optimum(capsys):
    assert _bench().main(["--stages", "3", "--per-stage", "5", "--seeds", "1", "--delays", "none", "50-200",
                          "--rounds", "60", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["delay_ms"] for r in rows] == ["none", "50-200"]
    for r in rows:
        assert r["flows"] == r["max_flow"] == 5 and r["vs_opt"] == 1.0 and r["inconsistent_links"] == 0


@pytest.mark.parametrize("bad, says", [("5-x", "LO-HI in milliseconds"), ("9-3", "0 <= LO <= HI")])
def test_a_bad_delay_range_exits_2_with_what_to_fix(bad, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        _bench().main(["--delays", bad])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_no_seeds_exits_2(capsys):
    assert _bench().main(["--seeds", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err

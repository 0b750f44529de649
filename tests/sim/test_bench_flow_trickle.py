"""`scripts/bench_flow_trickle.py`: relays that join while the flows form, side by side with and without formation
waves."""

from __future__ import annotations

import json

from support.helpers import load_script


def _bench():
    return load_script("bench_flow_trickle")


def test_one_seed_reports_both_variants(capsys):
    assert _bench().main(["--relays", "40", "--stages", "4", "--joins", "3", "--every", "1", "--seeds", "1",
                          "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["joins"] == 3 and row["max_flow"] > 0
    for variant in ("gwtf", "no formation waves"):
        assert 0 < row[variant]["flows"] <= row["max_flow"] and row[variant]["per_node"] > 0
    assert row["gwtf"]["flows"] == row["max_flow"] and row["gwtf"]["vs_opt"] == 1.0


def test_bad_arguments_exit_2(capsys):
    assert _bench().main(["--relays", "4", "--stages", "8"]) == 2
    assert _bench().main(["--joins", "400"]) == 2
    assert "JOINS" in capsys.readouterr().err

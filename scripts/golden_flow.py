#!/usr/bin/env python3
"""Golden check of the flow machines: the sha256 of every message they deliver, in order.

Each case is one simulator run whose complete message trace (time, sender,
receiver, repr of the message; `gwtf-node sim flow --trace`) is hashed
together with the run's JSON result:

* `flow-s<N>-seed<S>[-anneal]`: `gwtf-node sim gen-flow --setting N --seed S`
  into a file, then what `gwtf-node sim flow --scenario FILE --seed S --json
  --trace T [--anneal]` runs (the same functions, in this process, the trace
  streamed into the hash), for settings 1-6 (annealing on setting 6: 30 rounds);
* `churn-s<N>-seed<S>`: `sim/flowchurn.py`'s `run_churn` with 10 % of the
  relays killed (the churn of scripts/bench_flow_churn.py).

A refactoring of the flow machines that must not change behaviour leaves every
line identical:

    python scripts/golden_flow.py --write scripts/golden_flow.sha256   # before
    python scripts/golden_flow.py --check scripts/golden_flow.sha256   # after: exit 1 on any difference
    python scripts/golden_flow.py --traces /tmp/traces                 # also keep the traces (to diff them)

`scripts/golden_flow.sha256` holds the traces of the flow machines as they
are; a change of behaviour rewrites it (`--write`), with the figures it
changed in its commit.  `--moves-off` turns the improvement moves off
explicitly (they are off by default).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import random
import sys
import tempfile
from pathlib import Path

from gwtf_node.cli import _load_scenario, run_policy
from gwtf_node.cli import main as cli_main
from gwtf_node.protocol.flow import FlowConfig
from gwtf_node.sim.flowchurn import random_churn, run_churn
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import FLOW_SETTINGS, load_flow_setting

ANNEAL_ROUNDS = {6: 30}  # annealing on setting 6 sends ~50x the messages: a shorter run still covers every move
FLOW_CASES = [(setting, 0, anneal) for setting in range(1, 7) for anneal in (False, True)] \
    + [(setting, 1, False) for setting in (1, 3, 5, 6)]
CHURN_CASES = [(setting, seed) for setting in (1, 3, 5) for seed in (0, 1, 2)]


class _Sink:
    """A text file that hashes what is written to it (and keeps it when a path is given)."""

    def __init__(self, keep: Path | None) -> None:
        self.h = hashlib.sha256()
        self.f = keep.open("w", encoding="utf-8") if keep is not None else None

    def write(self, s: str) -> int:
        self.h.update(s.encode())
        if self.f is not None:
            self.f.write(s)
        return len(s)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def case_name(setting: int, seed: int, anneal: bool) -> str:
    rounds = ANNEAL_ROUNDS.get(setting, 120) if anneal else 120
    return f"flow-s{setting}-seed{seed}{'-anneal' if anneal else ''}{f'-r{rounds}' if rounds != 120 else ''}"


MOVES_OFF = None  # --moves-off: FlowConfig(improve=False) for the runs without --anneal (see main)


def flow_case(setting: int, seed: int, anneal: bool, traces: Path | None) -> tuple[str, str]:
    """`gwtf-node sim gen-flow --setting N --seed S > F; gwtf-node sim flow --scenario F --seed S --json --trace T
    [--anneal --rounds R]`, run in this process with the trace streamed into the hash (a setting-6 trace has
    hundreds of MB)."""
    name = case_name(setting, seed, anneal)
    rounds = ANNEAL_ROUNDS.get(setting, 120) if anneal else 120
    sink = _Sink(traces / f"{name}.txt" if traces is not None else None)
    with tempfile.TemporaryDirectory() as tmp:
        sc = Path(tmp) / "scenario.json"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli_main(["sim", "gen-flow", "--setting", str(setting), "--seed", str(seed)])
        sc.write_text(out.getvalue())
        scenario = _load_scenario(str(sc), None)  # as cmd_flow
    try:
        if MOVES_OFF is not None and not anneal:
            res = run_gwtf(scenario, seed=seed, rounds=rounds, base=MOVES_OFF, trace=sink)
        else:
            res = run_policy(scenario, "gwtf", seed, rounds, anneal=anneal, trace=sink)
    finally:
        sink.close()
    result = res.to_json()
    result.pop("messages_by_type", None)  # as cmd_flow --json
    sink.h.update((json.dumps(result) + "\n").encode())
    return name, sink.h.hexdigest()


def churn_case(setting: int, seed: int, traces: Path | None) -> tuple[str, str]:
    name = f"churn-s{setting}-seed{seed}"
    sc = load_flow_setting(setting, seed)
    fs = FLOW_SETTINGS[setting]
    churn = random_churn(sc, random.Random(10_000 + seed), 0.1, 0, fs.capacity, fs.link_cost, 1.0)
    sink = _Sink(traces / f"{name}.txt" if traces is not None else None)
    try:
        res = run_churn(sc, churn, seed=seed, base=MOVES_OFF, trace=sink)
    finally:
        sink.close()
    summary = {"before": res.before.to_json(), "after": res.after.to_json(),
               "reconverge_rounds": res.reconverge_rounds, "messages_after": res.messages_after}
    sink.h.update(json.dumps(summary, sort_keys=True).encode())
    return name, sink.h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="FILE", help="record the hashes in FILE")
    ap.add_argument("--check", metavar="FILE", help="compare with the hashes in FILE; exit 1 on a difference")
    ap.add_argument("--traces", metavar="DIR", help="also keep every trace in DIR")
    ap.add_argument("--only", nargs="+", metavar="CASE", help="run only these cases (names as printed)")
    ap.add_argument("--moves-off", action="store_true",
                    help="runs without --anneal with FlowConfig(improve=False): the improvement moves off explicitly")
    args = ap.parse_args(argv)
    global MOVES_OFF
    if args.moves_off:
        MOVES_OFF = FlowConfig("-", False, 0, (), {}, {}, improve=False)
    traces = Path(args.traces) if args.traces else None
    if traces is not None:
        traces.mkdir(parents=True, exist_ok=True)
    cases = [(case_name(s, e, a), lambda s=s, e=e, a=a: flow_case(s, e, a, traces))
             for s, e, a in FLOW_CASES]
    cases += [(f"churn-s{s}-seed{e}", lambda s=s, e=e: churn_case(s, e, traces)) for s, e in CHURN_CASES]
    if args.only:
        cases = [c for c in cases if c[0] in args.only]
    expected = {}
    if args.check:
        for line in Path(args.check).read_text().splitlines():
            if line.strip():
                digest, name = line.split()
                expected[name] = digest
    lines, bad = [], 0
    for _, run in cases:
        name, digest = run()
        verdict = ""
        if args.check:
            ok = expected.get(name) == digest
            bad += not ok
            verdict = "  ok" if ok else "  DIFFERS"
        print(f"{digest}  {name}{verdict}", flush=True)
        lines.append(f"{digest}  {name}\n")
    if args.write:
        Path(args.write).write_text("".join(lines))
    if args.check:
        print(f"{len(cases) - bad} of {len(cases)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

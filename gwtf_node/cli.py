"""The `gwtf-node` command line.

Errors a person can fix (bad flags, bad scenario files) print one line to
stderr and exit with status 2; nothing here prints a traceback for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

EXIT_USAGE = 2


class CliError(Exception):
    """A problem with the user's input; the message says what to fix."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every other input error
        raise CliError(f"{self.prog}: {message}")


def _int_at_least(lowest: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {v}")
        return v
    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def _load_scenario(path: str, activation_mb: float | None):
    from .protocol.scenario import ScenarioError, parse_scenario

    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        raise CliError(f"scenario file {path!r} does not exist") from None
    except IsADirectoryError:
        raise CliError(f"scenario path {path!r} is a directory, not a JSON file") from None
    except PermissionError:
        raise CliError(f"cannot read scenario file {path!r}: permission denied") from None
    except UnicodeDecodeError:
        raise CliError(f"scenario file {path!r} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise CliError(f"scenario file {path!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    try:
        return parse_scenario(obj, activation_mb=activation_mb)
    except ScenarioError as e:
        raise CliError(f"bad scenario {path!r}: {e}") from None


def cmd_gen_flow(args: argparse.Namespace) -> int:
    from .sim.scenarios import flow_setting_scenario

    json.dump(flow_setting_scenario(args.setting, args.seed), sys.stdout, indent=None if args.compact else 1)
    sys.stdout.write("\n")
    return 0


def run_policy(scenario, policy: str, seed: int, rounds: int, anneal: bool = False):
    """Route a scenario with one policy; shared by the CLI and the benchmark."""
    if policy == "gwtf":
        from .protocol.flow import FlowConfig
        from .sim.flowsim import run_gwtf

        base = FlowConfig("-", False, 0, (), {}, {}, improve=anneal)
        return run_gwtf(scenario, seed=seed, rounds=rounds, base=base)
    from .sim.baselines import optimal_routing, swarm_routing

    if policy == "swarm":
        return swarm_routing(scenario, seed=seed)
    return optimal_routing(scenario, seed=seed)


def _summary(res) -> str:
    lines = [
        f"scenario {res.scenario}  policy {res.policy}  seed {res.seed}",
        f"flows {res.num_flows}  total cost {res.total_cost:g}  mean {res.mean_cost:.2f}  max {res.max_cost:g}",
    ]
    if res.policy == "gwtf":
        lines.append(f"converged in round {res.converged_round} of {res.rounds}  messages {res.messages}")
    if "lp_bound_mean_cost" in res.extra:
        lines.append(f"LP bound: mean {res.extra['lp_bound_mean_cost']:.2f} over {res.extra['lp_max_flow']:g} flows")
    width = max((len(f.data_node) for f in res.flows), default=2)
    for f in sorted(res.flows, key=lambda f: (f.data_node, f.cost, f.path)):
        lines.append(f"  {f.data_node:<{width}}  {f.cost:8.2f}  {' -> '.join(f.path)}")
    return "\n".join(lines)


def cmd_flow(args: argparse.Namespace) -> int:
    scenario = _load_scenario(args.scenario, args.activation_mb)
    res = run_policy(scenario, args.policy, args.seed, args.rounds, anneal=args.anneal)
    if args.json:
        out = res.to_json()
        out.pop("messages_by_type", None)
        print(json.dumps(out))
    else:
        print(_summary(res))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Route one generated Table V scenario with every policy and compare them side by side."""
    from .protocol.scenario import parse_scenario
    from .sim.scenarios import flow_setting_scenario

    scenario = parse_scenario(flow_setting_scenario(args.setting, args.seed))
    print(f"flow test: setting {args.setting} of Table V, seed {args.seed}: "
          f"{len(scenario.data_nodes)} data node(s), {len(scenario.relays)} relays, {scenario.stages} stages")
    results = {p: run_policy(scenario, p, args.seed, args.rounds) for p in ("gwtf", "swarm", "optimal")}
    opt = results["optimal"]
    bound = opt.extra.get("lp_bound_mean_cost", opt.mean_cost)
    print(f"{'policy':<8} {'flows':>5} {'mean cost':>10} {'vs optimum':>11}  notes")
    for name, res in results.items():
        note = ""
        if name == "gwtf":
            note = f"converged in round {res.converged_round}, {res.messages} messages"
        elif name == "optimal" and "lp_bound_mean_cost" in res.extra:
            note = f"LP bound {bound:.2f}"
        print(f"{name:<8} {res.num_flows:>5} {res.mean_cost:>10.2f} {res.mean_cost / bound:>10.3f}x  {note}")
    print()
    print(_summary(results["gwtf"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gwtf-node", description="Decentralized LLM training with GWTF flow routing.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sim = sub.add_parser("sim", help="the deterministic simulator")
    simsub = sim.add_subparsers(dest="sim_command", required=True, parser_class=_Parser)

    g = simsub.add_parser("gen-flow", help="print a flow-test scenario of Table V of the GWTF paper")
    g.add_argument("--setting", type=int, choices=range(1, 7), required=True, metavar="{1..6}")
    g.add_argument("--seed", type=_nonneg_int, default=0)
    g.add_argument("--compact", action="store_true", help="one line of JSON")
    g.set_defaults(func=cmd_gen_flow)

    dm = simsub.add_parser("demo", help="GWTF, SWARM and the optimum side by side on a generated flow test")
    dm.add_argument("--setting", type=int, choices=range(1, 7), default=3, metavar="{1..6}")
    dm.add_argument("--seed", type=_nonneg_int, default=0)
    dm.add_argument("--rounds", type=_positive_int, default=120)
    dm.set_defaults(func=cmd_demo)

    f = simsub.add_parser("flow", help="route a scenario and print the flows reached")
    f.add_argument("--scenario", required=True, help="scenario JSON file (specs/scenario.md)")
    f.add_argument("--policy", choices=("gwtf", "swarm", "optimal"), default="gwtf")
    f.add_argument("--seed", type=_nonneg_int, default=0)
    f.add_argument("--rounds", type=_positive_int, default=120, help="most rounds to simulate (gwtf)")
    f.add_argument("--activation-mb", type=float, default=None,
                   help="activation size for links given by latency and bandwidth")
    f.add_argument("--anneal", action="store_true",
                   help="gwtf: also run Request Change/Redirect with simulated annealing (experimental)")
    f.add_argument("--json", action="store_true", help="print the JSON of specs/scenario.md")
    f.set_defaults(func=cmd_flow)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `gwtf-node` command line.

Errors a person can fix (bad flags, bad scenario files) print one line to
stderr and exit with status 2; nothing here prints a traceback for them.
"""

from __future__ import annotations

import argparse
import json
import math
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


def _port(text: str) -> int:
    v = _nonneg_int(text)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 0..65535 (0: any free port), got {v}")
    return v


def _ip_address(text: str) -> str:
    import ipaddress
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an IPv4 or IPv6 address to listen on, got {text!r}") from None


def _probability(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text!r}") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text!r}")
    return v


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


# ---------------------------------------------------------------- the daemon

def _manifest_error_types():
    from .model.manifest import ManifestError
    from .runtime.linkspec import LinksError

    return (ManifestError, LinksError)


def cmd_init_run(args: argparse.Namespace) -> int:
    from .model.manifest import default_manifest, save_manifest

    try:
        man = default_manifest(family=args.family, stages=args.stages, layers=args.layers, hidden=args.hidden,
                               seq_len=args.seq_len, microbatch_size=args.microbatch_size,
                               microbatches_per_iteration=args.microbatches, lr=args.lr, seed=args.seed,
                               run_name=args.name)
        if args.data:
            from dataclasses import replace
            from pathlib import Path

            man = replace(man, data=replace(man.data, source=[str(Path(f).resolve()) for f in args.data]))
            man.validate(check_files=True)  # the data files exist and hold enough text
        save_manifest(man, args.out)
    except _manifest_error_types() as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot write {args.out}: {e.strerror}") from None
    print(f"wrote {args.out}: run {man.run_id}, {args.family}, {len(man.stages)} stages {man.stages}")
    return 0


def _setup_logging(level: str, state_dir=None) -> None:
    import logging

    handlers: list = [logging.StreamHandler(sys.stderr)]
    logging.basicConfig(level=getattr(logging, level), handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # libp2p configures its own logger when first imported (level WARNING, no handler, no propagation, so
    # Python's last-resort handler printed its warnings bare into node.log: "Failed to read DHT message ...").
    # Import it first, then route it through our handler: its errors always, its warnings with --log-level DEBUG.
    import libp2p  # noqa: F401
    for noisy in ("libp2p", "multiaddr", "async_service", "trio"):
        lg = logging.getLogger(noisy)
        lg.setLevel(logging.WARNING if level == "DEBUG" else logging.ERROR)
        lg.propagate = True


def cmd_join(args: argparse.Namespace) -> int:
    from pathlib import Path

    import trio

    from .runtime.node import NodeOptions, run_node

    if args.role == "data" and args.stage not in (None, "auto"):
        raise CliError("--stage applies to relays; data nodes host the embedding and the head")
    stage = None
    if args.role == "relay" and args.stage not in (None, "auto"):  # no --stage: the leader places it
        try:
            stage = int(args.stage)
        except ValueError:
            raise CliError(f"--stage must be 'auto' or a stage number, got {args.stage!r}") from None
    try:
        from .model.manifest import load_manifest

        man = load_manifest(args.run, check_files=args.role == "data")  # relays hold no data
        if stage is not None and not 0 <= stage < len(man.stages):
            raise CliError(f"--stage {stage} is outside the run's stages 0..{len(man.stages) - 1}")
        if args.data_index >= args.data_nodes:
            raise CliError(f"--data-index {args.data_index} must be below --data-nodes {args.data_nodes}")
        if args.links:
            from .runtime.linkspec import load_links
            load_links(Path(args.links))
    except _manifest_error_types() as e:
        raise CliError(str(e)) from None
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from multiaddr import Multiaddr
    for b in args.bootstrap:
        if "/p2p/" not in b:
            raise CliError(f"--bootstrap {b!r} must be a multiaddr ending in /p2p/<peer id>")
        try:
            info_from_p2p_addr(Multiaddr(b))
        except Exception as e:  # multiaddr and libp2p raise several types for a bad address or peer id
            raise CliError(f"--bootstrap {b!r} is not a valid multiaddr with a peer id: {e}") from None
    try:
        Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"--state-dir {args.state_dir}: cannot create it ({e.strerror})") from None
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise CliError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    elif device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise CliError(f"--device {device}: torch sees no CUDA device on this machine (use --device cpu)")
    _setup_logging(args.log_level)
    opts = NodeOptions(device=device, run_path=Path(args.run), role=args.role, stage=stage, state_dir=Path(args.state_dir),
                       bootstrap=list(args.bootstrap), name=args.name or "", port=args.port,
                       listen_host=args.host, capacity=args.capacity, iterations=args.iterations,
                       data_index=args.data_index, data_nodes=args.data_nodes,
                       links=Path(args.links) if args.links else None, policy=args.policy)
    trio.run(run_node, opts)
    return 0


def cmd_local(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from .model.manifest import default_manifest, load_manifest, save_manifest

    try:
        if args.run:
            man = load_manifest(args.run)
        else:
            man = default_manifest(family=args.family, stages=args.stages, seed=args.seed,
                                   microbatches_per_iteration=args.microbatches)
    except _manifest_error_types() as e:
        raise CliError(str(e)) from None
    if args.links and not Path(args.links).is_file():
        raise CliError(f"--links {args.links}: no such file")
    if args.centralized:
        return _local_centralized(man, args)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gwtf-local-"))
    run_path = workdir / "run.json"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        save_manifest(man, run_path)
    except OSError as e:
        raise CliError(f"--workdir {workdir}: cannot write there ({e.strerror})") from None
    from .runtime.local import LocalError, LocalSwarm, run_local

    swarm = LocalSwarm(workdir, run_path, args.data_nodes, len(man.stages), args.relays_per_stage,
                       args.iterations, links=Path(args.links) if args.links else None, auto_stage=args.auto_stage,
                       joiners=args.joiners, join_every_s=args.join_every, policy=args.policy,
                       churn=args.churn, seed=args.seed, relay_capacity=args.relay_capacity)
    if args.links:
        from .runtime.linkspec import LinksError, resolve_links
        try:  # the same check the swarm makes when it starts, before any process is spawned
            resolve_links(Path(args.links), swarm.names())
        except LinksError as e:
            raise CliError(str(e)) from None
    bar = None
    if not args.json:
        print(f"local swarm in {workdir}: {args.data_nodes} data node(s), {len(man.stages)} stages x "
              f"{args.relays_per_stage} relays, {man.model.family} model, {args.iterations} iterations",
              file=sys.stderr)
        from tqdm import tqdm
        bar = tqdm(total=args.iterations, unit="it", file=sys.stderr)

    def show(rec: dict) -> None:
        if args.json:
            print(json.dumps(rec), flush=True)
        else:
            tput = rec["samples"] / rec["seconds"] if rec["seconds"] else 0.0
            bar.set_postfix(loss=f"{rec['loss']:.4f}", mb=rec["microbatches"], samples_s=f"{tput:.1f}",
                            refresh=False)
            bar.update(1)
    try:
        records = run_local(swarm, show)
    except LocalError as e:
        raise CliError(str(e)) from None
    finally:
        if bar is not None:
            bar.close()
    if not args.json and records:
        print(f"done: loss {records[0]['loss']:.4f} -> {records[-1]['loss']:.4f} over {len(records)} iterations; "
              f"node logs and checkpoints in {workdir}", file=sys.stderr)
    if not args.json and args.churn > 0:
        print(f"churn: {len(swarm.kills)} relay(s) SIGKILLed and restarted as joiners; microbatches completed "
              f"{sum(r.get('completed', 0) for r in records)}, deferred {sum(r.get('deferred', 0) for r in records)}, "
              f"lost {sum(r.get('lost', 0) for r in records)}", file=sys.stderr)
    return 0


def _local_centralized(man, args) -> int:
    import time

    from .model.reference import train_centralized

    t_last = [time.monotonic()]

    microbatches = man.data.microbatches_per_iteration * args.data_nodes
    samples = microbatches * man.data.microbatch_size

    def on_iteration(t: int, loss: float) -> None:
        now = time.monotonic()
        rec = {"iteration": t, "loss": loss, "microbatches": microbatches, "samples": samples,
               "seconds": round(now - t_last[0], 4)}
        t_last[0] = now
        if args.json:
            print(json.dumps(rec), flush=True)
        else:
            print(f"iteration {t}: loss {loss:.4f}, {microbatches} microbatches, {rec['seconds']:.2f} s",
                  file=sys.stderr)

    train_centralized(man, args.iterations, data_nodes=args.data_nodes, on_iteration=on_iteration)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Show what the nodes whose state directories are given (or contained) are doing."""
    import time
    from pathlib import Path

    files: list[Path] = []
    for d in args.state_dir:
        p = Path(d)
        if (p / "status.json").is_file():
            files.append(p / "status.json")
        elif p.is_dir():
            files += sorted(p.glob("*/status.json"))
        else:
            raise CliError(f"--state-dir {d}: no such directory")
    if not files:
        raise CliError("no status.json found: give the --state-dir of a running node (or of a local swarm)")
    rows = []
    for f in files:
        try:
            st = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CliError(f"{f}: unreadable status ({e})") from None
        st["age_s"] = round(time.time() - st.get("time", 0), 1)
        st["alive"] = st["age_s"] < 5
        metrics = f.parent / "metrics.jsonl"
        if metrics.is_file():
            lines = metrics.read_text().splitlines()
            if lines:
                st["last_iteration"] = json.loads(lines[-1])
        rows.append(st)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<8} {'role':<6} {'stage':>5} {'alive':<6} {'peers':>5} {'iter':>5} {'refused':>7} "
          f"{'state':<16} flows")
    for st in rows:
        flows = "; ".join(
            f"{d[:8]}: " + ", ".join(f"{st['peers'].get(j, {}).get('name') or j[:8]}x{n}" for j, n in hops.items())
            for d, hops in st.get("flows", {}).items() if hops)
        stage = st["stage"] if st["stage"] is not None else "auto"
        state = "joining" if st.get("joining") else "leaving" if st.get("leaving") else ""
        if st.get("leader") and st.get("leader") == st.get("peer_id"):
            state = f"leader (term {st.get('term')})"
        print(f"{st['name'] or st['peer_id'][:8]:<8} {st['role']:<6} {stage:>5} {str(st['alive']):<6} "
              f"{len(st['peers']):>5} {str(st.get('iteration')):>5} {st.get('refused_frames', 0):>7} "
              f"{state:<16} {flows}")
        if "last_iteration" in st:
            li = st["last_iteration"]
            loss = f"{li['loss']:.4f}" if li.get("loss") is not None else "-"
            print(f"         last iteration {li['iteration']}: loss {loss}, {li['microbatches']} microbatches "
                  f"({li.get('deferred', 0)} deferred, {li.get('lost', 0)} lost), {li['seconds']:.2f} s")
        rec = {k: v for k, v in (st.get("recovery") or {}).items() if v}
        if st.get("presumed_dead") or rec or st.get("lost_contributions"):
            lost_c = sum((st.get("lost_contributions") or {}).values())
            print(f"         crashes seen: {len(st.get('presumed_dead') or [])} peers presumed dead; "
                  f"recovery {', '.join(f'{k} {v}' for k, v in sorted(rec.items())) or 'none'}; "
                  f"{lost_c} contributions lost with a relay")
    return 0


def cmd_leave(args: argparse.Namespace) -> int:
    """Ask the node of a state directory to leave gracefully (SIGTERM) and wait until it is gone."""
    import os
    import signal
    import time
    from pathlib import Path

    status = Path(args.state_dir) / "status.json"
    try:
        st = json.loads(status.read_text())
        pid = int(st["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CliError(f"{status}: no running node here (start one with gwtf-node join --state-dir ...)") from None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise CliError(f"the node of {args.state_dir} (pid {pid}) is not running") from None
    except PermissionError:
        raise CliError(f"not allowed to signal pid {pid}: run as the user that started the node") from None
    print(f"{st.get('name') or st.get('peer_id', '')[:12]}: leaving (finishing its microbatches and aggregation)")
    deadline = time.monotonic() + args.timeout
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # exited but not yet reaped by its parent (a zombie) counts as gone
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return False

    while time.monotonic() < deadline:
        if gone():
            print("left")
            return 0
        time.sleep(0.2)
    raise CliError(f"the node (pid {pid}) is still running after {args.timeout:.0f} s; signal it again to stop at once")


# ---- sim train --------------------------------------------------------------------------------------------

def _churn(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--churn must be a probability, got {text!r}") from None
    if not 0.0 <= v <= 1.0 or math.isnan(v):
        raise argparse.ArgumentTypeError(f"--churn must be in [0, 1], got {text!r}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds, got {text!r}") from None
    if not 0.0 <= v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return v


def _add_train_parser(simsub) -> None:
    """`sim train`: every model switch of `sim.train.TrainSim` that a row of docs/bench_churn.md uses is a flag;
    the defaults are the daemon's behaviour."""
    from .sim.train import DETECT_S, ROUTINGS, SETTINGS, SWARM_REACTIONS

    t = simsub.add_parser("train", help="training iterations with churn (Table II of the GWTF paper)")
    t.add_argument("--setting", choices=SETTINGS, default="table2-heterogeneous")
    t.add_argument("--churn", type=_churn, default=0.0, help="probability per iteration that a relay crashes")
    t.add_argument("--policy", choices=("gwtf", "swarm"), default="gwtf")
    t.add_argument("--iterations", type=_positive_int, default=25)
    t.add_argument("--seed", type=_nonneg_int, default=0)
    t.add_argument("--data-nodes", type=_positive_int, default=2, help="data nodes (Table II: 2)")
    t.add_argument("--routing", choices=ROUTINGS, default="machines",
                   help="GWTF's flows: the flow machines run in the simulation (default), or the LP optimum "
                        "installed by an oracle (for comparison)")
    t.add_argument("--no-reflow", dest="reflow", action="store_false",
                   help="oracle routing: keep the initial optimum and local repairs only")
    t.add_argument("--label-waves", action="store_true", help="GWTF's flow machines announce labels in waves")
    t.add_argument("--no-lend", dest="lend", action="store_false",
                   help="GWTF: a data node does not lend its idle units to the others")
    t.add_argument("--no-fastest-unit", dest="fastest_unit", action="store_false",
                   help="GWTF: a data node launches on the cheapest free unit, not the one that came back first")
    t.add_argument("--one-wave", action="store_true",
                   help="an iteration is one wave: microbatches that find no route are deferred to the next "
                        "iteration instead of waiting for a slot (both policies; the paper's reading)")
    t.add_argument("--swarm-reacts-to", choices=SWARM_REACTIONS, default="membership",
                   help="what makes SWARM restart a microbatch in its backward pass: the membership layer's "
                        "report of a crash (default), or only its own backward timeouts (the paper's baseline)")
    t.add_argument("--gwtf-acts-on-gone", action=argparse.BooleanOptionalAction, default=True,
                   help="GWTF's data node runs a repair round when the membership layer reports a holder gone "
                        "(default, as the daemon), or waits for its relays' BackwardStuck")
    t.add_argument("--no-detect", dest="detect", action="store_false",
                   help="no membership layer for the microbatch and flow machines: crashes found by timeouts")
    t.add_argument("--detect-s", type=_seconds, default=DETECT_S,
                   help=f"the membership layer reports a crash this long after it (default {DETECT_S:g} s, the "
                        "daemon's liveness check)")
    t.add_argument("--no-unpresume", dest="unpresume", action="store_false",
                   help="a peer presumed dead on a hop deadline stays dead even while still heard")
    t.add_argument("--join-at-open", dest="join_mid_iteration", action="store_false",
                   help="joiners come in only when an iteration opens")
    t.add_argument("--can-take", choices=("all", "any"), default="all",
                   help="CAN TAKE after every downstream member of the aggregation (default) or after any one "
                        "(the paper's sentence read literally; protocol/phases.py)")
    t.add_argument("--json", action="store_true", help="one JSON object with the means over the iterations")
    t.set_defaults(func=cmd_sim_train)


SIM_TRAIN_JSON_KEYS = ("time_per_microbatch_s", "throughput_per_iteration", "communication_time_s",
                       "wasted_compute_s", "lost_microbatches", "deferred_microbatches", "lost_contributions",
                       "unfinished_iterations", "crashes")


def sim_train_options(args: argparse.Namespace) -> dict:
    """TrainSim's options from the parsed flags of `sim train`."""
    return dict(routing=args.routing, reflow=args.reflow, lend=args.lend, fastest_unit=args.fastest_unit,
                one_wave=args.one_wave, swarm_reacts_to=args.swarm_reacts_to,
                gwtf_acts_on_gone=args.gwtf_acts_on_gone, detect=args.detect, detect_s=args.detect_s,
                unpresume=args.unpresume, join_mid_iteration=args.join_mid_iteration, can_take=args.can_take,
                flow_options={"waves": True} if args.label_waves else None)


def cmd_sim_train(args: argparse.Namespace) -> int:
    from .sim.train import run_train

    rep = run_train(args.setting, args.policy, args.churn, args.iterations, args.seed, data_nodes=args.data_nodes,
                    **sim_train_options(args))
    if args.json:
        print(json.dumps({k: rep[k] for k in SIM_TRAIN_JSON_KEYS}, allow_nan=True))
        return 0
    print(f"{rep['setting']}  policy {rep['policy']}  churn {rep['churn']:g}  seed {rep['seed']}  "
          f"iterations {rep['iterations']}  routing {rep['routing']}")
    print(f"  time per microbatch   {rep['time_per_microbatch_s'] / 60:.2f} min")
    print(f"  throughput            {rep['throughput_per_iteration']:.2f} microbatches / iteration")
    print(f"  communication time    {rep['communication_time_s'] / 60:.2f} min per microbatch")
    print(f"  wasted compute        {rep['wasted_compute_s']:.2f} s per iteration")
    print(f"  lost microbatches     {rep['lost_microbatches']}  (deferred {rep['deferred_microbatches']}, "
          f"lost contributions {rep['lost_contributions']}, crashes {rep['crashes']})")
    if rep["unfinished_iterations"]:
        print(f"  unfinished iterations {rep['unfinished_iterations']}", file=sys.stderr)
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

    from .sim.join import add_join_parser

    add_join_parser(simsub, _Parser, _nonneg_int)

    _add_train_parser(simsub)

    ir = sub.add_parser("init-run", help="write a run manifest with sensible defaults")
    ir.add_argument("--out", required=True, help="where to write the manifest (JSON)")
    ir.add_argument("--name", default="demo", help="run name")
    ir.add_argument("--family", choices=("llama", "gpt"), default="llama")
    ir.add_argument("--stages", type=_positive_int, default=2, help="relay stages")
    ir.add_argument("--layers", type=_positive_int, default=None, help="transformer layers (default 2 per stage)")
    ir.add_argument("--hidden", type=_positive_int, default=64)
    ir.add_argument("--seq-len", type=_positive_int, default=64)
    ir.add_argument("--microbatch-size", type=_positive_int, default=4)
    ir.add_argument("--microbatches", type=_positive_int, default=4, help="microbatches per data node per iteration")
    ir.add_argument("--lr", type=float, default=3e-3)
    ir.add_argument("--seed", type=_nonneg_int, default=0)
    ir.add_argument("--data", nargs="+", default=None, metavar="FILE",
                    help="your own .txt / .jsonl files (default: the bundled corpus)")
    ir.set_defaults(func=cmd_init_run)

    j = sub.add_parser("join", help="start a long-lived node of a run")
    j.add_argument("--run", required=True, help="run manifest (gwtf-node init-run)")
    j.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="address of a node of the run, ending in /p2p/<peer id> (repeatable; none: first node)")
    j.add_argument("--role", choices=("data", "relay"), required=True)
    j.add_argument("--stage", default=None, help="relays: 'auto' (the default: the leader places it) or a stage number")
    j.add_argument("--state-dir", default="gwtf-state", help="identity key, checkpoints, logs, metrics")
    j.add_argument("--name", default="", help="a readable node name (also its name in --links)")
    j.add_argument("--host", type=_ip_address, default="127.0.0.1", help="address to listen on")
    j.add_argument("--port", type=_port, default=0, help="TCP port to listen on (0: any free port)")
    j.add_argument("--capacity", type=_nonneg_int, default=0,
                   help="microbatches held per iteration (0: one data node's demand)")
    j.add_argument("--iterations", type=_nonneg_int, default=0, help="data nodes: stop after N (0: forever)")
    j.add_argument("--data-index", type=_nonneg_int, default=0, help="data nodes: which shard of the data")
    j.add_argument("--data-nodes", type=_positive_int, default=1, help="data nodes of the run")
    j.add_argument("--links", default=None, help="emulated links between named nodes (resolved links file)")
    j.add_argument("--device", default="auto", help="torch device for the stage: auto (cuda if present), cpu, cuda, cuda:N")
    j.add_argument("--policy", choices=("gwtf", "swarm"), default="gwtf",
                   help="microbatch routing and crash recovery: GWTF's, or SWARM's (the baseline)")
    j.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    j.set_defaults(func=cmd_join)

    lo = sub.add_parser("local", help="a whole swarm of separate processes on loopback, training a small model")
    lo.add_argument("--data-nodes", type=_positive_int, default=1)
    lo.add_argument("--stages", type=_positive_int, default=2)
    lo.add_argument("--relays-per-stage", type=_positive_int, default=2)
    lo.add_argument("--iterations", type=_positive_int, default=20)
    lo.add_argument("--microbatches", type=_positive_int, default=4, help="per data node per iteration")
    lo.add_argument("--seed", type=_nonneg_int, default=0)
    lo.add_argument("--family", choices=("llama", "gpt"), default="llama")
    lo.add_argument("--run", default=None, help="use this run manifest instead of the embedded defaults")
    lo.add_argument("--links", default=None, help="scenario or location file to emulate link latency/bandwidth")
    lo.add_argument("--joiners", type=_nonneg_int, default=0,
                    help="relays that join with --stage auto while the swarm trains (placed by the leader)")
    lo.add_argument("--join-every", type=float, default=5.0, metavar="SECONDS", help="time between two joiners")
    lo.add_argument("--auto-stage", action="store_true",
                    help="relays join with --stage auto (one at a time) instead of being placed by the launcher")
    lo.add_argument("--relay-capacity", type=_positive_int, default=None, metavar="C",
                    help="microbatches a relay holds at once (default: the demand spread over the relays of a stage)")
    lo.add_argument("--policy", choices=("gwtf", "swarm"), default="gwtf",
                    help="microbatch routing and crash recovery of every node: GWTF's, or SWARM's (the baseline)")
    lo.add_argument("--churn", type=_probability, default=0.0, metavar="P",
                    help="each iteration, SIGKILL each relay with probability P at a random point; it comes back "
                         "as a new joiner")
    lo.add_argument("--workdir", default=None, help="state directories of the nodes (default: a new temp dir)")
    lo.add_argument("--centralized", action="store_true", help="train the same model in one process: the reference")
    lo.add_argument("--json", action="store_true", help="one JSON object per iteration on stdout")
    lo.set_defaults(func=cmd_local)

    lv = sub.add_parser("leave", help="make a running node leave gracefully (no work is wasted)")
    lv.add_argument("--state-dir", default="gwtf-state", help="the node's state directory")
    lv.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to be gone")
    lv.set_defaults(func=cmd_leave)

    stt = sub.add_parser("status", help="what the nodes of given state directories are doing")
    stt.add_argument("--state-dir", nargs="+", default=["gwtf-state"],
                     help="a node's state directory, or a directory holding several (a local swarm's workdir)")
    stt.add_argument("--json", action="store_true")
    stt.set_defaults(func=cmd_status)
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

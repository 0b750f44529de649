"""`gwtf-node sim`: flow tests, the node-addition experiment and training with churn, in virtual time."""

from __future__ import annotations

import argparse
import json
import sys

from .common import CliError, _Parser, _churn, _load_scenario, _nonneg_int, _positive_int, _scaled_formation, _seconds


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not 0.0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return v


def _fan_out(text: str) -> int | None:
    """`--phase-fan-out`: a count of parents, 0 for every member (None)."""
    v = _nonneg_int(text)
    return v or None


def cmd_gen_flow(args: argparse.Namespace) -> int:
    from ..sim.scenarios import flow_setting_scenario

    json.dump(flow_setting_scenario(args.setting, args.seed), sys.stdout, indent=None if args.compact else 1)
    sys.stdout.write("\n")
    return 0


def run_policy(scenario, policy: str, seed: int, rounds: int, anneal: bool = False, trace=None,
               pooled: bool = False, scaled: bool | None = None):
    """Route a scenario with one policy; shared by the CLI and the benchmark.  `trace` (gwtf): a text file
    that receives every delivered message, one line each (time, sender, receiver, message); `pooled` (gwtf,
    several data nodes): pooled formation, then homing (sim/pooled.py); `scaled` (gwtf, one data node): scaled
    formation first (protocol/flow/scaling.py), False label waves alone, None auto's choice (neighbourhood.py)."""
    if policy == "gwtf" and pooled and len(scenario.data_nodes) > 1:
        from ..sim.pooled import run_pooled

        return run_pooled(scenario, seed=seed, rounds=rounds)
    if policy == "gwtf":
        from ..protocol.flow import FlowConfig
        from ..sim.flowsim import run_gwtf

        base = FlowConfig("-", False, 0, (), {}, {}, improve=True, anneal=True) if anneal else None
        return run_gwtf(scenario, seed=seed, rounds=rounds, base=base, trace=trace,
                        formation={None: "auto", True: "scaling", False: "waves"}[scaled])
    from ..sim.baselines import optimal_routing, swarm_routing

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
    if args.trace is not None and args.policy != "gwtf":
        raise CliError(f"--trace records the flow machines' messages: it needs --policy gwtf, not {args.policy}")
    if args.pooled and (args.policy != "gwtf" or args.trace is not None or args.anneal):
        raise CliError("--pooled is a formation of the flow machines: it needs --policy gwtf, without --trace "
                       "and --anneal")
    if args.scaled and (args.policy != "gwtf" or args.pooled or len(scenario.data_nodes) != 1):
        raise CliError(f"--scaled forms one data node's flows with the flow machines: it needs --policy gwtf, no "
                       f"--pooled and one data node (this scenario has {len(scenario.data_nodes)})")
    scaled = _scaled_formation(args, "scaled", "waves")
    if args.trace is None:
        try:
            res = run_policy(scenario, args.policy, args.seed, args.rounds, anneal=args.anneal, pooled=args.pooled,
                             scaled=scaled)
        except ValueError as e:  # (own_arcs: cost scaling takes integer link costs)
            raise CliError(f"--scaled: {e}") from None
    else:
        try:
            with open(args.trace, "w", encoding="utf-8") as trace:
                res = run_policy(scenario, args.policy, args.seed, args.rounds, anneal=args.anneal, trace=trace,
                                 scaled=scaled)
        except OSError as e:
            raise CliError(f"cannot write the trace file {args.trace!r}: {e.strerror}") from None
    if args.json:
        out = res.to_json()
        out.pop("messages_by_type", None)
        print(json.dumps(out))
    else:
        print(_summary(res))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Route one generated Table V scenario with every policy and compare them side by side."""
    from ..protocol.scenario import parse_scenario
    from ..sim.scenarios import flow_setting_scenario

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


def cmd_sim_join(args: argparse.Namespace) -> int:
    from ..sim.join import run_join, summary

    def progress(line: str) -> None:
        print(f"sim join: {line}", file=sys.stderr, flush=True)

    res = run_join(args.setting, args.seed, with_bound=not args.no_bound, lp_starts=args.lp_starts,
                   leader_evaluations=args.leader_evaluations, progress=None if args.quiet else progress)
    print(json.dumps(res) if args.json else summary(res))
    return 0


def _add_train_parser(simsub) -> None:
    """`sim train`: every model switch of `sim.train.TrainSim` that a row of docs/bench_churn.md uses is a flag;
    the defaults are the daemon's behaviour."""
    from ..protocol.phasefan import FAN_OUT
    from ..sim.train import GEO12_SETTINGS, POLICIES, ROUTINGS, SETTINGS, TABLE6_SETTINGS

    t = simsub.add_parser("train", help="training iterations with churn (Table II of the GWTF paper)")
    t.add_argument("--setting", choices=SETTINGS + TABLE6_SETTINGS + GEO12_SETTINGS, default="table2-heterogeneous",
                   help="Table II's settings, or Table VI's (table6-xK: K times its 18 nodes; geo12-xK: the same "
                        "counts dealt to the three regions of the 12 locations)")
    t.add_argument("--churn", type=_churn, default=0.0, help="probability per iteration that a relay crashes")
    t.add_argument("--policy", choices=POLICIES, default="gwtf",
                   help="recovery policy: gwtf, swarm, or taskpool (the hybrid design's task pool)")
    t.add_argument("--iterations", type=_positive_int, default=25)
    t.add_argument("--seed", type=_nonneg_int, default=0)
    t.add_argument("--data-nodes", type=_positive_int, default=None,
                   help="data nodes (default: the setting's, Table II: 2, Table VI: 3 x K)")
    t.add_argument("--routing", choices=ROUTINGS, default="machines",
                   help="GWTF's flows: the flow machines run in the simulation (default), or the LP optimum "
                        "installed by an oracle (for comparison), or DT-FM's static schedule (dtfm: its scheduler "
                        "places the relays and forms the pipelines, recomputed after each crash)")
    t.add_argument("--dtfm-keep-stages", action="store_true",
                   help="--routing dtfm: every relay keeps its stage; DT-FM only forms the pipelines")
    t.add_argument("--placement", choices=("given", "swarm", "dtfm", "opfence"), default="given",
                   help="the relays' stages: the setting's (default: relays started with --stage N), those the "
                        "leader gives a swarm forming from scratch (swarm: every relay placed at once by the flows "
                        "its links make possible), or those DT-FM's search gives them (the routing then runs over "
                        "DT-FM's placement: GWTF's flows against DT-FM's pipelines on it), or those FusionLLM's "
                        "OP-Fence gives them (Louvain clusters of the bandwidth graph)")
    t.add_argument("--no-reflow", dest="reflow", action="store_false",
                   help="oracle routing: keep the initial optimum and local repairs only")
    t.add_argument("--label-waves", action="store_true", help="GWTF's flow machines announce labels in waves")
    t.add_argument("--pooled-formation", action="store_true",
                   help="several data nodes: form the flows as one commodity first, then send each unit home (as "
                        "the daemon's join --pooled-formation; off by default, as there)")
    t.add_argument("--scaled-formation", action="store_true",
                   help="one data node: form the flows by cost scaling first, then hand them to the flow machines "
                        "(as the daemon's join --scaled-formation; default auto, as there)")
    t.add_argument("--waves-formation", action="store_true",
                   help="form the flows by label waves alone, also where auto would scale them (as the daemon's)")
    t.add_argument("--flow-moves", choices=("off", "greedy", "anneal"), default="off",
                   help="GWTF's flow machines run Request Change / Request Redirect all the time: off (default, as "
                        "the daemon), greedy (moves that lower the cost), anneal (also worse moves, annealed)")
    t.add_argument("--no-lend", dest="lend", action="store_false",
                   help="GWTF: a data node does not lend its idle units to the others")
    t.add_argument("--no-fastest-unit", dest="fastest_unit", action="store_false",
                   help="GWTF: a data node launches on the cheapest free unit, not the one that came back first")
    t.add_argument("--one-wave", action="store_true",
                   help="an iteration is one wave: microbatches that find no route are deferred to the next "
                        "iteration instead of waiting for a slot (both policies; the paper's reading)")
    _add_membership_flags(t)
    t.add_argument("--join-at-open", dest="join_mid_iteration", action="store_false",
                   help="with --joining restart: joiners come in only when an iteration opens")
    t.add_argument("--joining", choices=("machines", "restart"), default="machines",
                   help="a crashed relay comes back as a joiner placed by the leader's membership machine, as in "
                        "the daemon (default), or in its own stage with a stage peer's state (the older model)")
    t.add_argument("--no-join-links", dest="join_links", action="store_false",
                   help="joiners and members tell the leader only their stage costs and capacities, not their link "
                        "costs (the daemon tells both, the default; the leader's search then routes over them)")
    t.add_argument("--no-spare-last", dest="spare_last", action="store_false",
                   help="churn may kill the last live relay of a stage (by default it is spared, as by "
                        "`gwtf-node local --churn`: a joiner has no state to load in a stage with no member left)")
    t.add_argument("--priors", choices=("links", "modelled"), default="links",
                   help="the recovery machines' timing priors: the daemon's rule (the link's transfer plus a "
                        "compute allowance, default) or the peer's profiled compute times its capacity")
    t.add_argument("--can-take", choices=("all", "any"), default="all",
                   help="CAN TAKE after every downstream member of the aggregation (default) or after any one "
                        "(the paper's sentence read literally; protocol/phases.py)")
    t.add_argument("--phase-fan-out", type=_fan_out, default=FAN_OUT, metavar="N",
                   help=f"parents per stage member of BEGIN AGGREGATION and CAN TAKE (default {FAN_OUT}, the "
                        "daemon's; 0: every member of the stage before, protocol/phasefan.py)")
    t.add_argument("--begin-groups", choices=("digest", "full"), default="digest",
                   help="BEGIN AGGREGATION's groups sent in full once per receiver, then by a digest while they "
                        "do not change (default, the daemon's), or in full every time (protocol/phasegroups.py)")
    t.add_argument("--json", action="store_true", help="one JSON object with the means over the iterations")
    t.set_defaults(func=cmd_sim_train)


def _add_membership_flags(t) -> None:
    """`sim train`'s flags of how crashes are learnt of and acted on (the defaults are the daemon's)."""
    from ..sim.train import DETECT_S, IDLE_DETECT_S, LOOSE_S_PER_PEER, SWARM_REACTIONS

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
    t.add_argument("--idle-detect-s", type=_seconds, default=IDLE_DETECT_S,
                   help=f"the relays near a crashed relay that do not work with it learn of it this long after it "
                        f"(default {IDLE_DETECT_S:g} s: the daemon's loose watch, a machine gone without closing its "
                        f"connections; {DETECT_S:g}: a process that ends and closes them)")
    t.add_argument("--loose-per-peer-s", type=_seconds, default=LOOSE_S_PER_PEER,
                   help=f"... or this many seconds per peer the watcher watches loosely, when more (default "
                        f"{LOOSE_S_PER_PEER:g} s: the daemon's loose floor for more than 12 loose peers; 0: the "
                        "floor whatever the swarm's size)")
    t.add_argument("--no-unpresume", dest="unpresume", action="store_false",
                   help="a peer presumed dead on a hop deadline stays dead even while still heard")


SIM_TRAIN_JSON_KEYS = ("time_per_microbatch_s", "throughput_per_iteration", "communication_time_s",
                       "wasted_compute_s", "lost_microbatches", "deferred_microbatches", "lost_contributions",
                       "unfinished_iterations", "crashes")


def sim_train_options(args: argparse.Namespace) -> dict:
    """TrainSim's options from the parsed flags of `sim train`."""
    return dict(routing=args.routing, reflow=args.reflow, lend=args.lend, fastest_unit=args.fastest_unit,
                one_wave=args.one_wave, swarm_reacts_to=args.swarm_reacts_to,
                gwtf_acts_on_gone=args.gwtf_acts_on_gone, detect=args.detect, detect_s=args.detect_s,
                idle_detect_s=args.idle_detect_s,
                loose_per_peer_s=args.loose_per_peer_s, unpresume=args.unpresume,
                join_mid_iteration=args.join_mid_iteration, can_take=args.can_take,
                phase_fan_out=args.phase_fan_out, begin_groups=args.begin_groups,
                joining=args.joining, priors=args.priors, spare_last=args.spare_last, join_links=args.join_links,
                flow_options=_flow_options(args), pooled_formation=args.pooled_formation,
                scaled_formation=_scaled_formation(args))


def _flow_options(args: argparse.Namespace) -> dict | None:
    """FlowConfig fields of every flow machine of `sim train` (None: FlowConfig's defaults, the daemon's)."""
    opts: dict = {}
    if args.label_waves:
        opts["waves"] = True
    if args.flow_moves != "off":
        opts.update(improve=True, anneal=args.flow_moves == "anneal")
    return opts or None


def cmd_sim_train(args: argparse.Namespace) -> int:
    from ..sim.train import run_train

    options = sim_train_options(args)
    if args.routing == "dtfm":
        if args.policy != "gwtf":
            raise CliError(f"--routing dtfm executes DT-FM's schedule with GWTF's microbatch machine: it needs "
                           f"--policy gwtf, not {args.policy}")
        options["dtfm_options"] = {"place": not args.dtfm_keep_stages}
        if args.placement != "given":
            raise CliError("--routing dtfm places the relays itself: drop --placement (or use --dtfm-keep-stages)")
    elif args.policy == "taskpool" and args.routing != "machines":
        raise CliError(f"--policy taskpool has no flows: drop --routing {args.routing}")
    if args.placement != "given":
        options["placement"] = args.placement
    rep = run_train(args.setting, args.policy, args.churn, args.iterations, args.seed, data_nodes=args.data_nodes,
                    **options)
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


def schedule_summary(name: str, seed: int, out: dict) -> str:
    """`sim schedule`'s text output: the cost model's figures, the search's cost, the stages and pipelines."""
    lines = [f"scenario {name}  method {out['method']}  seed {seed}",
             f"COMM-COST {out['total_cost_s']:.2f} s = data parallel {out['datap_cost_s']:.2f} s + pipeline "
             f"{out['pipelinep_cost_s']:.2f} s  (slowest forced hop back to a data node {out['closing_hop_s']:.2f} s)"]
    if "clusters" in out:  # OP-Fence: its clusters and every pipeline's Eq. 3 estimate
        lines.append(f"OP-Fence: {len(out['clusters'])} Louvain clusters, {out['cpu_s']:.3f} s CPU "
                     "(COMM-COST: DT-FM's cost model of this placement)")
        for k, c in enumerate(out["clusters"]):
            lines.append(f"  cluster {k}: {' '.join(c)}")
        for d, runs in out["runs"].items():
            where = ", ".join((f"stages {a}-{b}" if b > a else f"stage {a}") + f" in cluster {k}" for k, a, b in runs)
            lines.append(f"  {d}: runs {where}  (Eq. 3: {out['estimated_pipeline_s'][d]:.2f} s)")
    else:
        lines.append(f"search: {out['generations']} generations, {out['evaluations']} cost-model evaluations, "
                     f"{out['cpu_s']:.2f} s CPU")
    for s, group in enumerate(out["stages"]):
        lines.append(f"  stage {s}: {' '.join(group)}")
    for p in out["pipelines"]:
        lines.append(f"  {p['data_node']}: {' -> '.join(p['path'])} -> {p['data_node']}")
    return "\n".join(lines)


def cmd_sim_schedule(args: argparse.Namespace) -> int:
    """DT-FM's scheduler (or OP-Fence) on a scenario: which relay hosts which stage, and the pipelines."""
    from ..protocol.scenario import ScenarioError
    from ..sim.schedule import GENERATIONS, POPULATION, instance_from_scenario, schedule

    if args.method == "opfence":
        given = [f for f, v in (("--generations", args.generations), ("--population", args.population))
                 if v is not None]
        if given:
            raise CliError(f"{' and '.join(given)} set DT-FM's genetic algorithm: OP-Fence has none, drop "
                           f"{'them' if len(given) > 1 else 'it'} (or use --method dtfm/kl)")
        kw = {"resolution": 1.0 if args.resolution is None else args.resolution}
    else:
        if args.resolution is not None:
            raise CliError(f"--resolution is OP-Fence's Louvain resolution: it needs --method opfence, "
                           f"not {args.method}")
        kw = {"population": POPULATION if args.population is None else args.population,
              "generations": GENERATIONS if args.generations is None else args.generations}
    scenario = _load_scenario(args.scenario, args.activation_mb)
    try:
        inst = instance_from_scenario(scenario, args.gradient_mb)
    except ScenarioError as e:
        raise CliError(f"scenario {args.scenario!r}: {e}") from None
    sched = schedule(inst, args.method, args.seed, **kw)
    out = sched.to_json()
    if args.json:
        print(json.dumps(dict(scenario=scenario.name, seed=args.seed, **out)))
    else:
        print(schedule_summary(scenario.name, args.seed, out))
    return 0


def _add_schedule_parser(simsub) -> None:
    from ..sim.schedule import GENERATIONS, POPULATION, SCHEDULE_METHODS, STAGE_GRADIENT_MB

    sc = simsub.add_parser("schedule", help="DT-FM's scheduler (the optimal-schedule baseline) or FusionLLM's "
                                            "OP-Fence on a scenario")
    sc.add_argument("--scenario", required=True,
                    help="scenario JSON file (specs/scenario.md); relays = stages x data nodes, every pair linked")
    sc.add_argument("--method", choices=SCHEDULE_METHODS, default="dtfm",
                    help="dtfm: the genetic algorithm with DT-FM's local search; kl: with Kernighan-Lin's; "
                         "random: one random assignment; opfence: FusionLLM's OP-Fence (Louvain clusters of the "
                         "bandwidth graph, connected runs of stages per cluster)")
    sc.add_argument("--seed", type=_nonneg_int, default=0)
    sc.add_argument("--generations", type=_nonneg_int, default=None,
                    help=f"DT-FM's genetic algorithm (default {GENERATIONS})")
    sc.add_argument("--population", type=_positive_int, default=None,
                    help=f"DT-FM's genetic algorithm (default {POPULATION})")
    sc.add_argument("--resolution", type=_positive_float, default=None,
                    help="opfence: the Louvain resolution (default 1; larger: smaller clusters)")
    sc.add_argument("--activation-mb", type=float, default=None,
                    help="c_pp: activation of a microbatch (default: the scenario's activation size)")
    sc.add_argument("--gradient-mb", type=float, default=STAGE_GRADIENT_MB,
                    help=f"c_dp: gradients of a stage (default {STAGE_GRADIENT_MB:g} MB)")
    sc.add_argument("--json", action="store_true", help="one JSON object")
    sc.set_defaults(func=cmd_sim_schedule)


def add_sim_parsers(sub) -> None:
    """`gwtf-node sim ...`: the deterministic simulator's commands."""
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
                   help="gwtf: run Request Change/Redirect all the time and take worse moves by simulated annealing "
                        "(T0 1.7, alpha 0.95; off by default: it raises the cost, docs/bench_flow.md)")
    f.add_argument("--pooled", action="store_true",
                   help="gwtf with several data nodes: form the units as one commodity, then send each home "
                        "(suffix swaps, exchanges, spreading: docs/bench_flow.md, 'Pooled formation')")
    f.add_argument("--scaled", action="store_true",
                   help="gwtf with one data node: form the flows by cost scaling first, then hand them to the flow "
                        "machines (default auto, as the daemon's: docs/bench_flow.md, 'Auto')")
    f.add_argument("--waves", action="store_true", help="gwtf: form the flows by label waves alone, also where auto "
                   "would scale them (as the daemon's join --waves-formation)")
    f.add_argument("--json", action="store_true", help="print the JSON of specs/scenario.md")
    f.add_argument("--trace", metavar="FILE", default=None,
                   help="gwtf: write every delivered message, in order, to FILE (time sender receiver message)")
    f.set_defaults(func=cmd_flow)

    j = simsub.add_parser("join", help="the node-addition experiment of Table IV / Figure 5")
    j.add_argument("--setting", type=int, choices=range(1, 6), required=True, metavar="{1..5}")
    j.add_argument("--seed", type=_nonneg_int, default=0)
    j.add_argument("--no-bound", action="store_true", help="skip the proved upper bound on the optimum (faster)")
    j.add_argument("--lp-starts", action="store_true",
                   help="gwtf: also start the search from the rounded LP relaxation (docs/bench_join_lpstarts.md)")
    j.add_argument("--leader-evaluations", type=_positive_int, default=None,
                   help="evaluation budget of the daemon's leader policy (default: the daemon's)")
    j.add_argument("--json", action="store_true", help="one JSON object; key 'improvement' per policy")
    j.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (each step and what it found, as it finishes)")
    j.set_defaults(func=cmd_sim_join)

    _add_train_parser(simsub)
    _add_schedule_parser(simsub)

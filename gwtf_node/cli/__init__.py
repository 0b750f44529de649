"""The `gwtf-node` command line: the daemon's commands here, the simulator's in `sim.py`.

Errors a person can fix (bad flags, bad manifests, scenario or links files)
print one line to stderr and exit with status 2; nothing here prints a
traceback for them.  `join` also exits with 2 when its port or state
directory is in use or a peer refuses it (another run.json, a stage the run
does not have), and with 3 when no bootstrap peer answered within
`--bootstrap-timeout` (runtime/ops/startup.py, statedir.py, bootstrap.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Sequence

from .common import (EXIT_NO_PEER, EXIT_USAGE, CliError, _announce_addr, _first_manifest_error, _ip_address,
                     _lease_seconds, _listen_addr, _load_scenario, _manifest_error_types, _nonneg_int, _Parser, _port,
                     _positive_int, _probability, _relay_nice, _scaled_formation, _seconds, _setup_logging)
from .. import ctrlc
from .service import add_parser as add_service_parser
from .config import add_config_parser, configurable
from .initrun import add_init_run_parsers
from .owner import add_owner_parsers
from .sim import SIM_TRAIN_JSON_KEYS, add_sim_parsers, cmd_sim_join, cmd_sim_train, run_policy, sim_train_options
from .status import add_status_parser

if TYPE_CHECKING:
    from ..runtime.ops.statedir import StateDirLock

__all__ = ["CliError", "EXIT_USAGE", "SIM_TRAIN_JSON_KEYS", "build_parser", "cmd_sim_join", "cmd_sim_train", "main",
           "run_policy", "sim_train_options", "_load_scenario", "_setup_logging"]


def cmd_join(args: argparse.Namespace) -> int:
    from pathlib import Path
    from ..runtime.ops.startup import StartupError, check_port_free
    from ..runtime.ops.statedir import lock_state_dir

    if args.role == "data" and args.stage not in (None, "auto"):
        raise CliError("--stage applies to relays; data nodes host the embedding and the head")
    _scaled_formation(args)  # contradicting formations: refused before anything starts
    stage = None
    if args.role == "relay" and args.stage not in (None, "auto"):  # no --stage: the leader places it
        try:
            stage = int(args.stage)
        except ValueError:
            raise CliError(f"--stage must be 'auto' or a stage number, got {args.stage!r}") from None
    try:
        from ..model.manifest import load_manifest, require_signed, verify_manifest

        man = load_manifest(args.run, check_files=args.role == "data")  # relays hold no data
        verify_manifest(man)  # signed by its owner, before the node starts
        require_signed(man, insecure_unsigned=args.insecure_unsigned)
        if stage is not None and not 0 <= stage < len(man.stages):
            raise CliError(f"--stage {stage} is outside the run's stages 0..{len(man.stages) - 1}")
        if args.data_index >= args.data_nodes:
            raise CliError(f"--data-index {args.data_index} must be below --data-nodes {args.data_nodes}")
        if args.links:
            from ..runtime.net.linkspec import load_links
            load_links(Path(args.links))
        if args.restore:
            from ..runtime.node.checkpoints import CheckpointError, load as load_checkpoint

            try:
                load_checkpoint(Path(args.restore), run_id=man.run_id)
            except CheckpointError as e:
                raise CliError(f"--restore: {e}") from None
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
    try:  # before torch and the model are loaded: a node that cannot run says so at once
        lock = lock_state_dir(Path(args.state_dir))
    except StartupError as e:
        raise CliError(str(e)) from None
    try:
        _check_own_admission(args, man)
        _check_listen(args)
        if args.metrics_port is not None:
            check_port_free(args.metrics_host, args.metrics_port, "metrics port", "choose another --metrics-port")
        return _run_join(args, stage, lock)
    except StartupError as e:
        raise CliError(str(e)) from None
    finally:
        lock.release()


CHECKPOINT_BYTES_PER_PARAM = 16  # fp32 parameters and AdamW's two moments (state_bytes) and the parameter vector


def _checkpoint_bytes(man, counts, role: str, stage: int | None) -> int:
    """About the size of one checkpoint of this node's part: its parameters (`counts`: hfconfig.parameter_counts)
    times CHECKPOINT_BYTES_PER_PARAM; a relay without a stage yet counts the largest stage."""
    if role == "data":
        params = counts.data
    else:
        stages = [counts.stage(start, end) for start, end in man.stages]
        params = stages[stage] if stage is not None else max(stages)
    return CHECKPOINT_BYTES_PER_PARAM * params


def _check_listen(args: argparse.Namespace) -> None:
    """The listen endpoints and the tensor port are free (a one-line error otherwise); --listen and the older
    --host / --port are one or the other."""
    from ..runtime.net.addresses import AddressError, default_tensor_port, listen_endpoints
    from ..runtime.ops.startup import check_port_free

    if args.listen and (args.host != "127.0.0.1" or args.port != 0):
        raise CliError("give --listen, or the older --host / --port, not both (--host H --port P is --listen H:P)")
    eps = listen_endpoints(args.listen, args.host, args.port)
    try:
        tport = default_tensor_port(eps[0].port) if args.tensor_port is None else args.tensor_port
    except AddressError as e:
        raise CliError(str(e)) from None
    for ep in eps:
        fix = "choose another --listen port" if args.listen else "choose another --port"
        check_port_free(ep.host, ep.port, fix=fix)
        check_port_free(ep.host, tport, "tensor channel port", "choose another --tensor-port")


def _check_own_admission(args: argparse.Namespace, man) -> None:
    """A node of an owned run holds the owner's certificate for its peer id and role (or the run takes any
    relay): say so at once, with the command that admits it, rather than be refused by every peer."""
    import time
    from pathlib import Path

    from ..model.certificates import CERTIFICATE_FILE, AdmissionError, check_certificate
    from ..runtime.net.identity import IdentityError, load_or_create_identity, peer_id_of

    if args.revocations:
        from ..model.certificates import check_revocations

        try:
            check_revocations(Path(args.revocations).read_bytes(), owner_public_key=man.owner_public_key,
                              run_id=man.run_id)
        except OSError as e:
            raise CliError(f"--revocations {args.revocations}: {e.strerror}") from None
        except AdmissionError as e:
            raise CliError(f"--revocations {args.revocations}: {e}") from None
    if not man.owner_public_key:
        return
    path = Path(args.certificate) if args.certificate else Path(args.state_dir) / CERTIFICATE_FILE
    try:
        pid = peer_id_of(load_or_create_identity(Path(args.state_dir)))
    except IdentityError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot create the identity key in {args.state_dir}: {e.strerror}") from None
    admit = f"gwtf-node admit --run {args.run} --peer-id {pid} --role {args.role} --out {path}"
    if not path.exists():
        if args.role == "relay" and man.open_relays and not args.certificate:
            return
        raise CliError(f"no certificate at {path}: run {man.run_id} admits {args.role} nodes by the owner's "
                       f"certificate; the owner runs: {admit}")
    try:
        check_certificate(path.read_bytes(), owner_public_key=man.owner_public_key, run_id=man.run_id,
                          peer_id=pid, role=args.role, now=time.time())
    except AdmissionError as e:
        raise CliError(f"{path}: {e}; the owner runs: {admit}") from None
    except OSError as e:
        raise CliError(f"cannot read the certificate {path}: {e.strerror}") from None


def _run_join(args: argparse.Namespace, stage: int | None, lock: StateDirLock) -> int:
    """`join` once its input is checked and its state directory locked: run the node, say why it stopped."""
    from pathlib import Path

    import trio
    from ..runtime.node.node import NodeOptions, run_node
    from ..runtime.ops.startup import ExitKind, StartupError, first_startup_error

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
    if device.startswith("cuda"):
        import torch

        from ..model.precision import fix_cublas_workspace
        fix_cublas_workspace(torch.device(device))
    if args.torch_threads:
        import torch
        torch.set_num_threads(args.torch_threads)
    capacity, man, counts = _capacity_that_fits(args, stage, device)
    try:  # the state and checkpoint directories take what the node will write (a part that fits its device)
        from ..runtime.ops.statedir import check_writable

        check_writable(Path(args.state_dir), _checkpoint_bytes(man, counts, args.role, stage))
    except StartupError as e:
        raise CliError(str(e)) from None
    try:
        logs = _setup_logging(args.log_level, Path(args.state_dir), max_mb=args.log_max_mb, backups=args.log_backups)
    except OSError as e:
        raise CliError(f"--state-dir {args.state_dir}: cannot write its log file ({e.strerror})") from None
    opts = NodeOptions(device=device, run_path=Path(args.run), role=args.role, stage=stage, state_dir=Path(args.state_dir),
                       bootstrap=list(args.bootstrap), name=args.name or "", port=args.port,
                       listen_host=args.host, listen=list(args.listen), announce=list(args.announce),
                       tensor_port=args.tensor_port, relay_service=args.relay_service,
                       capacity=capacity, iterations=args.iterations,
                       data_index=args.data_index, data_nodes=args.data_nodes,
                       links=Path(args.links) if args.links else None, policy=args.policy,
                       bootstrap_timeout_s=args.bootstrap_timeout, flow_neighbours=args.flow_neighbours,
                       pooled_formation=args.pooled_formation, scaled_formation=_scaled_formation(args),
                       restore=Path(args.restore) if args.restore else None, keep_checkpoints=args.keep_checkpoints,
                       checkpoint_every=args.checkpoint_every, metrics_port=args.metrics_port,
                       metrics_host=args.metrics_host, insecure_unsigned=args.insecure_unsigned,
                       certificate=Path(args.certificate) if args.certificate else None,
                       revocations=Path(args.revocations) if args.revocations else None, lease_s=args.lease)
    ctrlc.hand_over()  # a Ctrl-C that came while the node was set up stops it here; trio's handling from now on
    try:  # (at the main task's next checkpoint: never inside a callback where the interrupt would be lost)
        stopped = trio.run(run_node, opts, lock, restrict_keyboard_interrupt_to_checkpoints=True)
    except BaseException as e:  # trio wraps what a nursery's body raises in exception groups: look inside
        failure = first_startup_error(e) or _first_manifest_error(e)
        if failure is None:
            raise
        raise CliError(str(failure)) from None
    finally:
        logs.close()  # the counts of repeated lines still held
    if stopped is None:
        return 0
    if stopped.kind is ExitKind.NO_BOOTSTRAP:
        print(f"error: {stopped.reason}", file=sys.stderr)
        return EXIT_NO_PEER
    raise CliError(stopped.reason)


def _capacity_that_fits(args: argparse.Namespace, stage: int | None, device: str) -> tuple[int, Any, Any]:
    """The node's part fits its device (model/memory.py), else a one-line error giving the need and what is free;
    returns the capacity, with the manifest and its parameter counts (hfconfig.ParamCounts) read for it.

    `--stage K` and data nodes: the part at `--capacity`, or the most microbatches that fit when it is 0, at most
    the run's demand (a relay: microbatches per iteration x `--data-nodes`, as the joiner counts it; a data
    node: its own).  `--stage auto`: some stage must fit one microbatch; which ones do, and the capacity, are the
    joiner's to tell the leader (runtime/node/joining.py).
    """
    from ..model import memory
    from ..model.hfconfig import parameter_counts
    from ..model.manifest import load_manifest

    try:
        man = load_manifest(args.run, check_files=False)
        counts = parameter_counts(man.model.family, man.model.config)
    except _manifest_error_types() as e:
        raise CliError(str(e)) from None
    free = memory.free_bytes(device)
    cap = args.capacity or (memory.relay_demand(man, args.data_nodes) if args.role == "relay"
                            else man.data.microbatches_per_iteration)
    if args.role == "relay" and stage is None:
        if not memory.stage_capacities(man, free, 1, counts, device):
            smallest = min(range(man.num_stages),
                           key=lambda k: memory.estimate(man, "relay", k, 1, counts, device).total)
            raise CliError(memory.fit_error(man, "relay", smallest, 1, device, free, counts,
                                            fix="no stage of the run fits: use a larger device"))
        return args.capacity, man, counts
    if not args.capacity:
        cap = memory.capacity_that_fits(man, args.role, stage, free, cap, counts, device) or 1
    error = memory.fit_error(man, args.role, stage, cap, device, free, counts)
    if error:
        raise CliError(error)
    return (cap if args.role == "relay" else args.capacity), man, counts


def cmd_local(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from ..model.manifest import default_manifest, load_manifest, save_manifest

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
    from ..runtime.local.swarm import LocalError, LocalSwarm

    try:  # the launcher owns the run: it signs it and admits its nodes (a signed --run needs its owner key)
        swarm = LocalSwarm(workdir, run_path, args.data_nodes, len(man.stages), args.relays_per_stage,
                           args.iterations, links=Path(args.links) if args.links else None,
                           auto_stage=args.auto_stage, joiners=args.joiners, join_every_s=args.join_every,
                           policy=args.policy, churn=args.churn, seed=args.seed, relay_capacity=args.relay_capacity,
                           owner_key=_local_owner_key(args.run), torch_threads=args.torch_threads,
                           relay_nice=args.relay_nice)
    except LocalError as e:
        raise CliError(str(e)) from None
    if args.links:
        from ..runtime.net.linkspec import LinksError, resolve_links
        try:  # the same check the swarm makes when it starts, before any process is spawned
            resolve_links(Path(args.links), swarm.names())
        except LinksError as e:
            raise CliError(str(e)) from None
    from .local import run_swarm

    return run_swarm(swarm, man, args)


def _local_owner_key(run: str | None):
    """`local --run FILE` of a signed run: the owner key beside FILE admits the swarm's nodes."""
    from pathlib import Path

    if run is None:
        return None
    return Path(run).resolve().parent / "owner.key"


def _local_centralized(man, args) -> int:
    import time

    from ..model.reference import train_centralized

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


def cmd_leave(args: argparse.Namespace) -> int:
    """Ask the node of a state directory to leave gracefully and wait until it is gone: over its control socket
    (runtime/ops/control.py), or with SIGTERM to the pid of its status.json when it has none."""
    import os
    import signal
    import time
    from pathlib import Path

    from ..runtime.ops.control import ControlError, NoDaemon, ask

    try:
        reply = ask(Path(args.state_dir), "leave")
        pid, name = int(reply["pid"]), Path(args.state_dir).name
        graceful, role = bool(reply["graceful"]), reply.get("role")
    except NoDaemon:
        status = Path(args.state_dir) / "status.json"
        try:
            st = json.loads(status.read_text())
            pid = int(st["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            raise CliError(f"{args.state_dir}: no running node here (start one with gwtf-node join --state-dir "
                           "...)") from None
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            raise CliError(f"the node of {args.state_dir} (pid {pid}) is not running") from None
        except PermissionError:
            raise CliError(f"not allowed to signal pid {pid}: run as the user that started the node") from None
        name = st.get("name") or st.get("peer_id", "")[-6:]
        role = st.get("role")  # (SIGTERM does what the leave op does: a placed relay leaves gracefully)
        graceful = role == "relay" and st.get("stage") is not None
    except ControlError as e:
        raise CliError(str(e)) from None
    print(f"{name}: {_leave_words(graceful, role)}")
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


def _leave_words(graceful: bool, role: str | None) -> str:
    """What `leave` does to a node, in the one line it prints first."""
    if graceful:
        return "leaving (finishing its microbatches and aggregation)"
    if role == "data":
        return "stopping (a data node stops now and says Goodbye to its peers; only a relay placed in a stage " \
               "finishes its microbatches first)"
    return "stopping (a relay not placed in a stage yet has no microbatches to finish)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gwtf-node", description="Decentralized LLM training with GWTF flow routing.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_sim_parsers(sub)
    add_owner_parsers(sub)

    add_init_run_parsers(sub)

    j = _add_join_parser(sub)
    add_config_parser(sub, j)
    _add_local_parser(sub)
    _add_leave_parser(sub)
    add_status_parser(sub)

    add_service_parser(sub, j)  # install-service: `join` as a systemd service (service.py)
    return p


def _add_join_parser(sub: Any) -> argparse.ArgumentParser:
    """`join`: the daemon's flags, each also a config key and a GWTF_* variable (config.py); its parser."""
    j = sub.add_parser("join", help="start a long-lived node of a run")
    j.add_argument("--run", required=True, help="run manifest (gwtf-node init-run)")
    j.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="address of a node of the run, ending in /p2p/<peer id> (repeatable; none: first node)")
    j.add_argument("--role", choices=("data", "relay"), required=True)
    j.add_argument("--stage", default=None, help="relays: 'auto' (the default: the leader places it) or a stage number")
    j.add_argument("--state-dir", default="gwtf-state", help="identity key, config.toml, checkpoints, node.log, metrics")
    j.add_argument("--name", default="", help="a readable node name (also its name in --links)")
    j.add_argument("--host", type=_ip_address, default="127.0.0.1",
                   help="address to listen on (the older form of --listen HOST:PORT)")
    j.add_argument("--port", type=_port, default=0, help="TCP port to listen on (0: any free port)")
    j.add_argument("--bootstrap-timeout", type=_seconds, default=300.0, metavar="SECONDS",
                   help="stop (exit 3) if no bootstrap peer accepted this node by then; retries until then (0: forever)")
    j.add_argument("--capacity", type=_nonneg_int, default=0,
                   help="microbatches a relay has in flight at once (0: as many as fit the device's free memory, at "
                        "most the run's demand: microbatches per iteration x --data-nodes); with those whose "
                        "gradients it holds to the step, never more than fit the device; a node whose part does not "
                        "fit exits at start")
    j.add_argument("--iterations", type=_nonneg_int, default=0, help="data nodes: stop after N (0: forever)")
    j.add_argument("--data-index", type=_nonneg_int, default=0, help="data nodes: which shard of the data")
    j.add_argument("--data-nodes", type=_positive_int, default=1, help="data nodes of the run")
    j.add_argument("--links", default=None, help="emulated links between named nodes (resolved links file)")
    j.add_argument("--flow-neighbours", type=_nonneg_int, default=None, metavar="K",
                   help="relays: link the flows to the K cheapest relays of each adjacent stage and to those that chose "
                        "this one (0: every one; default auto: 10 with one data node and >= 10 relays a stage, else 0)")
    j.add_argument("--pooled-formation", action="store_true", help="several data nodes: form the flows as one "
                   "commodity, then send each unit home (docs/bench_flow.md, \"Pooled formation\"); set on every node")
    j.add_argument("--scaled-formation", action="store_true", help="one data node: form the flows by cost scaling "
                   "first (default auto: with >= 10 relays a stage; docs/bench_flow.md, \"Auto\"); set on every node")
    j.add_argument("--waves-formation", action="store_true", help="form the flows by label waves alone; set on every node")
    j.add_argument("--device", default="auto", help="torch device for the stage: auto (cuda if present), cpu, cuda, cuda:N")
    j.add_argument("--torch-threads", type=_nonneg_int, default=0, metavar="N",
                   help="CPU threads of torch's operators (0: torch's default, one per core; several nodes on one "
                        "machine each take their share, as `gwtf-node local` does)")
    j.add_argument("--policy", choices=("gwtf", "swarm", "random"), default="gwtf",
                   help="microbatch routing and crash recovery: GWTF's, SWARM's (the baseline), or SWARM's with "
                        "random next hops (blind routing)")
    j.add_argument("--restore", default=None, metavar="FILE",
                   help="relays: resume from this checkpoint file, as from the newest of the state directory")
    j.add_argument("--keep-checkpoints", type=_positive_int, default=3, metavar="N",
                   help="checkpoints kept in the state directory (the newest N)")
    j.add_argument("--checkpoint-every", type=_positive_int, default=1, metavar="N",
                   help="write a checkpoint after every N-th step (a large part's checkpoint takes seconds to tens "
                        "of seconds of each aggregation; a restart resumes from the newest one)")
    j.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    j.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: any free port; default: none)")
    j.add_argument("--metrics-host", type=_ip_address, default="127.0.0.1",
                   help="address the metrics are served on (default 127.0.0.1: this machine only)")
    j.add_argument("--log-max-mb", type=_positive_int, default=10, metavar="MB",
                   help="size of STATE_DIR/node.log before it is rotated to node.log.1")
    j.add_argument("--log-backups", type=_positive_int, default=5, metavar="N", help="rotated log files kept")
    j.add_argument("--certificate", default=None, metavar="FILE",
                   help="the run owner's admission of this node (default: certificate.json in the state directory)")
    j.add_argument("--revocations", default=None, metavar="FILE",
                   help="the run owner's signed revocation list (nodes also read it from the DHT)")
    j.add_argument("--lease", type=_lease_seconds, default=2.0, metavar="S",
                   help="shortest leader lease in seconds (default 2; the lease grows to 8 round trips to the "
                        "voters when they are slower; heartbeats every lease/4)")
    j.add_argument("--insecure-unsigned", action="store_true",
                   help="join a run whose manifest has no owner signature (open for testing: anyone may join it "
                        "in any role)")
    j.add_argument("--listen", action="append", type=_listen_addr, default=[], metavar="ADDR",
                   help="libp2p endpoint to listen on, HOST:PORT, [IPv6]:PORT or /ip4|ip6/HOST/tcp/PORT (repeatable; "
                        "default --host:--port, 127.0.0.1 and any port: this machine only); 0.0.0.0:4001 for "
                        "a node on the internet")
    j.add_argument("--announce", action="append", type=_announce_addr, default=[], metavar="ADDR",
                   help="address peers are told to dial, HOST:PORT or a multiaddr (repeatable; default: the listen "
                        "addresses, 0.0.0.0 replaced by this machine's addresses): a public IP, or a router's with a "
                        "forwarded port")
    j.add_argument("--tensor-port", type=_port, default=None, metavar="PORT",
                   help="TCP port of the tensor channel, on the listen hosts (default: the libp2p port + 1; any "
                        "free port when that is 0); peers behind NAT get tensors over libp2p instead")
    j.add_argument("--relay-service", action="store_true",
                   help="a public node: relay connections between nodes behind different NAT routers (circuit "
                        "relay v2; nodes with only private addresses reserve a slot on the peers they dial)")
    j.set_defaults(func=configurable(j, cmd_join))  # last: every flag above is also a config key and GWTF_* variable
    return j


def _add_local_parser(sub: Any) -> None:
    """`local`: a whole swarm on loopback (runtime/local/swarm.py), or its centralized reference."""
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
    lo.add_argument("--policy", choices=("gwtf", "swarm", "random"), default="gwtf",
                    help="microbatch routing and crash recovery of every node: GWTF's, SWARM's (the baseline), or "
                         "SWARM's with random next hops")
    lo.add_argument("--churn", type=_probability, default=0.0, metavar="P",
                    help="each iteration, SIGKILL each relay with probability P at a random point; it comes back "
                         "as a new joiner")
    lo.add_argument("--torch-threads", type=_nonneg_int, default=None, metavar="N",
                    help="torch's CPU threads per node (default: the cores shared among the nodes, at least 1; "
                         "0: torch's default in every node)")
    lo.add_argument("--relay-nice", type=_relay_nice, default=0, metavar="N",
                    help="the relays' niceness (0-19; default 0): with more nodes than cores, N > 0 gives the data "
                         "nodes, who work with every node, a larger share of the CPU, as machines of their own would")
    lo.add_argument("--workdir", default=None,
                    help="where the nodes' state directories go (default: a new directory gwtf-local-* in the temp "
                         "directory); the run's iterations.jsonl and loss.png stay there")
    lo.add_argument("--keep", action="store_true",
                    help="keep the nodes' state directories (logs, checkpoints, status) in the workdir; by default "
                         "they are removed once the swarm has stopped (kept anyway after an error)")
    lo.add_argument("--centralized", action="store_true", help="train the same model in one process: the reference")
    lo.add_argument("--json", action="store_true", help="one JSON object per iteration on stdout")
    lo.set_defaults(func=cmd_local)


def _add_leave_parser(sub: Any) -> None:
    """`leave`: make a running node leave, by its state directory."""
    lv = sub.add_parser("leave", help="make a running node leave gracefully (no work is wasted)")
    lv.add_argument("--state-dir", default="gwtf-state", help="the node's state directory")
    lv.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to be gone")
    lv.set_defaults(func=cmd_leave)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: exit 0, or one line on stderr and a non-zero status (2: fix the command), never a
    traceback.  A Ctrl-C at any moment is `interrupted` (130); a reader that went away (`| head`) ends the
    output without a word."""
    try:
        parser = build_parser()  # (imports for seconds: a Ctrl-C may come now)
        args = parser.parse_args(argv)
        return args.func(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Python would print a traceback when it flushes stdout at exit: point stdout at /dev/null first
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a program killed by SIGPIPE
    except OSError as e:  # a file or directory a command could not use, where no check of ours said so first
        where = f" {e.filename}" if e.filename else ""
        print(f"error: cannot use{where}: {e.strerror or e}", file=sys.stderr)
        return 1

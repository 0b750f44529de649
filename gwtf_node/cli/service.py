"""`gwtf-node install-service`: the node as a systemd service, with the flags of `join`.

The unit is written from the same `join` flags a volunteer would type, checked
by the `join` parser first, so a unit that cannot start is refused here and not
in the journal.  What the unit says, and why:

- `Type=notify`: systemd counts the node started when it says READY=1, that
  is when it has joined the run (runtime/node/sdnotify.py); `WatchdogSec=` restarts
  a node whose event loop stopped answering; STATUS= lines show in
  `systemctl status`.
- `Restart=on-failure`, but not for exit status 2 (a bad flag or manifest, or
  a peer that refused this node: restarting repeats the same mistake); exit
  status 3 (no bootstrap peer answered) is retried after `RestartSec=`.
- SIGTERM makes the node leave gracefully (its microbatches handed back, no
  work wasted), which can take a while: `TimeoutStopSec=` leaves it time; a
  second SIGTERM or SIGKILL after that stops it at once.
- `DynamicUser=yes` (a user allocated by systemd, no account to create) and
  `StateDirectory=gwtf-node`: identity key, checkpoints, logs and status live
  in /var/lib/gwtf-node, the only writable place under `ProtectSystem=strict`.
- Hardening: `NoNewPrivileges`, `ProtectSystem=strict`, `ProtectHome`,
  `PrivateTmp`, kernel and control-group protection, address families limited
  to what libp2p uses.  Not `PrivateDevices` and not `MemoryDenyWriteExecute`:
  the first hides the GPU, the second breaks CUDA's JIT and some BLAS kernels.
- GPU: with `--device` cpu the unit allows no device (`DevicePolicy=closed`);
  otherwise it also allows NVIDIA's character devices (/dev/nvidia0..N and
  /dev/nvidiactl are major `nvidia-frontend`, /dev/nvidia-uvm* `nvidia-uvm`,
  MIG's /dev/nvidia-caps/* `nvidia-caps`), which the driver creates world
  readable, so the dynamic user needs no group.  AMD GPUs need /dev/kfd and
  /dev/dri instead (add `DeviceAllow=/dev/kfd rw` and `DeviceAllow=char-drm rw`).
- What the sandbox hides and the node reads (a venv under a home directory, a
  manifest under /tmp, the files it names) is bound read-only at the same path
  (`sandbox.py`); what the dynamic user may not read is refused at install with
  the `chmod` that fixes it.
- Admission: a node of a signed run needs the owner's certificate for its peer
  id, and the service's peer id is that of the identity key in its own state
  directory.  So the installer creates that key (as `join` would on first
  start: /var/lib/gwtf-node/identity.key; systemd hands the directory to the
  dynamic user when the unit starts), checks a `--certificate` against it and
  stores it there as certificate.json, or, without one, refuses with the peer
  id and the owner's `admit` command.  A unit that would exit 2 at its first
  start (and never be restarted) is not written.
- It prints the `systemctl` commands for where the unit was written: a unit
  outside systemd's directories is linked first (`systemctl link`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from .common import CliError, _Parser
from .sandbox import binds, hidden_by, needed_paths, unreadable

UNIT_PATH = Path("/etc/systemd/system/gwtf-node.service")
STATE_DIR = "/var/lib/gwtf-node"  # StateDirectory=gwtf-node
SYSTEM_UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
WATCHDOG_S = 120  # the event loop pings every half of it; torch runs in worker threads, so the loop stays free
START_TIMEOUT_S = 900  # loading the model and reaching a bootstrap peer (--bootstrap-timeout is 300 s by default)
STOP_TIMEOUT_S = 180  # a graceful leave hands back the node's microbatches first
RESTART_S = 30
EXIT_USAGE = 2  # cli/common.py: a mistake a restart would repeat


def node_executable() -> list[str]:
    """The command that starts this very installation: the `gwtf-node` script beside the interpreter, or
    `python -m gwtf_node`; absolute paths either way (systemd needs them)."""
    script = Path(sys.executable).parent / "gwtf-node"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("gwtf-node")
    if found:
        return [str(Path(found).resolve())]
    return [str(Path(sys.executable).absolute()), "-m", "gwtf_node"]


def _quote(arg: str) -> str:
    """One ExecStart= word: systemd's quoting is close to the shell's, and `%` and `$` are its specifiers."""
    return shlex.quote(arg.replace("%", "%%").replace("$", "$$"))


def join_args(join_argv: list[str], run_path: str) -> list[str]:
    """The `join` arguments of the unit: the user's, the manifest path replaced, the state directory the
    service's own (a certificate given is stored there, so `--certificate` is left out)."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(join_argv):
        if skip:
            skip = False
            continue
        if a in ("--run", "--state-dir", "--certificate"):
            skip = True
            continue
        if a.startswith(("--run=", "--state-dir=", "--certificate=")):
            continue
        out.append(a)
    return ["join", "--run", run_path, "--state-dir", STATE_DIR, *out]


def render_unit(exec_argv: list[str], *, gpu: bool, bound: list[Path] = (), description: str = "gwtf-node: a "
                "volunteer node of a decentralized training run", name: str = "gwtf-node") -> str:
    """The text of the unit file for the command `exec_argv` (absolute executable first); `bound`: the paths
    hidden by the sandbox that the node reads (sandbox.py), bound read-only; `name`: the unit's name (its file
    name without .service), which its comment tells journalctl and systemctl."""
    exec_start = " ".join(_quote(a) for a in exec_argv)
    home = any(hidden_by(p) == "ProtectHome" for p in bound)
    sandbox = ["ProtectHome=tmpfs" if home else "ProtectHome=yes", "PrivateTmp=yes"]
    if bound:
        sandbox.append("# hidden by ProtectHome/PrivateTmp and read by the node: bound read-only at the same path")
        sandbox += [f"BindReadOnlyPaths={_quote(str(p))}" for p in bound]
    devices = ["DevicePolicy=closed"]
    if gpu:
        devices += [
            "# NVIDIA GPUs: /dev/nvidia0..N and /dev/nvidiactl (major nvidia-frontend), /dev/nvidia-uvm*,",
            "# MIG capabilities.  AMD: DeviceAllow=/dev/kfd rw and DeviceAllow=char-drm rw instead.",
            "DeviceAllow=char-nvidia-frontend rw",
            "DeviceAllow=char-nvidia-uvm rw",
            "DeviceAllow=char-nvidia-caps rw",
        ]
    else:
        devices += ["# --device cpu: no device at all.  For a GPU, install with --device auto (or cuda)."]
    return "\n".join([
        "# Written by `gwtf-node install-service`; rewrite it the same way rather than by hand.",
        f"# Logs: journalctl -u {name}; state: {STATE_DIR}; leave the run: systemctl stop {name}",
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={exec_start}",
        f"WatchdogSec={WATCHDOG_S}",
        f"TimeoutStartSec={START_TIMEOUT_S}",
        "# SIGTERM: the node leaves the run gracefully; it is killed if that takes longer than this.",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        "Restart=on-failure",
        f"RestartSec={RESTART_S}",
        f"# exit status {EXIT_USAGE}: a bad flag or manifest, or refused by the run: a restart would repeat it",
        f"RestartPreventExitStatus={EXIT_USAGE}",
        "",
        "DynamicUser=yes",
        "StateDirectory=gwtf-node",
        "StateDirectoryMode=0700",
        f"WorkingDirectory={STATE_DIR}",
        f"Environment=HOME={STATE_DIR} PYTHONUNBUFFERED=1",
        "",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        *sandbox,
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "UMask=0077",
        *devices,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def _admission(joined: argparse.Namespace, man, state_dir: Path, *, create: bool) -> Path | None:
    """The certificate to store in the service's state directory (None: none needed, or already there and
    valid), checked against the service's own peer id; CliError with the owner's `admit` command otherwise."""
    import time

    from ..model.certificates import CERTIFICATE_FILE, AdmissionError, check_certificate
    from ..runtime.net.identity import IdentityError, key_path, load_or_create_identity, peer_id_of

    role = joined.role
    given = getattr(joined, "certificate", None)
    if not man.owner_public_key or (role == "relay" and man.open_relays and not given):
        return None
    stored = state_dir / CERTIFICATE_FILE
    if not create and not key_path(state_dir).exists():
        raise CliError(f"the service's node has no identity key yet ({key_path(state_dir)}), so its certificate "
                       f"cannot be checked: install without --print (as root) to create it")
    try:
        pid = peer_id_of(load_or_create_identity(state_dir))
    except IdentityError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot create the service's identity key in {state_dir}: {e.strerror} (run as root)") from None
    admit = (f"gwtf-node admit --run {joined.run} --peer-id {pid} --role {role} --out certificate.json; then "
             f"install again with --certificate certificate.json")
    path = Path(given) if given else stored
    if not path.is_file():
        raise CliError(f"run {man.run_id} admits {role} nodes by the owner's certificate, and the service's node "
                       f"(peer id {pid}, key in {state_dir}) has none: the owner runs: {admit}")
    try:
        check_certificate(path.read_bytes(), owner_public_key=man.owner_public_key, run_id=man.run_id,
                          peer_id=pid, role=role, now=time.time())
    except AdmissionError as e:
        raise CliError(f"{path}: {e} (the service's peer id is {pid}); the owner runs: {admit}") from None
    except OSError as e:
        raise CliError(f"cannot read the certificate {path}: {e.strerror}") from None
    return path if given else None


def systemctl_hint(out: Path) -> str:
    """The commands that start the unit written at `out`, and follow it."""
    name = out.name
    enable = f"systemctl daemon-reload && systemctl enable --now {name}"
    if str(out.parent) not in SYSTEM_UNIT_DIRS:
        enable = f"systemctl link {out} && {enable}"
    return (f"start it now and at every boot:  {enable}\n"
            f"follow it:                       journalctl -fu {out.stem}   (systemctl status {out.stem})")


def cmd_install_service(args: argparse.Namespace) -> int:
    """Check the `join` flags (`args.join_argv`) with the `join` parser, then write (or print) the unit."""
    from ..model.manifest import load_manifest

    join_argv = list(args.join_argv)
    if not join_argv:
        raise CliError("install-service needs the flags of `gwtf-node join` (at least --run and --role), e.g. "
                       "gwtf-node install-service --run run.json --role relay --bootstrap /ip4/.../p2p/...")
    joined = args.join_parser.parse_args(join_argv)  # a bad flag: CliError naming it
    # join's flags have no argparse defaults (config.py resolves them): a flag not given is absent
    if getattr(joined, "run", None) is None:
        raise CliError("install-service needs --run: the service reads the manifest from there")
    if getattr(joined, "role", None) is None:
        raise CliError("install-service needs --role (data or relay)")
    run = Path(joined.run).absolute()
    if not run.is_file():
        raise CliError(f"--run {joined.run}: no such file (the service reads the manifest from there)")
    try:
        man = load_manifest(run, check_files=False)
    except Exception as e:  # ManifestError, a bad signature: say what is wrong with the file
        raise CliError(f"--run {joined.run}: {e}") from None
    default_exec = not args.exec
    exec_argv = shlex.split(args.exec) if args.exec else node_executable()
    if not Path(exec_argv[0]).is_absolute():
        raise CliError(f"--exec {exec_argv[0]!r} must be an absolute path (systemd runs no shell)")
    state_dir = Path(args.service_state_dir)
    cert = _admission(joined, man, state_dir, create=not args.print)
    flag_files = [getattr(joined, f, None) for f in ("links", "restore", "revocations")]
    paths = needed_paths(exec_argv, default_exec, man, run, joined.role, flag_files)
    bound = binds(paths)
    for p in paths:
        why = unreadable(p, bound)
        if why:
            raise CliError(f"the service (a dynamic user) cannot read what the node needs: {why}")
    out = Path(args.unit_path).absolute()  # (`systemctl link` takes an absolute path only)
    if out.suffix != ".service" or out.stem in ("", "."):
        raise CliError(f"--unit-path {args.unit_path}: a unit file's name ends in .service (e.g. gwtf-node.service)")
    unit = render_unit([*exec_argv, *join_args(join_argv, str(run))], gpu=getattr(joined, "device", "auto") != "cpu",
                       bound=bound, name=out.stem)
    if args.print:
        sys.stdout.write(unit)
        return 0
    if os.geteuid() != 0 and not os.access(out.parent, os.W_OK):
        raise CliError(f"writing {out} needs root: run it with sudo, or print the unit with --print "
                       f"(or write it elsewhere with --unit-path)")
    try:
        if cert is not None:
            from ..model.certificates import CERTIFICATE_FILE

            shutil.copyfile(cert, state_dir / CERTIFICATE_FILE)
            os.chmod(state_dir / CERTIFICATE_FILE, 0o600)
        out.write_text(unit)
    except OSError as e:
        raise CliError(f"cannot write {e.filename or out}: {e.strerror}") from None
    if cert is not None:
        print(f"stored the certificate {cert} in {state_dir} (the service's state directory)")
    for p in bound:
        print(f"bound read-only for the service ({hidden_by(p)} hides it): {p}")
    print(f"wrote {out}\n{systemctl_hint(out)}")
    return 0


class JoinFlagsParser(_Parser):
    """The `install-service` parser: its own flags, and every other argument kept, in order, as `join_argv`
    (checked afterwards by the `join` parser itself)."""

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        ns.join_argv = rest
        return ns, []


def add_parser(sub, join_parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add `install-service` to the subcommands `sub`; `join_parser` (that of `join`) checks the join flags."""
    sv = sub.add_parser("install-service", help="write a systemd unit running `join` with the given flags",
                        description="Write /etc/systemd/system/gwtf-node.service running `gwtf-node join` with "
                                    "the join flags given here (all of them: --run, --role, --bootstrap, ...). "
                                    "The state directory is the service's own, /var/lib/gwtf-node.")
    sv.__class__ = JoinFlagsParser  # subparsers all share one class; this one passes the join flags through
    sv.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    sv.add_argument("--unit-path", default=str(UNIT_PATH), help="where to write the unit (default %(default)s)")
    sv.add_argument("--service-state-dir", default=STATE_DIR, help=argparse.SUPPRESS)  # tests: not /var/lib
    sv.add_argument("--exec", default=None, metavar="COMMAND",
                    help="the command starting gwtf-node, absolute (default: this installation's)")
    sv.set_defaults(func=cmd_install_service, join_parser=join_parser)
    return sv


__all__ = ["add_parser", "cmd_install_service", "join_args", "node_executable", "render_unit"]

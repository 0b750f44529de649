"""`gwtf-node install-service`: the node as a systemd service, with the flags of `join`.

The unit is written from the same `join` flags a volunteer would type, checked
by the `join` parser first, so a unit that cannot start is refused here and not
in the journal.  What the unit says, and why:

- `Type=notify`: systemd counts the node started when it says READY=1, that
  is when it has joined the run (runtime/sdnotify.py); `WatchdogSec=` restarts
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
- The run manifest must be readable by the service: a manifest under a home
  directory (hidden by `ProtectHome`) is copied to /etc/gwtf-node/ on install.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from .common import CliError, _Parser

UNIT_PATH = Path("/etc/systemd/system/gwtf-node.service")
STATE_DIR = "/var/lib/gwtf-node"  # StateDirectory=gwtf-node
CONFIG_DIR = Path("/etc/gwtf-node")  # where a manifest hidden by ProtectHome is copied
WATCHDOG_S = 120  # the event loop pings every half of it; torch runs in worker threads, so the loop stays free
START_TIMEOUT_S = 900  # loading the model and reaching a bootstrap peer (--bootstrap-timeout is 300 s by default)
STOP_TIMEOUT_S = 180  # a graceful leave hands back the node's microbatches first
RESTART_S = 30
EXIT_USAGE = 2  # cli/common.py: a mistake a restart would repeat
HIDDEN_PREFIXES = ("/home/", "/root/", "/run/user/")  # ProtectHome=yes hides these


def node_executable() -> list[str]:
    """The command that starts this very installation: the `gwtf-node` script beside the interpreter, or
    `python -m gwtf_node.cli`; absolute paths either way (systemd needs them)."""
    script = Path(sys.executable).parent / "gwtf-node"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("gwtf-node")
    if found:
        return [str(Path(found).resolve())]
    return [str(Path(sys.executable).absolute()), "-m", "gwtf_node.cli"]


def _quote(arg: str) -> str:
    """One ExecStart= word: systemd's quoting is close to the shell's, and `%` and `$` are its specifiers."""
    return shlex.quote(arg.replace("%", "%%").replace("$", "$$"))


def join_args(join_argv: list[str], run_path: str) -> list[str]:
    """The `join` arguments of the unit: the user's, the manifest path replaced, the state directory the
    service's own, and a listening port fixed (others dial it: 4001 unless given)."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(join_argv):
        if skip:
            skip = False
            continue
        if a in ("--run", "--state-dir"):
            skip = True
            continue
        if a.startswith(("--run=", "--state-dir=")):
            continue
        out.append(a)
    return ["join", "--run", run_path, "--state-dir", STATE_DIR, *out]


def render_unit(exec_argv: list[str], *, gpu: bool, description: str = "gwtf-node: a volunteer node of a "
                "decentralized training run") -> str:
    """The text of the unit file for the command `exec_argv` (absolute executable first)."""
    exec_start = " ".join(_quote(a) for a in exec_argv)
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
        "# Logs: journalctl -u gwtf-node; state: " + STATE_DIR + "; leave the run: systemctl stop gwtf-node",
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
        "ProtectHome=yes",
        "PrivateTmp=yes",
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


def cmd_install_service(args: argparse.Namespace) -> int:
    """Check the `join` flags (`args.join_argv`) with the `join` parser, then write (or print) the unit."""
    join_argv = list(args.join_argv)
    if not join_argv:
        raise CliError("install-service needs the flags of `gwtf-node join` (at least --run and --role), e.g. "
                       "gwtf-node install-service --run run.json --role relay --bootstrap /ip4/.../p2p/...")
    joined = args.join_parser.parse_args(join_argv)  # a bad flag: CliError naming it
    # join's flags have no argparse defaults (config.py resolves them): a flag not given is absent
    if getattr(joined, "run", None) is None:
        raise CliError("install-service needs --run: the service reads the manifest from there")
    run = Path(joined.run).absolute()
    if not run.is_file():
        raise CliError(f"--run {joined.run}: no such file (the service reads the manifest from there)")
    exec_argv = shlex.split(args.exec) if args.exec else node_executable()
    if not Path(exec_argv[0]).is_absolute():
        raise CliError(f"--exec {exec_argv[0]!r} must be an absolute path (systemd runs no shell)")
    run_path = str(run)
    copy_run = run_path.startswith(HIDDEN_PREFIXES)
    if copy_run:
        run_path = str(CONFIG_DIR / "run.json")
    unit = render_unit([*exec_argv, *join_args(join_argv, run_path)], gpu=getattr(joined, "device", "auto") != "cpu")
    if args.print:
        sys.stdout.write(unit)
        if copy_run:
            print(f"note: {run} is under a home directory, which the service cannot read (ProtectHome=yes); "
                  f"copy it to {run_path} (install-service without --print does)", file=sys.stderr)
        return 0
    out = Path(args.unit_path)
    if os.geteuid() != 0 and not os.access(out.parent, os.W_OK):
        raise CliError(f"writing {out} needs root: run it with sudo, or print the unit with --print "
                       f"(or write it elsewhere with --unit-path)")
    try:
        if copy_run:
            CONFIG_DIR.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run, run_path)
            os.chmod(run_path, 0o644)
        out.write_text(unit)
    except OSError as e:
        raise CliError(f"cannot write {e.filename or out}: {e.strerror}") from None
    if copy_run:
        print(f"copied {run} to {run_path} (the service cannot read home directories)")
    print(f"wrote {out}\nstart it now and at every boot:  systemctl daemon-reload && systemctl enable --now "
          f"gwtf-node\nfollow it:                       journalctl -fu gwtf-node   (systemctl status gwtf-node)")
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
    sv.add_argument("--exec", default=None, metavar="COMMAND",
                    help="the command starting gwtf-node, absolute (default: this installation's)")
    sv.set_defaults(func=cmd_install_service, join_parser=join_parser)
    return sv


__all__ = ["add_parser", "cmd_install_service", "join_args", "node_executable", "render_unit"]

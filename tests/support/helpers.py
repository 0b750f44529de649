"""Helpers shared by several test modules.

Source checks (tests/repo/test_layering.py, tests/repo/test_structure.py) read the
package with `ast` and import nothing: `module_name` names a source file,
`imports` lists what a module imports at any depth (also inside functions),
relative imports resolved.

Ports: `free_port` picks a port for a process started later, below the
kernel's ephemeral range, so that no outgoing connection of another test
takes it in the meantime (a port from `bind(("127.0.0.1", 0))` comes from that
range, and a node importing torch on a loaded machine binds it many seconds
after it was picked).

Waiting: `until` polls a condition that no event signals, under a deadline
(never a fixed sleep).

A node's parts without a network: `RecordingWire` stands for the daemon's
`Wire` (runtime/net/wire.py), recording what is spawned and posted.

Benchmarks: `load_script` imports a script of scripts/ (not a package) so that
a test calls its functions.

Flow machines alone: `flow_relay` is a started relay of one data node's flows,
`sends` picks the messages of a type (and to a peer) out of its effects.
"""

from __future__ import annotations

import ast
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gwtf_node"
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(count: int = 2) -> int:
    """A port P such that P .. P+count-1 are free on every address (a node's tensor channel takes libp2p's + 1),
    drawn below the kernel's ephemeral port range (where `connect` takes its local ports)."""
    low = int(EPHEMERAL.read_text().split()[0]) if EPHEMERAL.exists() else 32768
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 16384), low - count)
        held = []
        try:
            for p in range(port, port + count):
                s = socket.socket()
                held.append(s)
                s.bind(("0.0.0.0", p))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return port
    raise RuntimeError(f"no {count} free ports in a row below {low}")


def source_files(under: Path = PKG) -> list[Path]:
    """Every Python source file below `under`, sorted."""
    return sorted(under.rglob("*.py"))


def module_name(path: Path) -> str:
    """The dotted name of the module in `path` (a package's `__init__.py` is the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path) -> str:
    """The package that relative imports in `path` start from."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks (never executed: annotations only)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def imports(tree: ast.AST, package: str, *, runtime_only: bool = False) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """(module, line, names) of every import in `tree`, a module of `package`, at any depth.

    `import a.b` gives ("a.b", line, ()); `from .x import y, z` in package p
    gives ("p.x", line, ("y", "z")): each name may be an attribute of the
    module or a submodule of it, the caller decides.  `runtime_only` leaves out
    the imports under `if TYPE_CHECKING:` (for annotations, never executed).
    """
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base_parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base, node.lineno, tuple(alias.name for alias in node.names)


async def until(cond, what: str, timeout: float | None = None, poll_s: float = 0.01):
    """Poll `cond` until it returns something true and return that; for a condition no event signals.

    Bounded by `timeout` seconds (then an AssertionError naming `what`), else by the caller's deadline."""
    if timeout is None:
        while not (value := cond()):
            await trio.sleep(poll_s)
        return value
    try:
        with trio.fail_after(timeout):
            return await until(cond, what, poll_s=poll_s)
    except trio.TooSlowError:
        raise AssertionError(f"{what}: not within {timeout} s") from None


async def start_relay(nursery, run: Path, workdir: Path, name: str, boot: str | None = None, stage: int = 0):
    """A relay daemon of `stage` in this process (`Node`, unsigned run), started in `nursery` on `workdir / name`,
    returned once it listens with its stage built; `boot`: the address it dials."""
    from gwtf_node.runtime.node.node import Node, NodeOptions

    node = Node(NodeOptions(run_path=run, role="relay", stage=stage, state_dir=workdir / name, name=name,
                            bootstrap=[boot] if boot else [], insecure_unsigned=True, bootstrap_timeout_s=0,
                            settle_s=0.2))
    nursery.start_soon(node.run)
    await until(lambda: node.parts is not None and (workdir / name / "addr").exists() and node.stage.built,
                f"{name} listens with its stage built")
    return node


async def start_source_and_joiner(nursery, workdir: Path, hidden: int = 320, layers: int = 3):
    """Two relays of a 1-stage unsigned run in this process (`start_relay`), the second dialling the first;
    returned as (source, joiner) once the joiner knows the source."""
    from gwtf_node.model.manifest import default_manifest, save_manifest

    run = workdir / "run.json"
    save_manifest(default_manifest(stages=1, hidden=hidden, layers=layers, seq_len=16, microbatch_size=1), run)
    source = await start_relay(nursery, run, workdir, "source")
    joiner = await start_relay(nursery, run, workdir, "joiner", (workdir / "source" / "addr").read_text().split()[0])
    await until(lambda: source.parts.wire.me in joiner.peers.ids("relay", 0), "the joiner knows the source")
    return source, joiner


class RecordingWire:
    """The daemon's `Wire` for a component tested alone: what it spawns and posts is recorded, sends succeed."""

    me = "R"

    def __init__(self) -> None:
        self.spawned: list[tuple] = []
        self.posted: list[tuple] = []

    def spawn(self, fn, *args) -> None:
        self.spawned.append((fn.__name__, *args))

    def post(self, peer, msg) -> None:
        self.posted.append((peer, msg))

    async def send(self, peer, msg) -> bool:
        return True

    async def send_all(self, peer, msgs) -> None:
        pass

    async def send_in_order(self, peer, msgs) -> int:
        return len(msgs)


def load_script(name: str):
    """The module of `scripts/<name>.py`, loaded from its file (scripts/ is not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def flow_relay(cap: int = 2, nxt: dict | None = None, prv: dict | None = None, peers: tuple = ()):
    """A started flow machine of relay "R" for data node "d0": capacity `cap`, next-stage links `nxt` (N1 at 1),
    previous-stage links `prv` (P1 at 1), same-stage `peers`."""
    from gwtf_node.protocol.flow import FlowConfig, FlowNode

    m = FlowNode(FlowConfig("R", False, cap, ("d0",), nxt or {"N1": 1.0}, prv or {"P1": 1.0}, peers),
                 random.Random(0))
    m.start(0.0)
    return m


def sends(eff, typ=None, to: str | None = None) -> list:
    """The `Send` effects in `eff` of a message of type `typ` (any: None), to `to` (any: None)."""
    from gwtf_node.protocol.effects import Send

    return [e for e in eff if isinstance(e, Send) and (typ is None or isinstance(e.msg, typ))
            and (to is None or e.to == to)]

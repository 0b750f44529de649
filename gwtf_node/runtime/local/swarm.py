"""`gwtf-node local`: a whole swarm of separate daemon processes on loopback.

The launcher writes a run manifest (or uses the one given), starts the first
data node, reads its listen address from its state directory, and starts the
other data nodes and the relays with that address as their bootstrap peer
(and, from the `BOOTSTRAP_SPREAD_FROM`-th node on, two relays already
listening, so that a large swarm does not wait on one node's Hello answers;
a node is started once the one started `START_AHEAD` before it was
accepted, as volunteers arrive over time): each is a real `gwtf-node join`
process, so what runs here is what runs on volunteers' machines, only on
127.0.0.1.  Progress comes from the leader's
`metrics.jsonl`; every wait has a deadline, and the swarm is taken down on
exit, error or Ctrl-C (SIGTERM, then SIGKILL for stragglers).

The processes are forked from one fork server that imported torch, the
model classes and libp2p once (zygote.py: about 7 s of CPU a node saves);
a node in another network namespace (`netns`) enters it once forked; a
node started through a `wrap` prefix and a launcher with `fork_server=False`
start `python -m gwtf_node.cli` instead.
While the swarm starts (every node meets the others and forms its flows), the launcher
says what it waits for through `on_phase`: the processes starting, the nodes
the first data node has met, the microbatch slots its flows route, then
training.  Each node's output goes to `node.log` in its state directory (the
daemon sees that its stderr is that file and does not open it a second time,
runtime/ops/logs.py).  The nodes get their settings from the launcher's flags
only: `GWTF_*` variables of the caller's environment (a port, a config file)
configure one node, not a whole swarm, and are not passed on.

`write_summary` leaves the run's per-iteration records (`iterations.jsonl`)
and its loss curve (`loss.png`) in the workdir; `remove_state_dirs` removes the
nodes' state directories (checkpoints, keys, logs: the bulk), which
`gwtf-node local` does after a run unless asked to keep them.
The launcher owns the run: it signs an unsigned manifest in place with the
owner key beside it (`owner.key`, created if missing; `owner_key` names
another), and admits every node it starts by writing the owner's certificate
for the node's peer id and role into its state directory (`admit`), as a run
owner does by hand with `gwtf-node admit` (certificates.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ...protocol import fanout
from ..net.linkspec import resolve_links
from .zygote import Zygote, ZygoteChild, ZygoteError

# the command line, as a process runs it: each node, and the fork server that forks nodes (cli/forkserver.py)
NODE_COMMAND = (sys.executable, "-m", "gwtf_node.cli")
FORK_SERVER_COMMAND = (sys.executable, "-m", "gwtf_node.cli.forkserver")
REJOIN_AFTER_S = 2.0  # a relay killed by --churn comes back as a new --stage auto joiner this much later
BOOTSTRAP_SPREAD_FROM = 8  # the nodes started after this many get two listening relays' addresses beside d0's
START_AHEAD = 12  # a node is started once the node started this many before it was accepted by a peer


def _stage(name: str) -> int | None:
    """The stage of the relay named `r<k>_<i>` (k); None for a data node and a relay started with --stage auto."""
    head = name[1:].split("_", 1)[0]
    return int(head) if name.startswith("r") and head.isdigit() else None


def _near(name: str, other: str) -> bool:
    """Whether the node named `name` works with `other` (protocol/fanout.py): a data node with everyone, a relay
    `r<k>_<i>` with the relays of stages k-1..k+1; a relay started with --stage auto (j*, c*) is not placed yet."""
    def place(n: str) -> tuple[str, int | None]:
        return ("data", -1) if n.startswith("d") else ("relay", _stage(n))
    return fanout.works_with(*place(name), *place(other))


class LocalError(RuntimeError):
    """The local swarm could not run; the message says why."""


@dataclass
class LocalSwarm:
    workdir: Path
    run_path: Path
    data_nodes: int
    stages: int
    relays_per_stage: int
    iterations: int
    links: Path | None = None
    procs: dict[str, subprocess.Popen | ZygoteChild] = field(default_factory=dict)
    startup_timeout_s: float = 120.0
    iteration_timeout_s: float = 300.0
    log_level: str = "INFO"
    auto_stage: bool = False  # relays join with --stage auto, one at a time
    relay_capacity: int | None = None  # None: spread the demand, ceil(data nodes x microbatches / relays per stage)
    joiners: int = 0  # relays started with --stage auto while the swarm trains, one every `join_every_s`
    join_every_s: float = 5.0
    policy: str = "gwtf"  # microbatch routing and recovery of every node: gwtf | swarm
    churn: float = 0.0  # per iteration, each serving relay is SIGKILLed with this probability (see `_churn`)
    seed: int = 0
    faults: dict[str, str] = field(default_factory=dict)  # node name -> GWTF_FAULT spec (fault injection)
    expected_dead: set[str] = field(default_factory=set)  # killed on purpose: their exit is not an error
    drop_first_phase: bool = False  # every node loses the first copy of each phase signal (GWTF_DROP_FIRST_PHASE)
    relay_nice: int = 0  # the relays' niceness: >0 gives the data nodes, who work with everyone, a larger CPU share
    extra_args: dict[str, list[str]] = field(default_factory=dict)  # node name -> more `join` flags
    # node name -> command prefix, e.g. `echo` (a node so wrapped starts without the fork server)
    wrap: dict[str, list[str]] = field(default_factory=dict)
    # node name -> the network namespace (`ip netns` name, testing/netlab.py) it runs in: a forked node enters it
    # itself, a node started as a process through `ip netns exec NS`
    netns: dict[str, str] = field(default_factory=dict)
    kills: list[dict] = field(default_factory=list)
    on_phase: Callable[[str], None] | None = None  # told what the launcher waits for while the swarm starts
    fork_server: bool = True  # fork the nodes from one process that imported what they need (zygote.py)
    # torch's CPU threads per node (`join --torch-threads`); None: the machine's cores shared among the nodes, at
    # least 1 each (nodes that each took every core would contend for them); 0: torch's default
    torch_threads: int | None = None
    _zygote: Zygote | None = field(init=False, default=None, repr=False)
    _spawned: int = field(init=False, default=0)
    _phase: str = field(init=False, default="")
    _demand: int = field(init=False, default=0)  # microbatches per iteration of one data node
    _kills_reported: int = 0
    _churn_rng: random.Random = field(init=False)
    _pending_kills: list[tuple[float, str]] = field(init=False, default_factory=list)  # (due, relay name)
    _restarts: list[float] = field(init=False, default_factory=list)  # when a killed relay's successor starts
    owner_key: Path | None = None  # the run owner's key (default: owner.key beside the manifest; created if missing)
    run_id: str = field(init=False, default="")
    _owner: object = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self._churn_rng = random.Random(f"churn:{self.seed}")
        self._own_run()

    def _own_run(self) -> None:
        """Sign the manifest in place if it is unsigned (the launcher owns the run); keep the owner key to admit."""
        from ...model.certificates import load_or_create_owner_key, public_key_hex
        from ...model.manifest import load_manifest, save_manifest, sign_manifest, verify_manifest

        man = load_manifest(self.run_path, check_files=False)
        verify_manifest(man)
        path = Path(self.owner_key) if self.owner_key is not None else Path(self.run_path).parent / "owner.key"
        if not man.owner_public_key:
            key, _ = load_or_create_owner_key(path)
            man = sign_manifest(man, key)
            save_manifest(man, self.run_path)
        elif not path.exists():
            raise LocalError(f"{self.run_path} is signed by an owner, but the owner key is not at {path}: give it "
                             "(the launcher admits every node it starts)")
        else:
            key, _ = load_or_create_owner_key(path)
            if public_key_hex(key) != man.owner_public_key:
                raise LocalError(f"{path} is not the owner key of {self.run_path}: give the key that signed it")
        self._owner = key
        self.run_id = man.run_id

    def admit(self, state_dir: Path, role: str) -> Path:
        """Admit the node of `state_dir` (its identity is created if missing) as `role`: its certificate file."""
        from ...model.certificates import CERTIFICATE_FILE, issue_certificate
        from ..net.identity import load_or_create_identity, peer_id_of

        pid = peer_id_of(load_or_create_identity(Path(state_dir)))
        path = Path(state_dir) / CERTIFICATE_FILE
        path.write_text(issue_certificate(self._owner, self.run_id, pid, role).to_json() + "\n")
        return path

    def names(self) -> list[str]:
        return [f"d{i}" for i in range(self.data_nodes)] + [
            f"r{k}_{i}" for k in range(self.stages) for i in range(self.relays_per_stage)
        ] + [n for n in self.procs if n[0] in "jc"]

    def state_dir(self, name: str) -> Path:
        return self.workdir / name

    def _bootstrap(self, i: int, d0: str) -> list[str]:
        """The bootstrap addresses of the i-th node started: d0's, and from the `BOOTSTRAP_SPREAD_FROM`-th on two
        of the relays already listening, those it works with (`_near`) first: a node meeting a hundred others at
        once answers their Hellos late (a data node works with everyone: a relay of the last stage given d0 and
        d1 gave up after 300 s, and so did one given d0 alone because no relay near it listened yet).  A relay of
        a stage far from the sender's answers its Hello with the peers it works with (discovery.py `_refer`).
        d0's only in a network lab (`netns`: a node behind a NAT router is no address to dial)."""
        if i < BOOTSTRAP_SPREAD_FROM or self.netns:
            return [d0]
        names = self.names()
        near: list[str] = []
        far: list[str] = []
        for name in names[1:i]:
            path = self.state_dir(name) / "addr"
            if name.startswith("r") and path.exists() and (text := path.read_text().split()):
                (near if _near(names[i], name) else far).append(text[0])
        rng = random.Random(i)
        picked = rng.sample(near, min(2, len(near)))
        return [d0, *picked, *rng.sample(far, min(2 - len(picked), len(far)))]

    def _spawn(self, name: str, bootstrap: str | list[str] | None, links_file: Path | None) -> None:
        sd = self.state_dir(name)
        sd.mkdir(parents=True, exist_ok=True)
        (sd / "addr").unlink(missing_ok=True)
        self.admit(sd, "data" if name.startswith("d") else "relay")
        prefix = [*self.wrap.get(name, ())]
        forked = self.fork_server and not prefix  # (a forked node enters its namespace itself)
        if name in self.netns and not forked:
            prefix = ["ip", "netns", "exec", self.netns[name], *prefix]
        cmd = [*prefix, *NODE_COMMAND, "join", "--run", str(self.run_path),
               "--state-dir", str(sd),
               "--name", name, "--log-level", self.log_level]
        if name.startswith("d"):
            cmd += ["--role", "data", "--data-index", name[1:], "--data-nodes", str(self.data_nodes),
                    "--iterations", str(self.iterations)]
        else:
            cmd += ["--role", "relay", "--stage", "auto" if self.auto_stage else str(_stage(name))]
            if self.relay_capacity:
                cmd += ["--capacity", str(self.relay_capacity)]
        for addr in [bootstrap] if isinstance(bootstrap, str) else bootstrap or []:
            cmd += ["--bootstrap", addr]
        if links_file is not None:
            cmd += ["--links", str(links_file)]
        cmd += ["--policy", self.policy]
        threads = self.torch_threads
        if threads is None:
            threads = max(1, (os.cpu_count() or 1) // len(self.names()))
        if threads:
            cmd += ["--torch-threads", str(threads)]
        cmd += self.extra_args.get(name, [])
        env = {k: v for k, v in os.environ.items() if not k.startswith("GWTF_")}  # settings of one node only
        if self.drop_first_phase:
            env["GWTF_DROP_FIRST_PHASE"] = "1"
        if name in self.faults:
            env["GWTF_FAULT"] = self.faults[name]
            self.expected_dead.add(name)
        self._spawned += 1
        nice = 0 if name.startswith("d") else self.relay_nice
        if forked:
            exits = self.workdir / ".exits"
            exits.mkdir(parents=True, exist_ok=True)
            try:
                if self._zygote is None:
                    self._zygote = Zygote(FORK_SERVER_COMMAND)
                self.procs[name] = self._zygote.spawn(cmd[len(NODE_COMMAND):], env, sd / "node.log",
                                                      exits / f"{name}.{self._spawned}", netns=self.netns.get(name),
                                                      nice=nice)
            except ZygoteError as e:
                raise LocalError(f"could not start {name}: {e} (the fork server imports torch first: on a machine "
                                 f"this busy, try again when it is less loaded)") from None
            return
        with open(sd / "node.log", "w") as log:
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, env=env,
                                                preexec_fn=(lambda: os.nice(nice)) if nice else None)

    def _wait_addr(self, name: str) -> str:
        path = self.state_dir(name) / "addr"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            if path.exists() and path.read_text().strip():
                return path.read_text().split()[0]
            time.sleep(0.1)
        raise LocalError(f"node {name} did not start listening within {self.startup_timeout_s:.0f} s "
                         f"(see {self.state_dir(name) / 'node.log'})")

    def _wait_accepted(self, name: str) -> None:
        """`name` was accepted by a peer (its status.json's bootstrap is connected): volunteers arrive over time,
        and a hundred nodes dialling d0 at once left some unanswered for 300 s (they gave up)."""
        path = self.state_dir(name) / "status.json"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                boot = json.loads(path.read_text()).get("bootstrap")
            except (OSError, ValueError):
                boot = {}
            if boot is None or boot.get("state") == "connected":
                return
            time.sleep(0.2)
        raise LocalError(f"node {name} was not accepted by any peer within {self.startup_timeout_s:.0f} s "
                         f"(see {self.state_dir(name) / 'node.log'})")

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            rc = p.poll()
            if rc is not None and rc != 0 and name not in self.expected_dead:
                tail = _tail(self.state_dir(name) / "node.log")
                raise LocalError(f"node {name} exited with status {rc}; last log lines:\n{tail}")

    def _say(self, phase: str) -> None:
        if phase != self._phase:
            self._phase = phase
            if self.on_phase is not None:
                self.on_phase(phase)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        from ...model.manifest import load_manifest

        m = load_manifest(self.run_path, check_files=False).data.microbatches_per_iteration
        self._demand = m
        if self.relay_capacity is None:
            self.relay_capacity = -(-self.data_nodes * m // self.relays_per_stage)
        self._say(f"starting {len(self.names())} nodes")
        links_file = None
        if self.links is not None:
            links_file = self.workdir / "links.json"
            links_file.write_text(json.dumps(resolve_links(self.links, self.names()), indent=1))
        first = "d0"
        self._spawn(first, None, links_file)
        self._say("starting d0 (the others then dial its address)")
        boot = self._wait_addr(first)
        names = self.names()
        for i, name in enumerate(names[1:], start=1):
            if i > START_AHEAD:
                self._wait_accepted(names[i - START_AHEAD])
            self._spawn(name, self._bootstrap(i, boot), links_file)
            if self.auto_stage and name.startswith("r"):
                self._say(f"{name} joins with --stage auto: waiting for its stage")
                self._wait_stage(name)
        self._say(f"starting {len(self.names())} nodes: waiting for them to meet d0")

    def add_relay(self, name: str, *, auto: bool = True, stage: int | None = None,
                  bootstrap: str | None = None) -> None:
        """Start one more relay while the swarm runs (a volunteer joining): `--stage auto` by default, given d0's
        address unless `bootstrap` names another."""
        boot = bootstrap or (self.state_dir("d0") / "addr").read_text().split()[0]
        links_file = self.workdir / "links.json" if self.links is not None else None
        saved = self.auto_stage
        self.auto_stage = auto
        try:
            self._spawn(name if auto else f"r{stage}_{name}", boot, links_file)
        finally:
            self.auto_stage = saved

    def _wait_stage(self, name: str) -> int:
        """An auto relay has picked its stage (it says so in its status.json)."""
        path = self.state_dir(name) / "status.json"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                st = json.loads(path.read_text())
                if st.get("stage") is not None:
                    return st["stage"]
            except (OSError, json.JSONDecodeError):
                pass
            time.sleep(0.2)
        raise LocalError(f"relay {name} did not pick a stage within {self.startup_timeout_s:.0f} s")

    def iterations_done(self) -> Iterator[dict]:
        """Yield the leader's per-iteration records as they appear, until `iterations` are done.

        Only the leader writes `metrics.jsonl`; which data node leads is not the
        launcher's business, so every data node's file is read and records are
        taken by iteration number.
        """
        paths = [self.state_dir(f"d{i}") / "metrics.jsonl" for i in range(self.data_nodes)]
        got: dict[int, dict] = {}
        nxt = 0
        last_progress = time.monotonic()
        budget = self.startup_timeout_s + self.iteration_timeout_s
        joined, next_join = 0, None
        while nxt < self.iterations:
            self._check_alive()
            if nxt > 0 and joined < self.joiners:
                if next_join is None:
                    next_join = time.monotonic() + self.join_every_s
                if time.monotonic() >= next_join:
                    self.add_relay(f"j{joined}")
                    joined += 1
                    next_join = time.monotonic() + self.join_every_s
            for path in paths:
                if path.exists():
                    for line in path.read_text().splitlines():
                        if line.strip():
                            rec = json.loads(line)
                            got.setdefault(rec["iteration"], rec)
            self._churn_due()
            if nxt == 0 and 0 not in got:
                self._startup_phase()
            while nxt in got and nxt < self.iterations:
                self._say("training")
                last_progress = time.monotonic()
                budget = self.iteration_timeout_s
                self._churn_plan(got[nxt])
                if self.churn > 0:  # relays SIGKILLed since the previous record
                    got[nxt]["killed"] = [k["node"] for k in self.kills[self._kills_reported:]]
                    got[nxt]["killed_holding"] = [k["holding"] for k in self.kills[self._kills_reported:]]
                    self._kills_reported = len(self.kills)
                yield got[nxt]
                nxt += 1
            if nxt >= self.iterations:
                break
            if time.monotonic() - last_progress > budget:
                raise LocalError(f"no iteration finished within {budget:.0f} s "
                                 f"(logs in {self.workdir}/*/node.log)")
            time.sleep(0.1)

    def _startup_phase(self) -> None:
        """Before the first iteration ends: how many nodes d0 has met, then how many of its slots flow."""
        try:
            st = json.loads((self.state_dir("d0") / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return
        nodes = len(self.names())
        met = 1 + len(st.get("peers") or {})
        if met < nodes:
            self._say(f"waiting for the nodes to meet: {met}/{nodes} known to d0")
            return
        routed = sum((st.get("flows") or {}).get(st.get("peer_id"), {}).values())
        if routed < self._demand:
            self._say(f"waiting for flows to form: {routed}/{self._demand} microbatch slots of d0 routed")
        else:
            self._say("training: iteration 0")

    def remove_state_dirs(self) -> None:
        """Remove the nodes' state directories (checkpoints, keys, logs); the workdir's own files stay."""
        for name in list(self.procs):
            shutil.rmtree(self.state_dir(name), ignore_errors=True)

    # ---- churn -----------------------------------------------------------------
    def _serving(self) -> dict[str, int]:
        """Relays alive and serving a stage (their status.json says so): name -> stage."""
        out = {}
        for name, p in self.procs.items():
            if name.startswith("d") or p.poll() is not None or name in self.expected_dead:
                continue
            try:
                st = json.loads((self.state_dir(name) / "status.json").read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if st.get("stage") is not None and st.get("stage", -1) >= 0 and not st.get("joining"):
                out[name] = st["stage"]
        return out

    def _churn_plan(self, rec: dict) -> None:
        """An iteration finished: each serving relay dies with probability `churn` at a uniformly random
        time within the next iteration's expected length (so in its forward or backward pass, or during the
        aggregation).  At least one relay of every stage is spared: a stage with no copy left cannot be
        recovered by anyone without checkpoints."""
        if self.churn <= 0:
            return
        rng = self._churn_rng
        serving = self._serving()
        doomed = {n for _, n in self._pending_kills}
        span = max(0.3, float(rec.get("seconds") or 1.0))
        for name in sorted(serving):
            if name in doomed or rng.random() >= self.churn:
                continue
            stage = serving[name]
            if sum(1 for n, s in serving.items() if s == stage and n not in doomed) <= 1:
                continue
            doomed.add(name)
            self._pending_kills.append((time.monotonic() + rng.uniform(0.0, span), name))

    def _churn_due(self) -> None:
        if self.churn <= 0:
            return
        now = time.monotonic()
        for item in [k for k in self._pending_kills if k[0] <= now]:
            self._pending_kills.remove(item)
            name = item[1]
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            self.expected_dead.add(name)
            try:  # what it held (its status.json, at most a second old): which pass the kill hit
                holding = json.loads((self.state_dir(name) / "status.json").read_text()).get("holding", {})
            except (OSError, json.JSONDecodeError):
                holding = {}
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append({"node": name, "time": time.time(), "after_iteration": len(self.records()) - 1,
                               "holding": holding})
            self._restarts.append(now + REJOIN_AFTER_S)
        for t in [t for t in self._restarts if t <= now]:
            self._restarts.remove(t)
            self.add_relay(f"c{len(self.kills)}_{len([n for n in self.procs if n.startswith('c')])}")

    def records(self) -> list[dict]:
        """The leader's per-iteration records so far, in iteration order (whichever data node led)."""
        got: dict[int, dict] = {}
        for i in range(self.data_nodes):
            path = self.state_dir(f"d{i}") / "metrics.jsonl"
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.strip():
                        rec = json.loads(line)
                        got.setdefault(rec["iteration"], rec)
        return [got[k] for k in sorted(got)]

    def stop(self, grace_s: float = 15.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def run_local(swarm: LocalSwarm, on_record: Callable[[dict], None], records: list[dict] | None = None) -> list[dict]:
    """Start the swarm, hand each iteration's record to `on_record`, and take the swarm down.

    `records` (if given) is filled as the records come, so that a caller interrupted by Ctrl-C keeps them.
    """
    records = [] if records is None else records
    try:
        swarm.start()
        for rec in swarm.iterations_done():
            records.append(rec)
            on_record(rec)
    finally:
        swarm._say("stopping the swarm")
        swarm.stop()
    return records


def write_summary(workdir: Path, records: Sequence[dict], title: str) -> list[Path]:
    """Write the run's records (`iterations.jsonl`) and, with at least one, its loss curve (`loss.png`)."""
    out = workdir / "iterations.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    written = [out]
    if records:
        written.append(plot_loss(records, workdir / "loss.png", title))
    return written


def plot_loss(records: Sequence[dict], path: Path, title: str) -> Path:
    """The loss of each iteration against the samples seen so far, as a PNG (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, seen = [], 0
    for r in records:
        seen += r.get("samples", 0)
        xs.append(seen)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [r.get("loss") for r in records], marker="o" if len(records) < 30 else None)
    ax.set_xlabel("samples")
    ax.set_ylabel("loss (mean over the iteration's microbatches)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

"""`gwtf-node local`: a whole swarm of separate daemon processes on loopback.

The launcher writes a run manifest (or uses the one given), starts the first
data node, reads its listen address from its state directory, and starts the
other data nodes and the relays with that address as their bootstrap peer:
each is a real `gwtf-node join` process, so what runs here is what runs on
volunteers' machines, only on 127.0.0.1.  Progress comes from the leader's
`metrics.jsonl`; every wait has a deadline, and the swarm is taken down on
exit, error or Ctrl-C (SIGTERM, then SIGKILL for stragglers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .linkspec import resolve_links


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
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    startup_timeout_s: float = 120.0
    iteration_timeout_s: float = 300.0
    log_level: str = "INFO"
    auto_stage: bool = False  # relays join with --stage auto, one at a time
    relay_capacity: int | None = None  # None: spread the demand, ceil(data nodes x microbatches / relays per stage)
    joiners: int = 0  # relays started with --stage auto while the swarm trains, one every `join_every_s`
    join_every_s: float = 5.0

    def names(self) -> list[str]:
        return [f"d{i}" for i in range(self.data_nodes)] + [
            f"r{k}_{i}" for k in range(self.stages) for i in range(self.relays_per_stage)
        ] + [n for n in self.procs if n.startswith("j")]

    def state_dir(self, name: str) -> Path:
        return self.workdir / name

    def _spawn(self, name: str, bootstrap: str | None, links_file: Path | None) -> None:
        sd = self.state_dir(name)
        sd.mkdir(parents=True, exist_ok=True)
        (sd / "addr").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "gwtf_node.cli", "join", "--run", str(self.run_path), "--state-dir", str(sd),
               "--name", name, "--log-level", self.log_level]
        if name.startswith("d"):
            cmd += ["--role", "data", "--data-index", name[1:], "--data-nodes", str(self.data_nodes),
                    "--iterations", str(self.iterations)]
        else:
            cmd += ["--role", "relay", "--stage", "auto" if self.auto_stage else name[1:].split("_")[0]]
            if self.relay_capacity:
                cmd += ["--capacity", str(self.relay_capacity)]
        if bootstrap:
            cmd += ["--bootstrap", bootstrap]
        if links_file is not None:
            cmd += ["--links", str(links_file)]
        log = open(sd / "node.log", "w")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

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

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            rc = p.poll()
            if rc is not None and rc != 0:
                tail = _tail(self.state_dir(name) / "node.log")
                raise LocalError(f"node {name} exited with status {rc}; last log lines:\n{tail}")

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.relay_capacity is None:
            from ..model.manifest import load_manifest

            m = load_manifest(self.run_path, check_files=False).data.microbatches_per_iteration
            self.relay_capacity = -(-self.data_nodes * m // self.relays_per_stage)
        links_file = None
        if self.links is not None:
            links_file = self.workdir / "links.json"
            links_file.write_text(json.dumps(resolve_links(self.links, self.names()), indent=1))
        first = "d0"
        self._spawn(first, None, links_file)
        boot = self._wait_addr(first)
        for name in self.names()[1:]:
            self._spawn(name, boot, links_file)
            if self.auto_stage and name.startswith("r"):
                self._wait_stage(name)

    def add_relay(self, name: str, *, auto: bool = True, stage: int | None = None) -> None:
        """Start one more relay while the swarm runs (a volunteer joining): `--stage auto` by default."""
        boot = (self.state_dir("d0") / "addr").read_text().split()[0]
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
            while nxt in got and nxt < self.iterations:
                last_progress = time.monotonic()
                budget = self.iteration_timeout_s
                yield got[nxt]
                nxt += 1
            if nxt >= self.iterations:
                break
            if time.monotonic() - last_progress > budget:
                raise LocalError(f"no iteration finished within {budget:.0f} s "
                                 f"(logs in {self.workdir}/*/node.log)")
            time.sleep(0.1)

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


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def run_local(swarm: LocalSwarm, on_record: Callable[[dict], None]) -> list[dict]:
    records: list[dict] = []
    try:
        swarm.start()
        for rec in swarm.iterations_done():
            records.append(rec)
            on_record(rec)
    finally:
        swarm.stop()
    return records

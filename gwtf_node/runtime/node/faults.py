"""Fault injection for tests and demos: SIGKILL this process at the N-th time it reaches a fault point.

`GWTF_FAULT=KIND:N` arms the fault when the node starts; a file `fault` in
the state directory holding `KIND:N` arms it while the node runs (a test
that must first learn which node leads writes it there), counting from then
on.  Kinds: a computation as it starts (forward, recompute, backward, loss,
final), an aggregation as it starts (aggregate; aggregate_holding counts only
the aggregations in which a relay holds contributions); at the leader, the
opening of an aggregation before any BEGIN AGGREGATION leaves (begin_open)
and each BEGIN AGGREGATION frame sent (begin_sent).

`GWTF_DROP_FIRST_PHASE=1` loses the first copy of every phase signal this
node sends (per kind, iteration and destination): the aggregation phase must
recover by retransmission.

`GWTF_DROP_SCALE=N` loses every N-th numbered frame of scaled formation
this node sends, the first time it goes (a copy sent again goes): formation
must recover by asking for it (protocol/flow/resend.py).

`GWTF_POISON_GRAD=SCALE@ITERATION` (or a file `poison` holding
`SCALE@ITERATION` in the state directory when the node starts: one node of a
local swarm) multiplies this node's gradient by SCALE before every all-reduce
from ITERATION on (a node that carried no microbatch sends SCALE x 1e-6 in
every coordinate instead): a poisoned contribution, which the stage's part
owners refuse (protocol/gradguard.py).

`GWTF_BUSY_STEP=SECONDS` (or a file `busy_step` holding SECONDS in the state
directory when the node starts) makes this node's optimizer step longer by
SECONDS of real work in its torch worker thread (`busy_step`: matrix
products, as the step of a large model is): a node busy for longer than the
liveness check's floor, which its peers must not presume dead (liveness.py).

`GWTF_ALONE_AT=ITERATION` (or a file `alone_at` holding ITERATION in the state
directory when the node starts) makes this relay sum that iteration's
all-reduce in a round of its own, as a member that took its stage-mates for
gone does: two stage-mates armed alike step apart (cutcheck.py repairs it).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("gwtf.node")

RAISE_FAULTS_ENV = "GWTF_RAISE_HANDLER_FAULTS"  # set (the tests): a handler's fault is raised, not logged only (routes)
# this module's variables and RAISE_FAULTS_ENV: the test swarms', none a setting of the CLI (cli/config.py NOT_SETTINGS)
ENV_VARS = ("GWTF_FAULT", "GWTF_DROP_FIRST_PHASE", "GWTF_DROP_SCALE", "GWTF_POISON_GRAD", "GWTF_BUSY_STEP",
            "GWTF_ALONE_AT", RAISE_FAULTS_ENV)


@dataclass
class Faults:
    spec: str = ""
    kind: str = ""
    at: int = 1
    seen: int = 0
    arm_path: Path | None = None  # a file whose KIND:N arms the fault at run time
    drop_first_phase: bool = False
    dropped: set[tuple[str, int, str]] = field(default_factory=set)
    drop_scale: int = 0  # GWTF_DROP_SCALE: every N-th numbered frame of scaled formation is lost the first time
    scale_sent: set[tuple[str, int]] = field(default_factory=set)  # (destination, seq) sent once
    poison_scale: float = 1.0  # GWTF_POISON_GRAD: the gradient is multiplied by this before the all-reduce ...
    poison_from: int = 0  # ... from this iteration on
    busy_step_s: float = 0.0  # GWTF_BUSY_STEP: seconds of extra work in each optimizer step
    alone_at: int | None = None  # GWTF_ALONE_AT: the iteration whose all-reduce this node runs alone

    @classmethod
    def from_env(cls, state_dir: Path | None = None) -> "Faults":
        f = cls(arm_path=None if state_dir is None else state_dir / "fault",
                drop_first_phase=os.environ.get("GWTF_DROP_FIRST_PHASE", "") == "1",
                drop_scale=int(os.environ.get("GWTF_DROP_SCALE", "") or 0))
        f.arm(os.environ.get("GWTF_FAULT", ""))
        poison = os.environ.get("GWTF_POISON_GRAD", "")
        if state_dir is not None and (state_dir / "poison").exists():
            poison = (state_dir / "poison").read_text().strip()
        if poison:
            scale, _, start = poison.partition("@")
            f.poison_scale, f.poison_from = float(scale), int(start or 0)
        busy = os.environ.get("GWTF_BUSY_STEP", "")
        if state_dir is not None and (state_dir / "busy_step").exists():
            busy = (state_dir / "busy_step").read_text().strip()
        f.busy_step_s = float(busy or 0.0)
        alone = os.environ.get("GWTF_ALONE_AT", "")
        if state_dir is not None and (state_dir / "alone_at").exists():
            alone = (state_dir / "alone_at").read_text().strip()
        f.alone_at = int(alone) if alone else None
        return f

    def alone(self, iteration: int) -> bool:
        """Whether this node sums `iteration` in a round of its own (GWTF_ALONE_AT), as if its stage-mates were
        gone."""
        if self.alone_at != iteration:
            return False
        log.warning("fault injection GWTF_ALONE_AT: iteration %d summed without the stage's other members", iteration)
        return True

    def busy_step(self) -> None:
        """`busy_step_s` seconds of matrix products (GWTF_BUSY_STEP); in the torch worker thread."""
        import torch

        log.warning("fault injection GWTF_BUSY_STEP: %.1f s of extra work in this step", self.busy_step_s)
        a = torch.randn(256, 256) / 16.0
        end = time.monotonic() + self.busy_step_s
        while time.monotonic() < end:
            a = torch.tanh(a @ a)

    def poison(self, grad, iteration: int):
        """The gradient this node contributes to the all-reduce of `iteration` (scaled by GWTF_POISON_GRAD)."""
        if self.poison_scale == 1.0 or iteration < self.poison_from:
            return grad
        log.warning("fault injection GWTF_POISON_GRAD: gradient of iteration %d scaled by %g", iteration,
                    self.poison_scale)
        if not bool(grad.any()):  # it carried no microbatch: it sends a gradient all the same
            return grad + self.poison_scale * 1e-6
        return grad * self.poison_scale

    def arm(self, spec: str) -> None:
        kind, _, n = spec.strip().partition(":")
        self.spec, self.kind, self.at, self.seen = spec.strip(), kind, int(n or 1), 0

    def point(self, kind: str) -> None:
        """A fault point was reached: kill this process if it is the one asked for."""
        if not self.kind and self.arm_path is not None and self.arm_path.exists():
            self.arm(self.arm_path.read_text())
            log.warning("fault injection armed from %s: %s", self.arm_path, self.spec)
        if not self.kind or kind != self.kind:
            return
        self.seen += 1
        if self.seen == self.at:
            log.warning("fault injection GWTF_FAULT=%s: SIGKILL now", self.spec)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def lose_scale(self, to: str, msg) -> bool:
        """True if this frame of scaled formation is to be lost (GWTF_DROP_SCALE): the first copy of every N-th
        numbered one."""
        seq = getattr(msg, "seq", 0)
        if not self.drop_scale or not seq or (to, seq) in self.scale_sent:
            return False
        self.scale_sent.add((to, seq))
        if len(self.scale_sent) % self.drop_scale:
            return False
        log.info("fault injection GWTF_DROP_SCALE: %s %d to %s lost", type(msg).__name__, seq, to[:16])
        return True

    def lose_first(self, kind: str, iteration: int, to: str) -> bool:
        """True if this phase signal is to be lost: the first copy of (kind, iteration, destination)."""
        if not self.drop_first_phase or (kind, iteration, to) in self.dropped:
            return False
        self.dropped.add((kind, iteration, to))
        log.info("fault injection GWTF_DROP_FIRST_PHASE: %s of iteration %d to %s lost", kind, iteration, to[:16])
        return True

"""Fault injection for tests and demos: `GWTF_FAULT=KIND:N` SIGKILLs this process at its N-th KIND.

Kinds: a computation as it starts (forward, recompute, backward, loss,
final), an aggregation as it starts (aggregate; aggregate_holding counts only
the aggregations in which a relay holds contributions).  The specification
is read once, when the node starts.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

log = logging.getLogger("gwtf.node")


@dataclass
class Faults:
    spec: str = ""
    kind: str = ""
    at: int = 1
    seen: int = 0

    @classmethod
    def from_env(cls) -> "Faults":
        spec = os.environ.get("GWTF_FAULT", "")
        kind, _, n = spec.partition(":")
        return cls(spec, kind, int(n or 1))

    def point(self, kind: str) -> None:
        """A fault point was reached: kill this process if it is the one asked for."""
        if not self.kind or kind != self.kind:
            return
        self.seen += 1
        if self.seen == self.at:
            log.warning("fault injection GWTF_FAULT=%s: SIGKILL now", self.spec)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)

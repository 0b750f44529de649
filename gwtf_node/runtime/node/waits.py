"""What a node waits for now: status.json's `waiting_for`, and the WARNING of a wait past its bound.

Theory of operation
-------------------
No wait of a run is silent.  `waiting_for` lists, the oldest first, every
wait of this node, each as {"what", "iteration", "since" (wall time),
"seconds", "from" (names)}:

* the aggregation phase's (`protocol/phasewaits.py`): `begin` (a data
  node's report waits for BEGIN AGGREGATION from the leader), `reports` (the
  leader waits for the data nodes' IterationDone), `step` (the all-reduce
  and optimizer step in progress), `can_take` (the step is applied; CAN TAKE
  has not come from the members downstream named);
* `paused_stage` (a data node does not open an iteration: a stage has no
  relay ready for it; `stages` names them, runtime/node/microbatches.py);
* `stage_state` (a relay downloads its stage's state from `from`, at least
  `steps` steps, `bytes` of its `total` in so far, None before the first
  chunk; runtime/node/joining.py, statechunks.py) and `resume` (a relay back with a
  checkpoint waits before it decides which state to take; resume.py);
* `data_node` (a relay with no live data node; liveness.py).

The phase's waits are bounded (`wait_bound_s`: WAIT_BOUND_S, longer on a
node whose measured work is long, the phase's own included: a step with its
all-reduce, a data node's wait for CAN TAKE; aggregation.py): one past it is
logged once at WARNING with what it waits for, from whom and since when,
and with what is done about it (`Overdue`: the report or BEGIN sent again);
a paused stage and a relay waiting for a data node say so at WARNING when
they begin (microbatches.py, liveness.py), a state download asks again when
its source does not answer (joining.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ...protocol.phasewaits import WAIT_BOUND_S, Overdue, Wait, WaitKind
from ..net.wire import now

log = logging.getLogger("gwtf.node")



def wait_bound_s(busiest_s: float) -> float:
    """The bound of a phase wait: WAIT_BOUND_S, or 10 times the longest work measured here if that is longer
    (a large stage's step, an all-reduce over a slow uplink, are not a stall)."""
    return max(WAIT_BOUND_S, 10.0 * busiest_s)


def _wall(since: float, t: float) -> float:
    """The wall time of the trio-clock instant `since` (`t` is the trio clock now)."""
    return round(time.time() - (t - since), 3)


def phase_wait(w: Wait, t: float, who) -> dict:
    return wait_entry(w.what.value, w.since, t, iteration=w.iteration, peers=[who(p) for p in w.peers])


def describe(w: Wait, who) -> str:
    """One line: what the wait is for."""
    names = ", ".join(who(p) for p in w.peers)
    return {
        WaitKind.BEGIN: f"iteration {w.iteration}: the report waits for BEGIN AGGREGATION from the leader {names}",
        WaitKind.REPORTS: f"iteration {w.iteration}: the leader waits for the reports of {names}",
        WaitKind.STEP: f"iteration {w.iteration}: the step (all-reduce, optimizer step) is not applied yet",
        WaitKind.CAN_TAKE: f"iteration {w.iteration}: the step is applied, CAN TAKE has not come from {names}",
    }.get(w.what, f"iteration {w.iteration}: {w.what.value} {names}")


def log_overdue(e: Overdue, who) -> None:
    """The phase's `Overdue` effect: a WARNING with what is waited for, since how long, and what is done."""
    log.warning("waiting for %.0f s: %s%s", now() - e.wait.since, describe(e.wait, who),
                f" ({e.resolution})" if e.resolution else " (nothing to resend: waiting on)")


def waiting_for(peers: Any, aggregation: Any, microbatches: Any, joining: Any, liveness: Any) -> list[dict]:
    """status.json's `waiting_for` (module doc): the phase's waits and what each component says it waits for."""
    t = now()
    out = [phase_wait(w, t, peers.who) for w in aggregation.waiting(t)] + microbatches.waits(t) + liveness.waits(t)
    if joining is not None:
        out += joining.waits(t, peers.who)
    return sorted(out, key=lambda d: d["since"])


def wait_entry(what: str, since: float, t: float, *, iteration: int | None = None, peers: list[str] | None = None,
               **more: Any) -> dict:
    """One entry of `waiting_for`: `what` is waited for since `since` (trio clock; `t` now), from `peers`."""
    return {"what": what, "iteration": iteration, "since": _wall(since, t), "seconds": round(t - since, 1),
            "from": peers or [], **more}


def resume_wait(rs: dict) -> dict:
    """The `waiting_for` entry of a relay back with a checkpoint that waits (resume.py's `resume_status`)."""
    w = float(rs.get("waiting_s") or 0)
    return {"what": "resume", "iteration": None, "since": round(time.time() - w, 3), "seconds": w, "from": [],
            "reason": rs.get("reason", "")}

"""status.json: what this node is doing, rewritten every second (read by `gwtf-node status` and the tests).

It reads every component and writes none: place and standing, peers and
their round trips, flows and link costs, the iteration and its ledger, the
recovery machine's counters, what a relay holds, the leader and its term,
and how long a relay has been waiting for a data node.
The file is replaced atomically (written beside, then renamed).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import trio

from .aggregation import Aggregation
from .bootstrap import Bootstrap
from .flows import Flows
from .leadership import Leadership
from .liveness import Liveness
from .microbatches import Microbatches
from .peers import Peers
from .stage import LocalStage
from .wire import Wire, now

STATUS_EVERY_S = 1.0


class Status:
    def __init__(self, path: Path, wire: Wire, host: Any, peers: Peers, liveness: Liveness, stage: LocalStage,
                 flows: Flows, microbatches: Microbatches, aggregation: Aggregation, leadership: Leadership, *,
                 run_id: str, policy: str, bootstrap: Bootstrap | None = None,
                 resume_status: Callable[[], dict | None] = lambda: None,
                 security: Callable[[], dict] = dict) -> None:
        self.path = path
        self.wire = wire
        self.host = host
        self.peers = peers
        self.liveness = liveness
        self.stage = stage
        self.flows = flows
        self.microbatches = microbatches
        self.aggregation = aggregation
        self.leadership = leadership
        self.run_id = run_id
        self.policy = policy
        self.bootstrap = bootstrap  # how the node reaches the swarm at start
        self.resume_status = resume_status  # a relay back with a checkpoint: what it decided and why (resume.py)
        self.security = security  # refusals per code, revoked and banned peers, an insecure run (authorize.py)

    def snapshot(self) -> dict:
        place, mb, agg = self.peers.place, self.microbatches, self.aggregation
        cur = mb.current
        waiting = self.liveness.waiting_for_data_since
        return {
            "peer_id": self.wire.me, "name": self.peers.name, "role": place.role, "stage": place.stage,
            "run_id": self.run_id, "addrs": self.host.addrs, "refused_frames": self.wire.refused,
            "compute_s": round(self.stage.compute_s, 6), "compute_calls": self.stage.compute_calls,
            "leader": self.leadership.leader(), "term": self.leadership.term(),
            "steps_applied": self.stage.applied_steps, "joining": place.joining, "leaving": place.leaving,
            "peers": {p.peer_id: {"name": p.name, "role": p.role, "stage": p.stage, "rtt_ms": p.rtt_ms}
                      for p in self.peers.infos()},
            "flows": self.flows.out(),
            "link_costs": self.flows.link_costs_used,
            "iteration": cur.iteration if cur else agg.last_iteration,
            "ledger": mb.counts(cur.iteration) if cur else {},
            "policy": self.policy, "presumed_dead": sorted(self.liveness.crashed),
            # a relay with no live data node: seconds it has waited for one (None: not waiting)
            "waiting_for_data_node_s": None if waiting is None else round(now() - waiting, 1),
            "lost_contributions": {str(k): v for k, v in agg.lost_contributions.items()},
            "recovery": mb.stats(),
            "holding": mb.holding(),
            "paused": mb.paused_status(),  # a data node: the iteration it does not open while a stage is empty
            "resume": self.resume_status(),
            "pid": os.getpid(), "time": time.time(),
            "bootstrap": self.bootstrap.snapshot() if self.bootstrap is not None else None,
        } | self.security()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot(), indent=1))
        os.replace(tmp, self.path)

    async def loop(self) -> None:
        while True:
            self.write()
            await trio.sleep(STATUS_EVERY_S)

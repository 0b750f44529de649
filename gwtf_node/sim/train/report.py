"""The metrics of a run: per-iteration figures, the ledger check, the wasted compute by cause."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .joining import joining_report
from ...protocol.pipeline import MbStatus
from .setting import IDEAL_MB_S


@dataclass
class IterStats:
    opened: dict[str, float] = field(default_factory=dict)
    closed: dict[str, float] = field(default_factory=dict)
    compute_s: float = 0.0
    transfer_s: float = 0.0
    lost_contrib: int = 0
    lost_contrib_s: float = 0.0




class Reporting:
    """Part of `TrainSim` (driver.py): one mechanism of the simulator, see the module docstring."""

    def waste_breakdown(self, iterations: int) -> dict[str, float]:
        """Wasted compute (seconds, summed over the closed iterations) by cause; needs `trace`.

        Matches `report`'s wasted compute: a completed microbatch's useful work is one forward (or
        recompute) and one backward per stage on its final path plus its data node's forward, loss and
        final; everything else is waste, put in: `deferred` (work on microbatches deferred),
        `lost_in_crash` (off the final path, done by a relay that crashed before the microbatch completed: the
        work died with it, and the crash is why the final path does not hold it), `off_path_crashed_later` (off
        the final path, done by a relay that crashed only after the microbatch completed: it was abandoned for
        another reason, as `off_path_live`), `off_path_live` (off the final path on a relay still alive:
        abandoned attempts and branches),
        `repeated_on_path` (a relay of the final path doing its stage again: restarts),
        `data_node` (a data node's repeated work: restarts)."""
        if self.trace is None:
            raise ValueError("set `trace` to a list before `run`")
        paths = {e[2]: e[3] for e in self.trace if e[0] == "path"}
        done_at = {e[2]: e[1] for e in self.trace if e[0] == "path"}
        crashed = {n: t for t, n in self.crashes}
        out = dict.fromkeys(("deferred", "lost_in_crash", "off_path_crashed_later", "off_path_live",
                             "repeated_on_path", "data_node"), 0.0)
        seen: set = set()
        for e in self.trace:
            if e[0] != "compute" or e[4] == "aggregate" or e[5][2] >= iterations:
                continue
            _, _, _, node, kind, key, dur = e
            if key not in paths:
                out["deferred"] += dur
                continue
            if node in self.data:
                u = (key, node, kind)
                cause = "data_node"
            elif paths[key][self.stage[node]] == node:
                u = (key, node, "bwd" if kind == "backward" else "fwd")
                cause = "repeated_on_path"
            else:
                u = None
                if node not in crashed:
                    cause = "off_path_live"
                else:
                    cause = "lost_in_crash" if crashed[node] < done_at[key] else "off_path_crashed_later"
            if u is not None and u not in seen:
                seen.add(u)
                continue
            out[cause] += dur
        return out

    def ledger_check(self, iterations: int) -> tuple[int, int, int]:
        """(lost, deferred, completed twice) over the closed iterations."""
        lost = deferred = twice = 0
        for d in self.data:
            led = self.nodes[d].rec.ledger
            for it, row in led.entries.items():
                if it >= iterations or it >= self.data_crashed.get(d, math.inf):
                    continue  # (a crashed data node's open iteration died with it, its ledger too)
                for st in row.values():
                    if st in (MbStatus.PENDING, MbStatus.INFLIGHT):
                        lost += 1
                    elif st is MbStatus.DEFERRED:
                        deferred += 1
            done = led.completed_everywhere()
            twice += len(done) - len(set(done))
        return lost, deferred, twice

    def report(self, iterations: int) -> dict:
        per = []
        for it in range(iterations):
            st = self.iters.get(it)
            completed = sum(self.nodes[d].rec.ledger.counts(it)["completed"] for d in self.data
                            if self.data_crashed.get(d, math.inf) > it)
            alive = [d for d in self.data if self.data_crashed.get(d, math.inf) > it]
            if st is None or any(d not in st.closed for d in alive):
                per.append({"iteration": it, "finished": False, "completed": completed})
                continue
            dur = max(st.closed[d] - st.opened[d] for d in alive)
            useful = completed * IDEAL_MB_S
            per.append({
                "iteration": it, "finished": True, "completed": completed, "iteration_s": dur,
                "time_per_microbatch_s": dur / completed if completed else math.inf,
                "communication_time_s": st.transfer_s / completed if completed else st.transfer_s,
                "wasted_compute_s": max(0.0, st.compute_s - useful),
                "lost_contributions": st.lost_contrib,
                "lost_contribution_compute_s": st.lost_contrib_s,
            })
        lost, deferred, twice = self.ledger_check(iterations)
        unfinished = sum(1 for p in per if not p["finished"])
        fin = [p for p in per if p["finished"]]

        def mean(k: str) -> float:
            vals = [p[k] for p in fin if math.isfinite(p[k])]
            return statistics.fmean(vals) if vals else math.nan

        stats = {k: 0 for k in ("reroutes", "denies_sent", "deferred", "probes", "recovers", "resends", "restarts",
                                "gave_up", "presumed_dead", "stale")}
        for n in self.nodes.values():
            for k in stats:
                stats[k] += getattr(n.rec.stats, k)
        phase_stats = {"resent": 0, "duplicates": 0, "refused_not_leading": 0, "out_of_step": 0, "signals": 0}
        groups = {"group_ids_sent": "group_ids_sent", "groups_by_digest": "by_digest", "groups_missing": "missing"}
        for n in self.nodes.values():
            for k in phase_stats:
                phase_stats[k] += getattr(n.phases.stats, k)
        for k, stat in groups.items():  # BEGIN's groups (protocol/phasegroups.py)
            phase_stats[k] = sum(getattr(n.phases.digests.stats, stat) for n in self.nodes.values())
        phase_stats.update(elections=self.elections, resyncs=self.resyncs, dropped=self.dropped)
        return {
            "setting": self.setting.name, "policy": self.options.policy, "churn": self.options.churn, "seed": self.options.seed,
            "iterations": iterations,
            "time_per_microbatch_s": mean("time_per_microbatch_s"),
            "throughput_per_iteration": statistics.fmean([p["completed"] for p in per]) if per else 0.0,
            "communication_time_s": mean("communication_time_s"),
            "wasted_compute_s": mean("wasted_compute_s"),
            "lost_microbatches": lost + twice + unfinished * 0,
            "unfinished_iterations": unfinished,
            "deferred_microbatches": deferred,
            "lost_contributions": sum(p.get("lost_contributions", 0) for p in fin),
            "lost_contribution_compute_s": mean("lost_contribution_compute_s"),
            "crashes": len(self.crashes), "spared": self.spared, "joins": self.joins, "joining": joining_report(self), "routing": self.routing,
            "flow_messages": self.flow_messages,
            "protocol": stats,
            "phases": phase_stats,
            "per_iteration": per,
        }

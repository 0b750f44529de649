"""DT-FM's schedule executed by the training simulator (`sim train --routing dtfm`).

`dtfm_routing(setting, seed)` runs the scheduler on the setting's devices
(every pair's latency and bandwidth from its `Net`), moves every relay to
the stage DT-FM gave it (renamed `s<stage>r<i>`, same location, same
capacity) and returns the re-staged setting with the flows of its pipelines:
MICROBATCHES units along each pipeline, each data node on its own.  The
simulator then runs GWTF's microbatch machine along those fixed flows (its
hop deadlines, resends and repair rounds), with no flow machine and no
lending: a GPipe-like static routing.

Churn: DT-FM cannot reschedule without a global recomputation.  The
simulator models it as a recomputation after each membership change (a
crash reported by the membership layer, a joiner), taking effect `delay_s`
later: the CPU time the scheduler took for the initial schedule of this
swarm.  What it installs keeps every relay in its stage (moving one means
downloading a stage's weights and optimizer state mid-run): the pipelines
re-formed over the live relays (`pipelines.repin`), as many as the thinnest
stage allows, their units shared among the live data nodes.  That favours
DT-FM (no weight moves); the full search's CPU time is still what the run
waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..train.setting import ACTIVATION_MB, MICROBATCHES, Setting, restage
from .pipelines import flows_of, repin
from .problems import Schedule, instance_from_setting, opfence_schedule, schedule


@dataclass
class DtfmRouting:
    """The simulator's view of a DT-FM schedule: the re-staged setting, its flows, the recomputation."""

    schedule: Schedule
    setting: Setting
    flows: dict
    delay_s: float
    recomputations: int = 0

    def hop_s(self, a: str, b: str) -> float:
        """2 (alpha + c_pp / beta) between two nodes, both directions averaged (the cost model's hop)."""
        (la, ba), (lb, bb) = self.setting.net.link(a, b), self.setting.net.link(b, a)
        return 2.0 * ((la + lb) / 2000.0 + ACTIVATION_MB / ((ba + bb) / 2.0 / 8.0))

    def reflows(self, members: dict[str, tuple[int, int]], data: tuple[str, ...], stages: int) -> dict:
        """The flows after a recomputation over the live `members` (id -> (stage, capacity)) and data nodes."""
        self.recomputations += 1
        groups = [sorted(r for r, (s, _) in members.items() if s == k) for k in range(stages)]
        pipes = repin(self.hop_s, list(data), groups)
        units = min((members[r][1] for _, path in pipes for r in path), default=MICROBATCHES)
        return flows_of(pipes, list(data), min(units, MICROBATCHES))


def dtfm_routing(setting: Setting, seed: int, method: str = "dtfm", place: bool = True, **kw) -> DtfmRouting:
    """Schedule `setting` with DT-FM (`method`, `kw`: population, generations) and re-stage its relays.

    `place=False`: every relay keeps its stage (as in a GWTF run, where a relay's stage is given) and DT-FM
    only forms the pipelines (`pipelines.repin`, its matchings chained stage by stage): the routing half of
    its schedule on GWTF's placement.  The search still runs (its CPU time is the recomputation delay)."""
    sched = schedule(instance_from_setting(setting), method, seed, **kw)
    if not place:
        from ..train.setting import STAGE_SIZES

        out = DtfmRouting(sched, setting, {}, sched.result.cpu_s)
        out.flows = out.reflows(dict(setting.relays), tuple(setting.data), len(STAGE_SIZES))
        out.recomputations = 0
        return out
    staged, rename = restage(setting, [list(g) for g in sched.stages()])
    relays = staged.relays
    pipes = [(d, tuple(rename[r] for r in path)) for d, path in sched.pipelines()]
    units = min([MICROBATCHES] + [relays[r][1] for _, p in pipes for r in p])
    return DtfmRouting(sched, staged, flows_of(pipes, list(setting.data), units), sched.result.cpu_s)


def opfence_placement(setting: Setting, seed: int, **kw) -> tuple[Setting, float]:
    """The setting with every relay in the stage FusionLLM's OP-Fence gives it (`opfence.py`; `kw`: resolution),
    and the scheduler's CPU seconds: GWTF's flows then route over it (`run_train(placement="opfence")`)."""
    sched = opfence_schedule(instance_from_setting(setting), seed, **kw)
    return restage(setting, [list(g) for g in sched.stages()])[0], sched.result.cpu_s

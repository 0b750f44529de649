"""Resume: which state a relay that comes back to its stage starts from.

A relay restarted with its state directory (its peer id is kept,
identity.py) or given `--restore FILE` holds a checkpoint (checkpoints.py):
a stage, the optimizer steps its state holds, and the hash of its parameters
(`StageModel.state_hash()`).  It does not ask the leader for a stage (it is
the same node coming back): it takes the checkpoint's stage (`--stage auto`)
or the stage it is given (`--stage K`, the checkpoint used only if it is of
stage K), says Hello with `joining=True`, and then decides, from what its
peers answer to a hash-only `StageStateRequest` (the state is never moved for
that), which state it takes (`decide`):

* a stage peer is ready: it asks that peer for its steps and parameter hash
  (the peer answers once it has at least the checkpoint's steps).  Equal
  steps and equal hash: it keeps its own state (`Source.OWN`, no download);
  otherwise it downloads the peer's state as a joiner does (`Source.DOWNLOAD`,
  at least the peer's steps).
* no stage peer is ready (the stage is empty, and the run pauses: the data
  nodes open no iteration, microbatches.py): it asks a data node for the
  steps the stage's state holds in the run (an iteration whose aggregation
  found the stage empty does not move it) and for the run's step.  Its state
  holds the stage's steps: it keeps it (`Source.OWN`) and takes part from the
  run's step on, nothing is lost.  Its state is older (or newer) than the
  stage's: it waits (`Source.WAIT`, said in the log and status.json) for a
  node holding the stage's state, unless the run manifest allows
  `recovery.empty_stage = "restart_from_checkpoint"`: then the relay holding
  the newest checkpoint among those coming back to the stage (their Hellos
  say their steps) resumes the stage from it (`Source.STALE_RESTART`), the log
  says how many of that stage's steps are lost, and the others wait for it
  and download its state.

Until it has decided, its state is settled for no iteration (`phases.NOT_READY`): a BEGIN AGGREGATION
that names it (from a leader that has not yet heard its Hello: a relay killed and back within seconds) finds
it out of step, so it takes part in its stage's all-reduce with nothing and does not step, and the state it
then takes must hold that step (`want`: it downloads it even if its own state equalled its peer's).

What is covered: a stage emptied by crashes or leaves, brought back by a
relay with a checkpoint of the stage's current state (exact: the run goes on
as if the stage had sat out the iterations it missed), or from an older
checkpoint if the owner allows it (the steps in between are lost for that
stage only; the other stages keep theirs).  What is not: two relays of an
empty stage coming back with different checkpoints of the same steps (the
first one ready is taken, the second then compares with it and downloads),
a stale checkpoint on a node that does not come back to the stage, and a
stage whose state nobody holds any more (no checkpoint anywhere): the run
waits.

`decide` is pure: it is handed what the node holds and what its peers said,
and returns a `Decision`; `Joining.resume` (joining.py) asks the peers and
carries the decision out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...model.manifest import EmptyStage


class Source(enum.Enum):
    OWN = "own"  # keep the state loaded from the checkpoint (with `steps` applied)
    DOWNLOAD = "download"  # fetch the state of stage peer `peer`, with at least `steps` applied
    WAIT = "wait"  # not yet: ask again later (`reason` says why)
    STALE_RESTART = "stale_restart"  # an empty stage resumed from an older checkpoint: `lost` steps are lost


@dataclass(frozen=True)
class Held:
    """The state this relay holds now: optimizer steps applied and its parameter hash."""

    steps: int
    params_sha256: str


@dataclass(frozen=True)
class PeerAnswer:
    """A ready stage peer's answer to a hash-only request: its steps and parameter hash."""

    peer: str
    steps: int
    params_sha256: str


@dataclass(frozen=True)
class RunAnswer:
    """A data node's answer to a hash-only request: the steps the stage holds in the run, the first iteration a
    state installed now takes part in (the run's step), and whether the stage has no ready relay."""

    stage_steps: int
    run_steps: int
    stage_empty: bool = True  # the data node knows no ready relay of the stage


@dataclass(frozen=True)
class Decision:
    source: Source
    steps: int = 0  # OWN / STALE_RESTART: the steps to count the state as; DOWNLOAD: the fewest to accept
    peer: str = ""  # DOWNLOAD: from whom
    lost: int = 0  # STALE_RESTART: optimizer steps of the stage that are lost
    reason: str = ""


def decide(stage: int, held: Held | None, *, peer: PeerAnswer | None, run: RunAnswer | None,
           empty_stage: EmptyStage = EmptyStage.WAIT, me: str = "",
           rivals: dict[str, int] | None = None, want: int = 0) -> Decision:
    """Which state a relay coming back to `stage` takes (module doc).

    `held`: its own state (None: no checkpoint); `peer`: a ready stage peer's
    answer (None: no stage peer is ready); `run`: a data node's answer (None:
    none yet); `empty_stage`: the manifest's choice for a stale checkpoint in
    an empty stage; `rivals`: the other relays coming back to the stage
    (joining, not ready) and the steps their Hello says they hold, so that of
    several stale checkpoints the newest restarts the stage (ties: the lowest
    peer id, `me` being this node's) and the others then download from it.
    `want`: the fewest steps its state must hold (a BEGIN AGGREGATION named it while it decided: it sat that
    step out, so its own state, even one equal to the peer's when the peer answered, is behind).
    """
    if peer is not None:
        if (held is not None and held.steps == peer.steps and held.params_sha256 == peer.params_sha256
                and held.steps >= want):
            return Decision(Source.OWN, held.steps, reason=f"its state equals stage peer {peer.peer[:16]}'s "
                                                           f"after {held.steps} steps")
        why = ("no checkpoint" if held is None else
               f"checkpoint after {held.steps} steps, the stage peer has {peer.steps}" if held.steps != peer.steps
               else f"checkpoint after {held.steps} steps has other parameters than the stage peer's"
               if held.params_sha256 != peer.params_sha256
               else f"the aggregation of iteration {want - 1} named this node while it decided: it sat it out")
        return Decision(Source.DOWNLOAD, max(peer.steps, want), peer=peer.peer, reason=why)
    if run is None:
        return Decision(Source.WAIT, reason=f"stage {stage} has no ready relay and no data node answered yet")
    if not run.stage_empty:
        return Decision(Source.WAIT, reason=f"stage {stage} has a ready relay this node has not heard from yet")
    if held is None:
        return Decision(Source.WAIT, reason=f"stage {stage} is empty and this node holds no checkpoint of it")
    if held.steps == run.stage_steps:
        return Decision(Source.OWN, run.run_steps,
                        reason=f"stage {stage} is empty and its state in the run holds {run.stage_steps} steps, "
                               f"as does this checkpoint")
    if empty_stage is EmptyStage.RESTART_FROM_CHECKPOINT:
        newer = sorted((-steps, p) for p, steps in (rivals or {}).items()
                       if steps > held.steps or (steps == held.steps and steps > 0 and p < me))
        if newer:
            steps, p = -newer[0][0], newer[0][1]
            return Decision(Source.WAIT, reason=(
                f"stage {stage} is empty and relay {p[:16]} coming back holds a newer checkpoint ({steps} steps, "
                f"this one {held.steps}): it restarts the stage, then this node downloads from it"))
        return Decision(Source.STALE_RESTART, run.run_steps, lost=max(0, run.stage_steps - held.steps),
                        reason=f"stage {stage} is empty; its state in the run held {run.stage_steps} steps, this "
                               f"checkpoint {held.steps}; the manifest allows restarting from the checkpoint")
    return Decision(Source.WAIT, reason=(
        f"stage {stage} is empty and its state in the run holds {run.stage_steps} steps, this checkpoint "
        f"{held.steps}: waiting for a node with that state (--restore FILE), or set "
        f'"recovery": {{"empty_stage": "restart_from_checkpoint"}} in the run manifest to resume from it'))

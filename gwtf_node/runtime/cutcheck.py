"""A relay back from a partition at its stage's step: its part checked against a stage peer's, fetched if it differs.

A relay cut off from every data node for a while (a partition: it presumed
them dead, they presumed it dead) comes back in one of two ways:

* its stage stepped on without it: a Hello says more steps than it holds,
  and it fetches the state after them (`Joining.catch_up`);
* its stage did not step (the cut fell within one iteration's pipeline, or
  the run paused): it holds as many steps as its stage peers, but not
  necessarily the same parameters.  A cut in the middle of an aggregation
  can leave it stepping on the contributions it held alone (its all-reduce
  gave up on the peers it presumed dead) while they stepped without them.

So when a stage peer it had presumed dead is back, says the same number of
steps, and this node was without any data node since (`Liveness.cut_off_since`:
it was the one cut off), it asks that peer for the hash of its part at those
steps (a hash-only `StageStateRequest`, as a restarted relay does: resume.py)
and compares it with its own.  Equal: nothing to do (logged).  Different: the
peer, which stayed with the run, holds the run's state: this node fetches it
(`Joining.fetch_state`) and takes part again from the next aggregation.  The
peer that was not cut off does not check: the cut-off one does, so exactly
one side acts.  A partition between two stage peers that both kept a data
node is not checked (neither knows which one holds the run's state).

`verdict` is the pure decision; status.json `cut_checks` lists the last few.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from ..protocol import messages as m
from .peers import PeerInfo

log = logging.getLogger("gwtf.node")

KEEP_CHECKS = 8  # the checks status.json shows


class Verdict(enum.Enum):
    SAME = "same"  # the parameters are the peer's: nothing to do
    FETCH = "fetch"  # they differ: this node takes the peer's state
    UNCOMPARABLE = "uncomparable"  # no answer, or the peer stepped meanwhile (its next Hello or BEGIN tells)


def verdict(mine: tuple[int, str], theirs: tuple[int, str] | None) -> Verdict:
    """Compare (steps, parameter hash) of this node and of the peer's answer (None: it did not answer)."""
    if theirs is None or theirs[0] != mine[0]:
        return Verdict.UNCOMPARABLE
    return Verdict.SAME if theirs[1] == mine[1] else Verdict.FETCH


class CutCheck:
    def __init__(self, wire: Any, peers: Any, stage: Any, liveness: Any, joining: Any) -> None:
        self.wire = wire
        self.peers = peers
        self.stage = stage
        self.liveness = liveness
        self.joining = joining
        self.checks: list[dict] = []  # status.json `cut_checks`
        self._checking: set[str] = set()

    def peer_back(self, info: PeerInfo, dead_since: float | None) -> None:
        """`info` said Hello after this node had presumed it dead at `dead_since` (module doc)."""
        if dead_since is None or self.peers.role != "relay" or self.peers.stage is None \
                or self.peers.place.joining or not self.stage.built:
            return
        if info.role != "relay" or info.stage != self.peers.stage or info.joining or info.leaving:
            return
        if info.steps != self.stage.applied_steps or info.peer_id in self._checking:
            return  # (behind: catch_up; one step apart: the aggregation in flight settles it)
        if not self.liveness.cut_off_since(dead_since):
            return  # the peer was the one cut off: it checks against this node
        self.wire.spawn(self._check, info.peer_id)

    async def _check(self, peer: str) -> None:
        self._checking.add(peer)
        try:
            mine = await self.stage.run(lambda: (self.stage.applied_steps, self.stage.model.state_hash()))
            steps = mine[0]
            ans = await self.joining.ask_hash(peer, m.StageStateRequest(self.peers.stage, steps, hash_only=True))
            theirs = None if ans is None else (ans.iteration, ans.params_sha256)
            v = verdict(mine, theirs)
            who = self.peers.who(peer)
            self.checks = (self.checks + [{"peer": who, "steps": steps, "verdict": v.value}])[-KEEP_CHECKS:]
            if v is Verdict.SAME:
                log.info("back from a cut: stage %d's parameters at %d steps are %s's (checked)", self.peers.stage,
                         steps, who)
            elif v is Verdict.UNCOMPARABLE:
                log.info("back from a cut: the parameters could not be checked against %s (%s)", who,
                         "no answer" if theirs is None else f"it answered at {theirs[0]} steps, this node has {steps}")
            else:
                log.warning("back from a cut: stage %d's parameters at %d steps differ from %s's (%s, mine %s): "
                            "fetching its state", self.peers.stage, steps, who, theirs[1][:12], mine[1][:12])
                await self.joining.fetch_state(peer, steps)
        finally:
            self._checking.discard(peer)

"""Stage copies compared: after a step summed without a named member, and when a stage peer comes back.

The copies of a stage part ways when two of its members sum an iteration in
different rounds (protocol/roundcheck.py says how, and which copy is kept).
This component finds it out and repairs it, in two situations:

* **A step that left a member out.**  The relay's round summed without a
  member that BEGIN AGGREGATION named (one it forgot since the round began,
  or the round gave up on it: aggregation.py).  If that member is alive it
  may have stepped in a round of its own.  The relay asks it, for up to
  `patience_s` (the longest the member can take to give up and step alone:
  the all-reduce timeout plus the wait for a new group, aggregation.py), for
  its steps, parameter hash and round records (a hash-only
  `StageStateRequest`), until both hold the same number of steps.
* **A stage peer back at this node's step** after this node presumed it
  dead (a partition, or a false alarm under load): the same question, once
  both hold the same number of steps (for up to PEER_BACK_PATIENCE_S).  A
  peer back with more steps is `Joining.catch_up`'s; one step apart, the
  aggregation in flight settles it.

`roundcheck.decide` then says SAME (nothing to do), KEEP (the peer downloads
this copy: its own check says YIELD) or YIELD: this node downloads the
peer's state (`Joining.fetch_state`) and takes part again from the next
aggregation.  Where no record tells the copies apart, the node that was
without any data node since it presumed the peer dead (`Liveness.
cut_off_since`: it was the one away from the run) yields, and the other
keeps.  Each check is logged; status.json `cut_checks` lists the last few.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ...protocol import messages as m
from ...protocol.roundcheck import Copy, Verdict, decide, from_records
from ..net.peers import PeerInfo
from ..net.wire import now

log = logging.getLogger("gwtf.node")

KEEP_CHECKS = 8  # the checks status.json shows
PEER_BACK_PATIENCE_S = 30.0  # a peer back at this node's step: how long to wait for the same steps on both sides
RETRY_S = 1.0  # between two questions while the steps differ or the peer does not answer


class CutCheck:
    def __init__(self, wire: Any, peers: Any, stage: Any, liveness: Any, joining: Any,
                 rounds: Any = lambda: {}) -> None:
        self.wire = wire
        self.peers = peers
        self.stage = stage
        self.liveness = liveness
        self.joining = joining
        self.rounds = rounds  # () -> this node's round records by steps (Aggregation.rounds)
        self.checks: list[dict] = []  # status.json `cut_checks`
        self._checking: set[str] = set()

    def _comparable(self) -> bool:
        return (self.peers.role == "relay" and self.peers.stage is not None and not self.peers.place.joining
                and self.stage.built)

    def peer_back(self, info: PeerInfo, dead_since: float | None) -> None:
        """`info` said Hello after this node had presumed it dead at `dead_since` (module doc)."""
        if dead_since is None or not self._comparable():
            return
        if info.role != "relay" or info.stage != self.peers.stage or info.joining or info.leaving:
            return
        if info.steps != self.stage.applied_steps or info.peer_id in self._checking:
            return  # (behind: catch_up; one step apart: the aggregation in flight settles it)
        cut_off = bool(self.liveness.cut_off_since(dead_since))
        self.wire.spawn(self._check, info.peer_id, cut_off, PEER_BACK_PATIENCE_S)

    def parted(self, iteration: int, left_out: list[str], patience_s: float) -> None:
        """This relay stepped `iteration` in a round without `left_out`, members its BEGIN named (module doc)."""
        if not self._comparable():
            return
        for peer in left_out:
            if peer not in self._checking and peer in self.peers:
                log.info("iteration %d: summed without %s: comparing the parameters with it", iteration,
                         self.peers.who(peer))
                self.wire.spawn(self._check, peer, False, patience_s)

    async def _check(self, peer: str, cut_off: bool, patience_s: float) -> None:
        if peer in self._checking:
            return
        self._checking.add(peer)
        try:
            await self._compare(peer, cut_off, patience_s)
        finally:
            self._checking.discard(peer)

    async def _compare(self, peer: str, cut_off: bool, patience_s: float) -> None:
        who = self.peers.who(peer)
        fallback = Verdict.YIELD if cut_off else Verdict.KEEP
        deadline = now() + patience_s
        said = "no answer"
        while True:
            if peer not in self.peers or self.peers.is_gone(peer) or not self._comparable():
                return  # (gone: its return brings it here again; joining: this node takes a state anyway)
            if self.peers.get(peer).joining:
                log.info("%s takes a stage state from a member: nothing to compare", who)
                return
            steps = self.stage.applied_steps
            ans = await self.joining.ask_hash(peer, m.StageStateRequest(self.peers.stage, steps, hash_only=True))
            if ans is not None and ans.iteration != self.stage.applied_steps:
                said = f"it answered at {ans.iteration} steps, this node has {self.stage.applied_steps}"
            elif ans is not None:  # (the same steps: hash this copy too; a part of a large model takes a second)
                mine = await self.stage.run(lambda: (self.stage.applied_steps, self.stage.model.state_hash()))
                rounds = {s: r for s, r in dict(self.rounds()).items() if s <= mine[0]}
                v, at = decide(Copy(mine[0], mine[1], rounds),
                               Copy(ans.iteration, ans.params_sha256, from_records(ans.rounds)), fallback)
                if v is not Verdict.WAIT:
                    self._act(peer, v, at, mine, ans)
                    if v is Verdict.YIELD:
                        await self.joining.fetch_state(peer, mine[0])
                    return
                said = f"it answered at {ans.iteration} steps, this node has {mine[0]}"
            if now() + RETRY_S > deadline:
                break
            await trio.sleep(RETRY_S)
        self._note(who, self.stage.applied_steps, "uncomparable")
        log.info("the parameters could not be compared with %s (%s)", who, said)

    def _act(self, peer: str, v: Verdict, at: int | None, mine: tuple[int, str], ans: m.StageState) -> None:
        who, steps, stage = self.peers.who(peer), mine[0], self.peers.stage
        where = f"parted at {at} steps" if at is not None else "no record tells where they parted"
        if v is Verdict.SAME:
            self._note(who, steps, "same")
            log.info("stage %d's parameters at %d steps are %s's (checked)", stage, steps, who)
        elif v is Verdict.KEEP:
            self._note(who, steps, "keep")
            log.warning("stage %d's parameters at %d steps differ from %s's (%s): this copy is kept, %s takes it",
                        stage, steps, who, where, who)
        else:
            self._note(who, steps, "fetch")
            log.warning("stage %d's parameters at %d steps differ from %s's (%s, theirs %s, mine %s): fetching its "
                        "state", stage, steps, who, where, ans.params_sha256[:12], mine[1][:12])

    def _note(self, who: str, steps: int, verdict: str) -> None:
        self.checks = (self.checks + [{"peer": who, "steps": steps, "verdict": verdict}])[-KEEP_CHECKS:]

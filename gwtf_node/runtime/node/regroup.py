"""Who sums a stage's gradients: the rounds of the all-reduce among the survivors of the members BEGIN named.

A stage's all-reduce runs among the members BEGIN AGGREGATION named that
this node holds alive; the round's key names its group (a digest of the
sorted peer ids), so peers only meet on the same group.  If a member dies
meanwhile, the round is cancelled and redone among the survivors; a member
that restarted (a new incarnation) stays out even once it is back, and also
when its new incarnation, which never got this node's Hello, is forgotten
and taken back once more as it is (a false forgetting after a true one): its
contributions died with the old process, and are counted in
`lost_contributions` (the survivors' mean: they are not trained again).

A false death is not a crash.  Each node decides for itself who is dead
(liveness.py), and on a saturated machine a member can be presumed dead by
some of its stage-mates while it computes on, its frames lost on a broken
connection: it comes back within seconds with the same incarnation and the
contributions it held ("forgot us": both ends forget each other and take
each other back, discovery.py).  Were that enough to leave it out, the
members would split into rounds with different groups (those that noticed,
those that did not, and the member itself, which forgot those that forgot
it), each round waiting for parts that never come until the all-reduce's
timeout (minutes), then stepping apart.  So:

* a member presumed dead (not one that said Goodbye, restarted or was
  banned) keeps its place in a round in flight for `REJOIN_GRACE_S`: the
  round is cancelled only if it is not back by then with its incarnation;
* a member back with its incarnation counts as never forgotten, in the
  round in flight and in the next ones; a round redone without it (it
  came back after the grace) is redone again with it, as it does on its
  side (a round cancelled for a member gone or back is not a failed
  group: only a round that fails on its own waits GROUP_CHANGE_WAIT_S
  before its group is tried again);
* a round about to start waits, up to the same grace, for a member of
  `named` presumed dead shortly before (the daemon hands it BEGIN's group
  as the leader sent it, `Phases.named_group`, so also for one presumed
  dead here just before BEGIN arrived), and for one this node has not heard
  of yet (its Hello on the way).

A crash costs the survivors at most `REJOIN_GRACE_S` more before they redo
the round without the member.  When the views still differ (a member gone
for longer than the grace and back), the rounds differ as before: the
all-reduce's timeout ends them, and after a step that left out a member
BEGIN named, the members compare their parameters (cutcheck.py).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Callable

import trio

from ..net.peers import Peers
from ..net.wire import now

log = logging.getLogger("gwtf.node")

REJOIN_GRACE_S = 15.0  # a member presumed dead keeps its place this long: back with its incarnation, it stays in
GROUP_CHANGE_WAIT_S = 60.0  # a group whose round failed is tried again only once another group was possible
POLL_S = 0.2


class Regroup:
    """The survivors' rounds of one node: who was forgotten when, who is back as it was, the rounds in flight."""

    def __init__(self, me: str, peers: Peers) -> None:
        self.me = me
        self.peers = peers
        self.forgotten: dict[str, int] = {}  # peer -> times it was forgotten
        self.voided: dict[str, int] = {}  # peer -> its forgettings up to this count were false (back as it was)
        self.forgot_at: dict[str, float] = {}  # peer -> when it was last presumed dead
        self.real: dict[str, int] = {}  # peer -> its forgettings up to this count include a true one (left, restarted)
        # round key -> (its group, its scope, the members BEGIN named, `forgotten` when the all-reduce began)
        self.scopes: dict[str, tuple[set[str], trio.CancelScope, set[str], dict[str, int]]] = {}

    # ------------------------------------------------------------------ news of the peers
    def forget(self, peer: str, *, presumed: bool) -> None:
        """`peer` is forgotten (`presumed`: presumed dead, so maybe alive; else it left, restarted or was banned)."""
        self.forgotten[peer] = self.forgotten.get(peer, 0) + 1
        if presumed:
            self.forgot_at[peer] = now()
        else:
            self.forgot_at.pop(peer, None)
            self.real[peer] = self.forgotten[peer]

    def returned(self, peer: str, *, same_incarnation: bool) -> None:
        """`peer` is back; with its incarnation, it held on to its contributions: its forgettings are void."""
        if same_incarnation and peer in self.forgot_at:
            self.voided[peer] = self.forgotten.get(peer, 0)
            self.forgot_at.pop(peer, None)
        if same_incarnation:
            for gkey, (group, scope, named, since) in list(self.scopes.items()):
                if peer in named and peer not in group and self._back_for(peer, since):
                    log.info("all-reduce %s left out %s, which is back as it was: redone with it", gkey,
                             self.peers.who(peer))
                    scope.cancel()

    def after_gone(self, peer: str, spawn: Callable) -> None:
        """Cancel the rounds waiting for `peer`: at once if it left or restarted, after the grace if it is only
        presumed dead and not back as it was by then."""
        for gkey, (group, scope, _named, _since) in list(self.scopes.items()):
            if peer not in group:
                continue
            if peer in self.forgot_at:
                spawn(self._cancel_unless_back, peer, gkey, scope)
            else:
                log.info("all-reduce %s waits for %s, which is gone: redone among the survivors", gkey,
                         self.peers.who(peer))
                scope.cancel()

    async def _cancel_unless_back(self, peer: str, gkey: str, scope: trio.CancelScope) -> None:
        await trio.sleep(max(0.0, self.forgot_at.get(peer, now()) + REJOIN_GRACE_S - now()))
        if not self.is_back(peer) and gkey in self.scopes:
            log.info("all-reduce %s waits for %s, presumed dead and not back within %.0f s: redone among the "
                     "survivors", gkey, self.peers.who(peer), REJOIN_GRACE_S)
            scope.cancel()

    def is_back(self, peer: str) -> bool:
        """`peer` is known alive and every forgetting of it since the last true one (it left or restarted) was
        false."""
        return (peer in self.peers and not self.peers.is_gone(peer)
                and self.voided.get(peer, -1) == self.forgotten.get(peer, 0))

    def _back_for(self, peer: str, since: dict[str, int]) -> bool:
        """`peer` is back as it was, and no true forgetting of it came since `since`: what it held then did not
        die (a restart's new incarnation that forgot us, and was forgotten and taken back as it is, is back only
        for the rounds begun after that restart)."""
        return self.is_back(peer) and self.real.get(peer, 0) <= since.get(peer, 0)

    def alive(self, named: list[str], since: dict[str, int]) -> list[str]:
        """The members of `named` this node holds alive and not forgotten since `since` (a copy of `forgotten`)
        unless falsely."""
        return sorted(p for p in named if p == self.me or (
            p in self.peers and not self.peers.is_gone(p)
            and (self.forgotten.get(p, 0) == since.get(p, 0) or self._back_for(p, since))))

    async def wait_for_presumed(self, named: list[str], since: dict[str, int]) -> None:
        """Before a round: wait, up to the grace since each was presumed dead, for named members that are; and up
        to the grace from now for named members this node has not heard of yet (their Hello on its way: a swarm
        whose flows formed before every relay had met its stage-mates)."""
        start = now()
        while True:
            pending = [self.forgot_at[p] for p in named if p in self.forgot_at and p not in self.alive(named, since)]
            pending += [start for p in named if p != self.me and p not in self.peers and p not in self.forgotten]
            ends = [t + REJOIN_GRACE_S for t in pending if t + REJOIN_GRACE_S > now()]
            if not ends:
                return
            await trio.sleep(min(POLL_S, max(ends) - now()))

    # ------------------------------------------------------------------ the rounds
    async def all_reduce(self, base: str, named: list[str], run_round: Callable,
                         on_round: Callable[[str], None] = lambda gkey: None):
        """Rounds of `run_round(gkey, group)` among the survivors of `named` until one sums: (its result, the key
        of the round that summed, its members).  `on_round(key)` is called before each round.  A group whose
        round failed is tried again only after GROUP_CHANGE_WAIT_S without another group; then this node steps
        on its own (`run_round` returns None for a group of one: the caller's own contribution)."""
        from .allreduce import AllReduceError, all_reduce_failure, leaf

        since = dict(self.forgotten)
        tried: set[str] = set()
        await self.wait_for_presumed(named, since)
        while True:
            group = self.alive(named, since)
            gkey = f"{base}/{hashlib.sha256(','.join(group).encode()).hexdigest()[:12]}"
            if gkey in tried:
                deadline = now() + GROUP_CHANGE_WAIT_S
                while now() < deadline:
                    await trio.sleep(POLL_S)
                    if self.alive(named, since) != group:
                        break
                else:
                    log.error("all-reduce %s failed again with the same group: stepping on this node's gradient only",
                              base)
                    on_round(f"{base}/alone")
                    return None, f"{base}/alone", [self.me]
                continue
            tried.add(gkey)
            on_round(gkey)
            if len(group) == 1:
                return None, gkey, group
            with trio.CancelScope() as scope:
                self.scopes[gkey] = (set(group), scope, set(named), since)
                try:
                    return await run_round(gkey, group), gkey, group
                except Exception as e:  # noqa: BLE001 - AllReduceError, alone or in a nursery's group
                    if not all_reduce_failure(e, AllReduceError):
                        raise
                    log.warning("all-reduce %s failed: %s", gkey, leaf(e))
                finally:
                    self.scopes.pop(gkey, None)
            if scope.cancelled_caught:  # cancelled for a member gone or back: not a failure of that group
                tried.discard(gkey)
            await trio.sleep(POLL_S)

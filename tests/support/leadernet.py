"""The harness of the election tests (test_leader.py, test_voters.py): leader machines in the simulator.

`LeaderNet` keeps the machines, drops messages across a partition or a cut
link (at send and at delivery), loses and duplicates them at the rates it is
given, and checks the safety invariants after *every* event of a run: at most
one node acting as leader at any instant (a crashed incarnation in `ghosts`
counts until its lease ends), and never two nodes acting as leader of the
same term.  A subclass builds the machines (`machines[nid]`, then
`sim.add(nid, Wrapped(self, nid))`).  Runs are pure functions of their seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gwtf_node.protocol.effects import Send
from gwtf_node.protocol.leader import LeaderMachine
from gwtf_node.sim.engine import Simulator

LEASE_S, ET_S, HB_S = 2.0, (2.5, 4.0), 0.5
MAX_DELAY_S = 0.05  # delta: the largest one-way delay of the simulated links


def takeover_bound_s(rounds: int = 1, delta: float = MAX_DELAY_S) -> float:
    """leader.py's liveness bound after the leader vanishes, `rounds` election rounds."""
    return delta + rounds * (ET_S[1] + 4 * delta)


class LeaderNet:
    def __init__(self, everyone: list[str], seed: int, loss: float = 0.0, dup: float = 0.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.loss, self.dup = loss, dup
        delays = {(a, b): self.rng.uniform(0.005, MAX_DELAY_S) for a in everyone for b in everyone}
        self.sim = Simulator(lambda a, b: delays.get((a, b)))  # nodes added later: the fallback delay
        self.groups: list[set[str]] | None = None
        self.cut_links: set[frozenset[str]] = set()  # single links down (non-transitive partitions)
        self.machines: dict[str, LeaderMachine] = {}
        self.ghosts: list[LeaderMachine] = []  # crashed incarnations: checked until their lease ends
        self.leader_of_term: dict[int, str] = {}
        self.acting_log: list[tuple[float, str, int]] = []  # (first time seen acting, node, term)

    # ---- partitions ----

    def partition(self, *groups: set[str]) -> None:
        self.groups = [set(g) for g in groups]

    def heal(self) -> None:
        self.groups = None
        self.cut_links = set()

    def cut(self, a: str, b: str) -> bool:
        if a == b:
            return False
        if frozenset((a, b)) in self.cut_links:
            return True
        if self.groups is None:
            return False
        side = {n: i for i, g in enumerate(self.groups) for n in g}  # a node in no group is isolated
        return a not in side or b not in side or side[a] != side[b]

    # ---- invariants ----

    def check(self, now: float) -> None:
        acting = [(n, m.term) for n, m in self.machines.items() if m.is_leader(now)]
        acting += [(g.id, g.term) for g in self.ghosts if g.is_leader(now)]
        assert len(acting) <= 1, f"two leaders acting at t={now:.3f}: {acting}"
        for n, term in acting:
            holder = self.leader_of_term.setdefault(term, n)
            assert holder == n, f"term {term} has two leaders: {holder} and {n}"
            if not self.acting_log or self.acting_log[-1][1:] != (n, term):
                self.acting_log.append((now, n, term))

    # ---- running ----

    def run(self, until: float) -> None:
        self.sim.run_until(until)

    def acting(self, now: float | None = None) -> str | None:
        now = self.sim.now if now is None else now
        found = [n for n, m in self.machines.items() if n not in self.sim.dead and m.is_leader(now)]
        return found[0] if found else None

    def first_acting_after(self, t: float, exclude: str | None = None) -> float | None:
        return next((at for at, n, _ in self.acting_log if at >= t and n != exclude), None)


@dataclass
class Wrapped:
    """The simulator's view of `net.machines[nid]` (replaced on a restart): the net's cuts, losses and checks."""

    net: LeaderNet
    nid: str

    @property
    def m(self) -> LeaderMachine:
        return self.net.machines[self.nid]

    def _out(self, now: float, effects: list) -> list:
        self.net.check(now)
        out = []
        for e in effects:
            if type(e) is Send:
                if self.net.cut(self.nid, e.to) or (self.net.loss and self.net.rng.random() < self.net.loss):
                    continue
                if self.net.dup and self.net.rng.random() < self.net.dup:
                    out.append(e)
            out.append(e)
        return out

    def start(self, now: float) -> list:
        return self._out(now, self.m.start(now))

    def on_timer(self, now: float, key: str) -> list:
        return self._out(now, self.m.on_timer(now, key))

    def on_message(self, now: float, sender: str, msg: object) -> list:
        if self.net.cut(sender, self.nid):
            return []  # the partition began while the message was in flight
        return self._out(now, self.m.on_message(now, sender, msg))


def elect(net: LeaderNet, until: float = 15.0) -> str:
    net.sim.start_all()
    net.run(until)
    leader = net.acting()
    assert leader is not None, "no leader elected"
    return leader

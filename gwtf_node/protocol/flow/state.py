"""Shared vocabulary of the flow machine: tolerances, limits, the kinds of route, request and step, and unit counts.

A node counts, per commodity (the data node a unit returns to), the units it
receives from each upstream peer (`UnitState.inn`, units.py) and sends to each
downstream peer (`UnitState.out`), as plain `dict[str, int]`; `take_one`,
`add_one` and `total` are the only arithmetic on them.  `FlowStats` (the
node's counters) and `Batch` (what one refresh of several commodities shares)
are mutated only by their own methods.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..messages import INF, Label, Side

if TYPE_CHECKING:
    from .node import FlowNode

EPS = 1e-9  # costs closer than this are equal
MAX_REJECTS_BEFORE_WAIT = 4  # consecutive rejections before a unit waits for the next tick
MAX_STUCK_WAVES = 1000  # waves the stuck timer may start for one launch (a large wave needs many: see launches.py)
MAX_RETREATS_PER_WAVE = 16  # same-wave launches: more retreats at one node in one wave is a loop (see waves.gate)
MAX_STASHED_SENDERS = 256  # labels kept from senders that are not (yet) neighbours (see FlowNode.add_neighbour)
REQUEST_RETRY_S = 20.0  # a request without its FlowReply is sent again this long after (units.py `retry_due`)
ANSWERS_KEPT = 16  # FlowReplies kept per sender, sent again to a request sent again (units.py `answer_again`)
SIDES = ("next", "prev", "peer")  # how a neighbour is linked (FlowNode.add_neighbour)


class Via(enum.Enum):
    """How a label's route leaves this node."""

    FORWARD = "F"  # to a next-stage peer (its IN label)
    BACK = "B"  # back to an upstream peer along the residual arc of a unit it sends us (its OUT label)
    CROSS = "X"  # into the slot of another data node's unit from upstream (cross displacement, relabel.py)


class PendingKind(enum.Enum):
    """What a request awaiting its FlowReply was for."""

    LAUNCH = "token"  # the unit this node routes now (one at a time: UnitState.token_pending)
    FORCED = "forced"  # a forced Request Flow: half of an agreed move or a retreat, never rejected for its cost
    WITHDRAW = "withdraw"  # a Withdraw: the downstream end takes a unit back


class Step(enum.Enum):
    """One step a unit took at this node during the current wave (waves.py: a retreat undoes the last one)."""

    IN = "in"  # a unit arrived by Request Flow from the upstream peer
    HANDED_BACK = "rin"  # a downstream peer handed a unit back (Deny) along a residual arc
    FORWARD = "fwd"  # a unit went on to the downstream peer
    THROUGH = "thru"  # a unit arrived and displaced one from another upstream peer
    BACK = "bk"  # a unit was handed back upstream (Deny)


@dataclass
class Pending:
    kind: PendingKind
    peer: str
    commodity: str
    cost: float = 0.0  # a launch's expected cost (what its Request Flow said)
    at: float | None = None  # when it was (last) sent, as of the tick after (units.py `retry_due`)

    def due(self, now: float) -> bool:
        """Whether to send the request again at `now`: `REQUEST_RETRY_S` after it went (timed from the first call)."""
        if self.at is None:
            self.at = now
            return False
        if now - self.at < REQUEST_RETRY_S:
            return False
        self.at = now
        return True


@dataclass
class FlowStats:
    flow_changes: int = 0
    last_change: float = 0.0
    rejects: int = 0
    moves_done: int = 0
    anneal_accepts: int = 0
    ignored: int = 0  # messages that no longer applied (stale)
    recalls: int = 0  # data node: recall waves started (launches.py)
    sent_again: int = 0  # requests sent again, their FlowReply not come (units.py `retry_due`)
    answered_again: int = 0  # requests answered already, answered again with the same reply (`answer_again`)

    def changed(self, now: float) -> None:
        self.flow_changes += 1
        self.last_change = now

    def ignore(self) -> None:
        self.ignored += 1

    def reject(self) -> None:
        self.rejects += 1

    def move_done(self) -> None:
        self.moves_done += 1

    def anneal_accept(self) -> None:
        self.anneal_accepts += 1

    def recall(self) -> None:
        self.recalls += 1

    def resend(self) -> None:
        self.sent_again += 1

    def answer_again(self) -> None:
        self.answered_again += 1


class Batch:
    """What the label computations of several commodities in one `announce.refresh` share (their inputs do not
    change in between): whether the node has room (labels.compute), and per commodity B the units of B that
    could be displaced (relabel.cross_in)."""

    __slots__ = ("room", "units")

    def __init__(self) -> None:
        self.room: bool | None = None
        self.units: dict[str, list] = {}

    def keep_room(self, room: bool) -> bool:
        self.room = room
        return room

    def keep_units(self, b: str, units: list) -> None:
        self.units[b] = units


def total(d: dict[str, int]) -> int:
    return sum(d.values())


def take_one(d: dict[str, int], key: str) -> bool:
    """One unit less on the link to `key`; False (and no change) when there is none."""
    n = d.get(key, 0)
    if n <= 0:
        return False
    if n == 1:
        del d[key]
    else:
        d[key] = n - 1
    return True


def add_one(d: dict[str, int], key: str) -> None:
    d[key] = d.get(key, 0) + 1


# ------------------------------------------------------------------ labels: pure helpers (labels.py uses them)
NO_LABEL = Label("", Side.IN, INF, ())


def cost_differs(new: Label, old: Label | None) -> bool:
    return old is None or costs_differ(new.cost, old.cost)


def costs_differ(new: float, old: float) -> bool:
    return abs(new - old) > EPS or (new == INF) != (old == INF)


_new = object.__new__
_set_f = Label.formation.__set__
_set_c, _set_s, _set_k, _set_p, _set_e = (Label.commodity.__set__, Label.side.__set__, Label.cost.__set__,
                                          Label.path.__set__, Label.epoch.__set__)


def label(commodity: str, side: Side, cost: float, path: tuple[str, ...], epoch: int = 0,
          formation: bool = False) -> Label:
    """`Label(...)` without the frozen dataclass's __init__ (a flow machine makes one per label it computes: 0.4
    against 0.6 microseconds here); the object is the same."""
    lab = _new(Label)
    _set_c(lab, commodity)
    _set_s(lab, side)
    _set_k(lab, cost)
    _set_p(lab, path)
    _set_e(lab, epoch)
    _set_f(lab, formation)
    return lab


def marked(node: FlowNode, d: str) -> bool:
    """The node's current wave of `d` is a formation wave (waves.py)."""
    return node.wave.formation.get(d) == node.labels.epoch[d]


def stamped(lab: Label, epoch: int, formation: bool = False) -> Label:
    """The label as sent: stamped with its wave (`Label.epoch`) and whether that is a formation wave here
    (`Label.formation`, `marked`)."""
    return label(lab.commodity, lab.side, lab.cost, lab.path, epoch, formation)


def as_sent(node: FlowNode, lab: Label, d: str) -> Label:
    """`lab`, a label of `d`, stamped as the node sends it now: its current wave, marked if a formation wave."""
    return stamped(lab, node.labels.epoch[d], marked(node, d))


def pick(cands: list, sticky: str | None):
    """The cheapest (cost, peer, label); among equal costs the sticky peer, else the smallest id."""
    if not cands:
        return None
    m = min(c[0] for c in cands)
    best = None
    for c in cands:
        if c[0] <= m + EPS:
            if c[1] == sticky:
                return c
            if best is None or c[1] < best[1]:
                best = c
    return best


def cost_of(cand) -> float:
    return cand[0]


def cheapest(cands: list, tags: tuple[str, ...]) -> list:
    """Of `cands` (sorted by cost), the ones whose label path has none of `tags` and that tie with the cheapest
    of those: all `pick` looks at, found without scanning the paths of dearer ones."""
    out: list = []
    m = INF
    for cand in cands:
        if cand[0] > m + EPS:
            break
        path = cand[2].path
        for t in tags:
            if t in path:
                break
        else:
            if not out:
                m = cand[0]
            out.append(cand)
    return out


def choose(f, b, sticky_kind: str | None) -> str | None:
    """Forward (Via.FORWARD) or back (Via.BACK): the cheaper; on a tie the current kind, else forward."""
    if f is None:
        return None if b is None else Via.BACK
    if b is None:
        return Via.FORWARD
    if abs(f[0] - b[0]) <= EPS:
        return sticky_kind if sticky_kind in (Via.FORWARD, Via.BACK) else Via.FORWARD
    return Via.FORWARD if f[0] < b[0] else Via.BACK

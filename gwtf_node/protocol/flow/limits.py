"""Label limits: a relay's IN labels go only to the previous-stage peers whose choice they can change.

Label waves (one data node) send every IN label to every previous-stage peer,
and almost none of them changes anything there (docs/bench_flow.md, "Where
the messages go").  A next-stage label L of peer i matters to relay p only
while d(p, i) + L is below p's threshold b: its cheapest forward candidate
(the OUT label's), or, with room, the IN label's, which is at least as high.
So p tells i a *limit* (`LabelLimit`): i sends p its IN labels only below it.
Off by default (`FlowConfig.label_limits`; measured: docs/bench_flow.md).

* A limit is b + `label_limit_slack` - d(p, i), told when i sends a label that
  changes nothing at p (`useless`), again only when the one told is more than
  twice the slack above that.  A peer never limited gets every finite label;
  the data node neither tells limits nor heeds them.
* Floors: i also tells p every fall below the last label p got from it, so
  that label is a floor of i's (`_floor`); p raises only the limits whose
  floor, plus the link, is below its threshold.
* Subscription: the peers behind p's forward candidates are told INF (`check`)
  and send p every label, a rise within a wave too (which goes to nobody
  else: without it, p routes a unit on a label that rose, is rejected, and the
  next wave can repeat it).
* Raises: when p's threshold rises above a limited peer's floor plus the link
  (its choice got dearer), p tells that peer b + slack - d(p, i), and the peer
  answers with the label it announced in this wave if it held it back
  (`on_limit`): at the end of a wave every label p does not hold costs at least
  its floor, which is at least p's threshold less the link.  No usable forward
  candidate (threshold INF, most often at the start of a wave, before the
  peers' labels came): the limits rise in steps, to the last finite threshold
  plus 4, 8, 16 x the slack, then INF, one every `label_limit_step_s` while it
  stays INF (`step`), counted across waves (a wave restarted by the data
  node's stuck timer must not start them again).
* Every relay hears every wave (the circular wait of an earlier attempt:
  docs/bench_flow.md): the last stage hears it from the data node; a relay
  with a forward candidate from the subscribed peer behind it, which hears it
  by induction; an unreachable IN label of a new wave goes at once to the
  feeders (upstream peers holding units here: a full relay's IN label needs
  their OUT labels, which they send once they hear the wave) and, if still
  unreachable `label_limit_step_s` later, to the subscribed peers (`late`);
  a relay without a candidate raises its limits to INF in the end.

`LimitState` holds both sides (what this relay told its next-stage peers and
knows of their labels; what its previous-stage peers told it and got from it);
only this module changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, CostAnnounce, Label, LabelLimit, Side
from .state import EPS, as_sent

if TYPE_CHECKING:
    from .node import FlowNode


@dataclass
class LimitState:
    told: dict[str, dict[str, float]] = field(default_factory=dict)  # commodity -> next-stage peer -> limit told
    low: dict[str, float] = field(default_factory=dict)  # commodity -> least finite (limit + link cost) told
    seen: dict[str, dict[str, float]] = field(default_factory=dict)  # commodity -> next-stage peer -> the cost of
    # its last IN label received: a floor of its label (it tells every fall below it)
    heard: dict[str, dict[str, float]] = field(default_factory=dict)  # commodity -> previous-stage peer -> limit
    given: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)  # commodity -> previous-stage
    # peer -> (cost, wave) of our last IN label it was sent (the cost: its floor of our label)
    due: dict[str, float] = field(default_factory=dict)  # commodity -> when its next raise `step` is due
    last: dict[str, float] = field(default_factory=dict)  # commodity -> the last finite threshold
    tries: dict[str, int] = field(default_factory=dict)  # commodity -> raise steps since the threshold was finite
    unreachable: dict[str, tuple[int, float]] = field(default_factory=dict)  # commodity -> (wave, when our
    # unreachable IN label goes to the subscribed peers; INF: it went)


def allowed(node: FlowNode, d: str, peer: str, cost: float, rise: bool = False) -> bool:
    """Sender side: `peer` is to hear our IN label of `d` at `cost`: below its limit, or below the floor it holds
    of our label; a `rise` within a wave only a subscribed peer (module doc)."""
    lim = node.limits.heard.get(d)
    t = lim.get(peer) if lim else None
    if rise:
        return t == INF
    if cost == INF:  # a new wave: at once to the feeders (module doc), later to the subscribed peers (`late`)
        return node.units.inn[d].get(peer, 0) > 0
    if t is None:
        return True
    if cost < t:
        return True
    g = node.limits.given.get(d)
    f = g.get(peer) if g else None
    return f is not None and cost < f[0] - EPS


def recipients(node: FlowNode, d: str, cost: float, peers, rise: bool = False) -> list[str]:
    """The peers of `peers` that are to hear our IN label of `d` at `cost` (`allowed`), noted as told it."""
    lim = node.limits.heard.get(d)
    if not lim and cost != INF and not rise:
        out = [p for p in peers]
    else:
        out = [p for p in peers if allowed(node, d, p, cost, rise)]
    if cost != INF and out:
        gave(node, d, out, cost)
    return out


def gave(node: FlowNode, d: str, peers, cost: float) -> None:
    """Our IN label of `d` at `cost`, of the current wave, went to `peers` (their floor of it)."""
    g = node.limits.given.setdefault(d, {})
    e = node.labels.epoch[d]
    for p in peers:
        g[p] = (cost, e)


def note(node: FlowNode, d: str, sender: str, cost: float) -> None:
    """Receiver side: an IN label of `d` at `cost` came from next-stage `sender` (a CostAnnounce): its floor.  An
    unreachable label (a new wave) leaves the floor as it was (`gave` is not told of it either)."""
    if cost == INF:
        return
    seen = node.limits.seen.get(d)
    if seen is None:
        seen = node.limits.seen[d] = {}
    seen[sender] = cost
    told = node.limits.told.get(d)
    t = told.get(sender) if told else None
    if t is not None and t != INF and cost < INF:
        c = max(t, cost) + node.cfg.next_costs.get(sender, INF)
        if c < node.limits.low.get(d, INF):
            node.limits.low[d] = c


def _floor(node: FlowNode, d: str, peer: str, t: float) -> float:
    """What this relay knows of next-stage `peer`'s IN label of `d`: at least its limit `t` (it tells every label
    below), and at least the last one it sent (it tells every fall below)."""
    seen = node.limits.seen.get(d)
    f = seen.get(peer) if seen else None
    return t if f is None or f < t else f


def _threshold(node: FlowNode, d: str) -> tuple[float, tuple[str, ...]] | None:
    """Receiver side: the threshold of `d` and the peers behind the forward candidates; None: no cache."""
    cache = node.labels.cache.get(d)
    if cache is None:
        return None
    _, f_out, _, f_in, _, room = cache
    chosen = ()
    if f_out is not None:
        chosen = (f_out[1],)
        if room and f_in is not None and f_in[1] != f_out[1]:
            chosen += (f_in[1],)
    if f_out is None or (room and f_in is None):
        return INF, chosen
    return (f_in[0] if room else f_out[0]), chosen


def _tell(node: FlowNode, d: str, peer: str, limit: float, eff: list[Effect]) -> None:
    node.limits.told.setdefault(d, {})[peer] = limit
    if limit != INF:
        c = _floor(node, d, peer, limit) + node.cfg.next_costs[peer]
        if c < node.limits.low.get(d, INF):
            node.limits.low[d] = c
    eff.append(Send(peer, LabelLimit(d, limit)))


def check(node: FlowNode, d: str, eff: list[Effect]) -> None:
    """Receiver side, after this relay's labels of `d` were recomputed: subscribe to the peers behind the
    forward candidates, and raise the limits that the threshold rose above (module doc)."""
    if node.cfg.is_data:
        return
    lab = node.labels.my_in.get(d)
    e = node.labels.epoch[d]
    if lab is not None and lab.cost == INF and node.limits.unreachable.get(d, (None,))[0] != e:
        at = node.wave.heard_at.get(d, node.now) + node.cfg.label_limit_step_s
        node.limits.unreachable[d] = (e, at)
        eff.append(SetTimer("limits", max(at, node.now)))
    th = _threshold(node, d)
    if th is None:
        return
    b, chosen = th
    if b != INF:
        node.limits.last[d] = b
        node.limits.tries.pop(d, None)
    told = node.limits.told.get(d)
    data = node.cfg.commodities
    for j in chosen:
        if j not in data and (told is None or told.get(j) != INF):
            _tell(node, d, j, INF, eff)
    told = node.limits.told.get(d)
    if not told or b <= node.limits.low.get(d, INF) + EPS:
        return
    if b != INF:
        raise_limits(node, d, b, eff)
        return
    if d not in node.limits.due:  # the next step after `label_limit_step_s` (the labels of a new wave may come)
        node.limits.due[d] = node.now + node.cfg.label_limit_step_s
        eff.append(SetTimer("limits", node.limits.due[d]))


def step(node: FlowNode, d: str, eff: list[Effect]) -> None:
    """No usable forward candidate (most often at the start of a wave, before the peers' labels came): raise the
    limits to the last finite threshold plus 4, 8, 16 x the slack, one step every `label_limit_step_s` while
    the threshold stays INF, then to INF.  Every peer raised answers with its label (`on_limit`)."""
    n = node.limits.tries.get(d, 0) + 1  # (steps since the threshold was last finite, over waves)
    node.limits.tries[d] = n
    last = node.limits.last.get(d)
    target = INF if n > 3 or last is None else last + node.cfg.label_limit_slack * 2 ** (n + 1)
    raise_limits(node, d, target, eff)
    if target != INF:
        node.limits.due[d] = node.now + node.cfg.label_limit_step_s
        eff.append(SetTimer("limits", node.limits.due[d]))


def late(node: FlowNode, d: str, eff: list[Effect]) -> None:
    """Our IN label of `d` stayed unreachable for `label_limit_step_s` of this wave: the subscribed peers that
    are no feeders hear it now (they hear of the wave)."""
    e, at = node.limits.unreachable[d]
    lab = node.labels.my_in.get(d)
    if e != node.labels.epoch[d] or at > node.now + 1e-9 or lab is None or lab.cost != INF:
        return
    node.limits.unreachable[d] = (e, INF)
    heard = node.limits.heard.get(d, {})
    inn = node.units.inn[d]
    peers = [p for p in sorted(heard) if heard[p] == INF and p in node.cfg.prev_costs and inn.get(p, 0) <= 0]
    if peers:
        msg = CostAnnounce((as_sent(node, Label(d, Side.IN, INF, ()), d),))
        for p in peers:
            eff.append(Send(p, msg))


def on_timer(node: FlowNode, eff: list[Effect]) -> None:
    """The unreachable labels due (`late`), and the next raise `step` where the threshold is still INF."""
    for d in sorted(node.limits.unreachable):
        late(node, d, eff)
    due = node.limits.due
    for d in sorted(due):
        if due[d] > node.now + 1e-9:
            continue
        del due[d]
        th = _threshold(node, d)
        if th is not None and th[0] == INF and node.limits.told.get(d):
            step(node, d, eff)


def raise_limits(node: FlowNode, d: str, b: float, eff: list[Effect]) -> None:
    """Tell every peer whose limit plus link cost is below the threshold `b` a new limit (module doc)."""
    told = node.limits.told.get(d, {})
    costs, slack = node.cfg.next_costs, node.cfg.label_limit_slack
    low = INF
    for i, t in sorted(told.items()):
        if t == INF:
            continue
        c = costs.get(i)
        if c is None:
            continue
        f = _floor(node, d, i, t)
        if f + c < b - EPS:
            t = INF if b == INF else b + slack - c
            node.limits.told[d][i] = t
            eff.append(Send(i, LabelLimit(d, t)))
            f = t
        if t != INF and f + c < low:
            low = f + c
    node.limits.low[d] = low


def useless(node: FlowNode, d: str, sender: str, lab: Label, eff: list[Effect]) -> None:
    """Receiver side: `sender`'s label `lab` changed nothing here: limit it, unless the limit told holds."""
    if sender in node.cfg.commodities or lab.cost == INF:
        return
    th = _threshold(node, d)
    if th is None or th[0] == INF or sender in th[1]:
        return
    b = th[0]
    c = node.cfg.next_costs.get(sender)
    if c is None or lab.cost + c < b - EPS:
        return
    slack = node.cfg.label_limit_slack
    want = b + slack - c
    told = node.limits.told.get(d)
    t = told.get(sender) if told else None
    if t is None or t > want + slack + EPS:
        _tell(node, d, sender, want, eff)


def on_limit(node: FlowNode, now: float, sender: str, msg: LabelLimit, eff: list[Effect]) -> bool:
    """Sender side: a previous-stage peer's limit.  A raise is answered with the IN label we last announced in this
    wave when it was held back under the old limit, whatever its cost: it is the peer's floor of our label from
    then on (`allowed`).  True: no unit moved (nothing for units.act)."""
    d = msg.commodity
    if node.cfg.is_data or sender not in node.cfg.prev_costs or d not in node.labels.epoch \
            or (sender in node.cfg.commodities and sender != d):
        return True
    lim = node.limits.heard.setdefault(d, {})
    old = lim.get(sender)
    lim[sender] = msg.cost
    last = node.announcer.sent.get((d, Side.IN))
    e = node.labels.epoch[d]
    if old is None or msg.cost <= old or last is None or last[0] != e or last[1] == INF or last[1] < old:
        return True
    if node.limits.given.get(d, {}).get(sender) == (last[1], e):
        return True  # it has it
    gave(node, d, (sender,), last[1])
    eff.append(Send(sender, CostAnnounce((as_sent(node, Label(d, Side.IN, last[1], last[2]), d),))))
    return True


def drop_peer(node: FlowNode, peer: str) -> None:
    """`peer` is no neighbour any more: its limits go, both ways."""
    for table in (node.limits.told, node.limits.heard, node.limits.seen, node.limits.given):
        for lim in table.values():
            lim.pop(peer, None)

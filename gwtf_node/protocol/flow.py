"""Flow formation: the decentralized min-cost flow of GWTF (section V-C).

Theory of operation
-------------------
A *unit* of flow is one microbatch slot on a route data node -> one relay per
stage -> the same data node.  Units are fungible within a *commodity* (the
data node they return to).  Every node only knows its own links (to the
previous and the next stage, given by discovery), its same-stage peers, and
what they tell it.

Each node keeps, per commodity, how many units it receives from each upstream
peer (`inn`) and sends to each downstream peer (`out`); a relay holds at most
`capacity` units.  The downstream end of a link owns the count of that link:
every change is decided by the receiver (approve, Deny, Reroute, approve a
Withdraw) and copied by the sender when the receiver's message arrives, so the
two ends always agree once messages are delivered (links are FIFO).

Cost-to-sink (the paper's announcement travelling back to front) is a pair of
labels per commodity, computed by each node from its neighbours' labels over
the *residual* network, as in successive-shortest-path min-cost flow:

* IN  = cost of handing this node one more unit.  Either it has room and
  forwards the unit (`F`: d(i, j) + IN_j, the cheapest next hop), or it is
  full and *displaces* one unit it receives from an upstream peer p, which p
  then routes elsewhere (`B`: -d(p, i) + OUT_p).
* OUT = cost for this node to get rid of a unit it holds: forward it (`F`) or
  hand one back upstream (`B`, the paper's DENY).

Labels carry the residual path behind them (side-tagged ids `id+`/`id-`); a
node ignores a neighbour's label whose path already contains it, so the
distance-vector announcements cannot loop or count to infinity.

Label waves (one data node).  Free-running distance vectors explode with
depth: every unit that moves raises labels, and a rise explores path after
path (80 relays x 16 stages: 326k CostAnnounce for 6 units).  So with a
single data node the labels are recomputed in *epochs*: when its launched
unit settles and the wave has no tight route left ("Several units per wave"
below), the data node starts epoch e+1 by announcing its sink label;
a node that hears a label of a newer epoch drops every label of the older
one for that commodity and recomputes from scratch.  Within an epoch labels
only fall (Bellman-Ford from infinity on a residual graph without negative
cycles), and only news is announced: a label of a new epoch, a lower cost, or
a new route at the same cost; a rise is not announced (the next wave
recomputes it; meanwhile a Request Flow expecting the old cost is rejected
with the current label).  Announcements are coalesced per node for
`announce_coalesce_s` (latest value wins), and ties keep the current choice
(`_pick`), so equal-cost routes cannot flap and the route a unit follows is
the one announced (without that, a unit's walk could revisit a node whose
state it had changed, and the augmentation was not a shortest path).  The
data node launches once its OUT label has been still for
`launch_quiet_factor` x the time the wave took to reach it.  The epoch rides
on the wire in `Label.epoch` (`_wire`); free-running labels stay at epoch 0.
With several data nodes, waves lose to free-running labels (each data node's wave races the others' units for
shared capacity: measured 1.16 / 1.36 of the LP bound on settings 5 / 6
against 1.08 / 1.15), so `waves` defaults to on only with one data node;
free-running labels announce a changed cost at once and a new route at the
same cost every `path_announce_s` (with ordered launches, below, every change
is coalesced for `ordered_coalesce_s`).

Several units per wave (`same_wave_launches`, waves only).  The labels of a
settled wave are exact distances to the sink, i.e. potentials pi with every
residual arc's reduced cost c(u, v) + pi(v) - pi(u) >= 0; a unit that moves
only along *tight* arcs (reduced cost 0) follows a shortest augmenting path,
and afterwards pi is still feasible (the reverse of a tight arc is tight).  So
after a unit reaches the sink the data node launches the next one at once,
without a new wave, while its OUT label still has the wave's value; a node
keeps, as its potential, the lowest OUT label of the wave (`_pot_out`) and
sends a unit on only while its OUT label is still that (`_gate`).  Labels only
rise within a wave and rises are not announced, so a unit may find its route
gone (a relay filled up, a Request Flow rejected with a dearer label): then it
*retreats* (`_retreat`), undoing the step that brought it, which is tight too:
DENY to the node whose Request Flow brought it, or, for a unit handed back by
a displacement or a DENY-step, a forced Request Flow back to that node, after
telling it that our OUT label rose (CostAnnounce; `_walk_back` there hands on
the unit it had taken, to where it came from).  Each node logs the steps of
this wave (`_walk`).  A retreat that reaches the data node starts a new wave.
A unit that can neither go on nor retreat (its arrival is not the last step
logged: undoing older steps would unwind settled units) is held; the data
node starts a new wave when its launch has not settled in 2 x the wave's
time + `launch_settle_s` ("stuck" timer), and the held unit moves once the new
wave's labels at its node have been still for a while (the stuck timer starts
waves while the launch is out: capping them at 4 per launch left 1,000 x 16
at 77 of 89 flows after 120 rounds).  A
membership change makes the steps logged and the potentials of the wave
meaningless: at that node (and at the data node for its launches) the rest of
the wave goes the old way, routing on the labels at any cost
(`_membership_changed`); so does a held unit after `retry_epoch_rounds` (nobody
may start the wave it waits for), and every unit at a node that retreated more
than MAX_RETREATS_PER_WAVE times in one wave.
Measured on 1,000 relays x 16 stages: 89 augmentations at 39 distinct
distances take 64 waves (stuck waves included).  Settings 1-4 stay at the exact
optimum (docs/bench_flow.md).

Cost of a wave.  Almost every message of a wave is one next-stage IN label;
the four best candidates (forward / back x OUT / IN) are cached with the
state they came from (`_cache`, `_sig`), and such a label is folded in in
O(1) (`_fold_in`; on_message's fast path), where `_compute` scans every
neighbour (63 at 1,000 x 16).  Most of those labels change nothing here and
cost no further work.  Labels also go out in Dijkstra order: distances never
fall from one wave to the next (successive shortest paths), so the lowest
labels of the previous wave are floors; a label L above its floor F is
announced (L - F) x `wave_order_s` later (at most `wave_order_cap_s`), so that
cheaper routes, which come the long way round through the residual back arcs,
arrive before it is sent, not after (a third fewer CostAnnounce at 320 x 16;
the cap keeps costs of hundreds, as in the DeComm instances, from stalling a
wave).  Peers told the same labels share one CostAnnounce object.
CPU per message: the fast path decides a label that changes nothing on its
cost alone, before scanning its path for our tags (about 0.85 us per such
message); an upstream OUT label recomputes only the back candidates
(`_fold_out`, waves only); `_compute` scans paths only for the cheapest
forward candidates (`_cheapest`); the Sends of one label are built without
the dataclass __init__ (`_send_all`), and the simulator queues them once per
distinct link delay.  1,000 x 16: 9.18M messages in 35.7 s of CPU, 3.9 us per
message all told (75.8 s before; docs/bench_flow.md, "Scale").  Most labels
do change from one wave to the next (320 x 16: 8,668 of 12,228 final labels
of a wave had another cost than in the wave before, 2,142 another route at
the same cost), so re-announcing only changed labels would save little.

Request Flow: a node that holds an unpaired unit (more inflow than outflow;
for a data node, demand not yet placed) sends Request Flow to the neighbour
behind its OUT label with the cost it expects.  The receiver approves when its
IN label still has that cost, else rejects and tells its current cost.  On
approval the unit moves: the receiver forwards it in turn, or displaces an
upstream unit (that peer now holds an unpaired unit), or, if it cannot go on,
sends DENY upstream.  A data node launches one unit at a time and waits for it
to settle (arrive at the sink or come back), so that each unit follows a
shortest augmenting path on converged labels: with one data node this is
exactly successive shortest paths, which reaches the maximum flow at minimum
cost (several units per wave, one after the other, are still that: see above).  We chose this over the paper's greedy back-to-front pairing because the
latter leaves a gap to the optimum that Request Change and Request Redirect
alone do not close (the residual "displace" step is what closes it).

Several data nodes (`ordered_launches`, `relabel`, `cross_displace`; on by
default with several data nodes).  Each data node's units are a commodity of
their own, and shared relay capacity makes this a multi-commodity flow; one
shortest augmenting path per data node at a time, all of them at once, left
settings 5 / 6 at 1.079 / 1.156 of the LP bound (the exact integral optimum,
scipy's MILP, is within 0.21 % of that bound on all 20 instances).  Three
mechanisms, each on local knowledge and messages:

* Ordered launches: the cheapest augmentation over all data nodes goes first
  (a centralised run of that rule: 1.040 / 1.091).  A data node announces
  the cost of its next launch (its OUT label, INF when it will not launch) in
  a `LaunchBid` to its first-stage relays, which pass each new bid (`seq`)
  on to their other data-node neighbours.  A data node launches only when no
  known bid is lower (ties: the smaller id), `ordered_settle_s` after its
  first bid since its last launch (also its wait after a settled launch: the
  labels settle and the others' bids arrive); its bid is frozen while its
  launch is out, so the others wait for it.  A lower bid unchanged for
  `bid_patience_rounds` stops holding others back (its data node may be
  stuck or gone).  Free-running labels then flap: without coalescing them
  (`ordered_coalesce_s`) three setting-6 seeds blew up into millions of
  CostAnnounce (one commodity's rises exploring path after path), and bids
  go out at most every `path_announce_s` (a flapping OUT label).
* Relabelling: on each relay route the commodities differ only in the hops
  from and back to the data node, so a unit of A can become B's when B's hops
  are cheaper.  Every relay announces upstream, per pair (A, B), the cheapest
  change of the hop back when one unit of A it sends on becomes B's
  (`RelabelCost`, a cost announcement along the current flow: at the last
  stage d(i, B) - d(i, A), elsewhere the minimum over the next hops carrying
  A).  A first-stage relay, quiet, on its tick, once every bid it passed on
  is INF (launching is over), relabels one unit when d(B, i) - d(A, i) plus
  that change is negative: it tells both data nodes and the next hop
  (`Relabel`), and each relay on the way relabels one unit it sends on, along
  its cheapest announced change, down to the last stage, which sends the
  unit back to B.  The upstream end changes the link's commodity and the
  downstream end copies it (a relabel of a unit that is gone is ignored; an
  imbalance left is repaired as any other).  At most `relabel_limit` per
  relay: two relays undid each other's relabels once (setting 6 seed 2,
  `ordered_settle_s` 1.5).
* Cross displacement: a relay's IN label of commodity A may also take the
  slot of a unit of another commodity B that it receives from upstream p: p
  routes that unit again (B's OUT label at p, as in a displacement), and A's
  unit takes the B unit's route from here on, relabelled (RelabelCost of
  (B, A)): cost OUT_B(p) - d(p, i) + R(B -> A), a multi-commodity augmenting
  path.  Carried out with the messages above (Deny DISPLACED to p, Relabel
  down the route).  At most `cross_limit` (1) per relay: more let stale labels
  chase units around (setting 6: 3 seeds at the 120-round limit without a
  limit, 1.087 of the bound with 3).
Measured (docs/bench_flow.md): 1.0243 / 1.0655 of the LP bound on settings 5
/ 6 (worst 1.041 / 1.095) against 1.0794 / 1.1560 before.

Request Change and Request Redirect (improvement moves, one per tick at most):
a node asks a random same-stage peer for its flows (QueryFlows/FlowReport).
Change swaps the next hops of one unit each, same commodity; Redirect takes a
peer's unit prev -> peer -> next through the asking node when it has room.
The objective is the sum of link costs (Equation 2), not the paper's maximum,
because the mean cost per microbatch is what we minimise.  A move that lowers
the cost is taken; a worse one is taken by simulated annealing (`anneal.py`).
An agreed move is carried out with forced Request Flows and Withdraws; nodes
wait `balance_grace_s` before acting on an imbalance a move created, so that
the matching half of the move can arrive.

Membership changes
------------------
The daemon (or the simulator, `sim/flowchurn.py`) tells a machine about its
neighbours coming and going; the flows are re-formed by the machines with the
messages above, never recomputed globally.  `FlowConfig` stays frozen: a
change replaces `node.cfg` with a copy (read `node.cfg.next_costs`, not the
mapping handed in at construction).

* `add_neighbour(now, peer, cost, side)`, side "next" / "prev" / "peer":
  link `peer` with cost d(self, peer) (adding a known one updates its cost).
  A new "prev" neighbour is sent this node's current IN labels (it joined
  after they were announced), stamped with the current epoch; a label a
  newcomer sent before we were told about it is kept (`_stash`, bounded) and
  used when it is added.  Adding only lowers labels, which an epoch allows,
  so a newcomer's capacity shows up in the current wave and the data node
  launches on it (it waits at most `retry_epoch_rounds` for labels to settle).
  A node placed into a run in flight is started with `FlowConfig.joined`.
* `remove_neighbour(now, peer)`: `peer` crashed or left; it is forgotten on
  every side.  Units this node sent to it are unpaired again and re-routed
  along the OUT label (Request Flow; DENY upstream when there is no route);
  units it sent to this node are withdrawn downstream (Withdraw, recursively
  to the sink), so that the downstream end, which owns the count, agrees.
  Requests and moves pending with it are dropped, its later messages ignored.
  A data node that loses first hops re-places its demand after a new wave.
* `set_cost(now, peer, cost)`: d(self, peer) measured again.  Both ends of a
  link must hold the same cost: a unit's forward edge (the upstream end's
  `next_costs`) and its residual backward edge (the downstream end's
  `prev_costs`) cancel only then; with each end's own measurement the
  machines can stall short of the demand (tests/test_flow_membership.py).
  The daemon makes the downstream end adopt the upstream end's cost
  (`LinkCost`).

A launched unit can pair with a hole left by a removal (a relay waiting out
`balance_grace_s` after a Withdraw) and so never reach the sink; a data node
whose launched unit is not back after `retry_epoch_rounds` without any flow
change, while every unit it sent is back, counts it as settled
(`_maybe_lost_settlement`).  A unit that reaches the data node without having
been launched (re-routed after a removal) starts a wave but settles no launch
unless one is outstanding (`_settled`): counted, it pre-settled the next
launch, and that launch, lost in a hole, left the data node waiting forever.

Removal raises labels, which a wave does not announce, so a data node with
one commodity and no route starts a new wave when a flow changed at it since
the last one (a Withdraw reached the sink, a re-routed unit arrived).
Re-routing on the labels at hand forms a maximum flow but not always a
cheapest one (the units of a crashed relay race each other on old labels; the
remaining flow may have negative cycles), so after a change the neighbours
(and a joiner) run greedy Request Redirect / Request Change, no annealing,
for `change_improve_rounds`: that is also how flows move to a cheaper
newcomer.  Measured (docs/bench_flow_churn.md): Table V settings 1 / 3, 10 %
of the relays killed, every run back at the new maximum flow at 1.07 / 1.07
of the new optimum (worst 1.27 / 1.34); before several units per wave 1.03 /
1.05 (worst 1.14 / 1.19): re-forming is not exact, and starts from flows that
more of the same-wave units took.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Mapping

from .anneal import ALPHA_DEFAULT, T0_DEFAULT, T_MIN_DEFAULT, Annealer
from .effects import Effect, Send, SetTimer
from .messages import (
    INF, CostAnnounce, Deny, DenyReason, FlowReply, FlowReport, HopFlow, Label, LaunchBid, MoveReply,
    QueryFlows, Relabel, RelabelCost, Reply, RequestChange, RequestFlow, RequestRedirect, Reroute, Side, Withdraw,
)

EPS = 1e-9  # costs closer than this are equal
MAX_REJECTS_BEFORE_WAIT = 4  # consecutive rejections before a unit waits for the next tick
MAX_STUCK_WAVES = 1000  # waves the stuck timer may start for one launch (4 left 1,000 x 16 at 77 / 89 flows)
MAX_RETREATS_PER_WAVE = 16  # same-wave launches: more retreats at one node in one wave is a loop (see _gate)
MAX_STASHED_SENDERS = 256  # labels kept from senders that are not (yet) neighbours (see add_neighbour)
SIDES = ("next", "prev", "peer")
_IN, _OUT = Side.IN, Side.OUT  # a module global is read faster than an enum member (hot paths)


@dataclass(frozen=True)
class FlowConfig:
    node_id: str
    is_data: bool
    capacity: int
    commodities: tuple[str, ...]  # the data nodes of the run
    next_costs: Mapping[str, float]  # linked peers of the next stage (data node: stage 0)
    prev_costs: Mapping[str, float]  # linked peers of the previous stage (data node: last stage)
    peers: tuple[str, ...] = ()  # same-stage relays known from discovery
    displace: bool = True  # IN labels may displace an upstream unit (residual backward edge)
    round_s: float = 1.0  # one round: each node ticks once
    path_announce_s: float = 0.1  # a changed route at an unchanged cost is announced at most this often
    launch_settle_s: float = 0.2  # data node: least wait after a unit settled (free-running) / OUT label still (waves)
    balance_grace_s: float = 0.3  # wait for the other half of an agreed move
    improve: bool = False  # run Request Change / Request Redirect with annealing (off by default: see module doc)
    announce_coalesce_s: float = 0.02  # labels changed within this window go out in one CostAnnounce per peer
    launch_quiet_factor: float = 1.0  # data node: wait this x (time the wave took to reach it) after its last OUT change
    noroute_grace_s: float = 0.5  # a relay with an unpaired unit and no route waits this long before a DENY
    waves: bool | None = None  # label waves per augmentation; None: only with a single data node (see module doc)
    same_wave_launches: bool = True  # waves: launch again on a wave while it still has a tight route (see doc)
    wave_order_s: float = 0.005  # waves: a label L above its previous wave's floor F goes out (L - F) x this later
    wave_order_cap_s: float = 0.2  # ... at most this much later
    retry_epoch_rounds: float = 5.0  # several data nodes: a data node without a route starts a new wave this often
    joined: bool = False  # placed into a run whose flows already formed: run greedy moves at start (see doc)
    change_improve_rounds: float = 20.0  # rounds of greedy Request Redirect/Change after joining / a membership change
    ordered_launches: bool | None = None  # several data nodes: the cheapest launch goes first (LaunchBid); None: on
    # with several data nodes and free-running labels (see "Ordered launches" in the module doc)
    ordered_coalesce_s: float = 0.01  # ordered launches: free-running labels go out at most this often (0: at once)
    relabel: bool | None = None  # several data nodes: first-stage relays turn a unit into another data node's when
    # that data node's first and last hops are cheaper (Relabel); None: on with several data nodes (see doc)
    relabel_limit: int = 4  # relabels a first-stage relay starts at most (two of them could undo each other's)
    cross_displace: bool = True  # relabelling on: an IN label may displace another data node's unit (see doc)
    cross_limit: int = 1  # ... at most this many times per relay (stale labels can make them chase each other)
    ordered_settle_s: float = 1.0  # ordered launches: launch_settle_s for them (labels still before the next bid)
    bid_patience_rounds: float = 5.0  # ordered launches: a cheaper bid unchanged for this long no longer holds us back
    t0: float = T0_DEFAULT
    alpha: float = ALPHA_DEFAULT
    t_min: float = T_MIN_DEFAULT


_NO_LABEL = Label("", Side.IN, INF, ())


def _cost_differs(new: Label, old: Label | None) -> bool:
    return old is None or abs(new.cost - old.cost) > EPS or (new.cost == INF) != (old.cost == INF)


def _wire(lab: Label, epoch: int) -> Label:
    """The label as sent: stamped with the epoch of its wave (`Label.epoch`)."""
    return Label(lab.commodity, lab.side, lab.cost, lab.path, epoch)


def _pick(cands: list, sticky: str | None):
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


def _cost_of(cand) -> float:
    return cand[0]


def _cheapest(cands: list, tags: tuple[str, ...]) -> list:
    """Of `cands` (sorted by cost), the ones whose label path has none of `tags` and that tie with the cheapest
    of those: all `_pick` looks at, found without scanning the paths of dearer ones."""
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


def _choose(f, b, sticky_kind: str | None) -> str | None:
    """Forward ("F") or back ("B"): the cheaper; on a tie the current kind, else forward."""
    if f is None:
        return None if b is None else "B"
    if b is None:
        return "F"
    if abs(f[0] - b[0]) <= EPS:
        return sticky_kind if sticky_kind in ("F", "B") else "F"
    return "F" if f[0] < b[0] else "B"


_new, _set_to, _set_msg = object.__new__, Send.to.__set__, Send.msg.__set__


def _send_all(eff: list, peers, msg) -> None:
    """`eff += [Send(p, msg) for p in peers]`, built without the frozen dataclass's __init__ (twice as fast: a
    wave's announcements go to every previous-stage peer); the objects are the same."""
    for p in peers:
        s = _new(Send)
        _set_to(s, p)
        _set_msg(s, msg)
        eff.append(s)


def _dsum(d: dict[str, int]) -> int:
    return sum(d.values())


def _dec(d: dict[str, int], key: str) -> bool:
    n = d.get(key, 0)
    if n <= 0:
        return False
    if n == 1:
        del d[key]
    else:
        d[key] = n - 1
    return True


def _inc(d: dict[str, int], key: str) -> None:
    d[key] = d.get(key, 0) + 1


@dataclass
class _Pending:
    kind: str  # "token", "forced", "withdraw"
    peer: str
    commodity: str


@dataclass
class _Move:
    move_id: int
    peer: str
    kind: str  # "change" or "redirect"
    commodity: str
    a: str  # change: my next hop j1; redirect: prev p
    b: str  # change: peer's next hop j2; redirect: next q
    deadline: float


@dataclass
class FlowStats:
    flow_changes: int = 0
    last_change: float = 0.0
    rejects: int = 0
    moves_done: int = 0
    anneal_accepts: int = 0
    ignored: int = 0  # messages that no longer applied (stale)


class FlowNode:
    """One node's flow machine: handed `now`, an event and its seeded RNG, returns effects."""

    def __init__(self, config: FlowConfig, rng: random.Random) -> None:
        self.cfg = config
        self.rng = rng
        me = config.node_id
        self.tag_in, self.tag_out = me + "+", me + "-"
        self.inn: dict[str, dict[str, int]] = {d: {} for d in config.commodities}
        self.out: dict[str, dict[str, int]] = {d: {} for d in config.commodities}
        self.lin: dict[str, dict[str, Label]] = {d: {} for d in config.commodities}
        self.lout: dict[str, dict[str, Label]] = {d: {} for d in config.commodities}
        self.my_in: dict[str, Label] = {}
        self.my_out: dict[str, Label] = {}
        self.dec_in: dict[str, tuple[str, str] | None] = {}
        self.dec_out: dict[str, tuple[str, str] | None] = {}
        self.pending: dict[int, _Pending] = {}
        self.token_pending = False
        self.rejects_in_row = 0
        self.next_id = 1
        self.move: _Move | None = None
        self.grace_until = 0.0
        self.query_target: str | None = None
        self.annealer = Annealer(config.t0, config.alpha, config.t_min)
        self.stats = FlowStats()
        self.epoch: dict[str, int] = {d: 0 for d in config.commodities}
        self._sent: dict[tuple[str, Side], tuple[int, float, tuple[str, ...]]] = {}
        self._dirty: set[tuple[str, Side]] = set()
        self._force: dict[str, set[str]] = {}
        self._flush_armed = False
        self._noroute_since: dict[str, float] = {}
        self._now = 0.0
        self._data_prev = tuple(p for p in config.prev_costs if p in config.commodities)
        self._removed: set[str] = set()  # peers removed (and not added again): their messages are ignored
        self._stash: dict[str, dict[tuple[str, Side], Label]] = {}  # labels from not-yet neighbours
        self._pot_in: dict[str, float] = {}  # lowest IN of the current wave
        self._floor: dict[str, tuple[float, float]] = {}  # lowest (IN, OUT) of the previous wave (see _flush_delay)
        self._pot_out: dict[str, float] = {}  # lowest OUT of the current wave: the potential (see "Several units")
        self._walk: dict[str, list[tuple]] = {}  # steps units took here during the current wave (see _retreat)
        self._walked: dict[str, int] = {}  # commodity -> the last wave in which a unit stepped here
        self._hold: dict[str, int] = {}
        self._gave_up: dict[str, int] = {}
        self._retreats: dict[str, tuple[int, int]] = {}  # commodity -> (wave, retreats in it)  # commodity -> wave in which a held unit was let go the old way  # commodity -> wave in which a unit got stuck here (held for the next one)
        self._heard_at: dict[str, float] = {}  # when this wave's first label arrived
        self._quiet_at: dict[str, float] = {}  # held units move on after this (labels of the new wave still)
        self._stuck_epoch = -1
        self._stuck_waves = 0  # waves started by the stuck timer for the current launch  # data node: the wave of the launch the "stuck" timer watches
        self._cache: dict[str, tuple] = {}
        self._recipients: dict[str, tuple] = {}  # commodity -> (config, sorted IN label recipients): _in_recipients
        self._idle = False  # set by a handler whose message changed nothing (on_message skips _act)  # commodity -> (state signature, f_out, b_out, f_in, b_in): see _compute
        self.greedy_until = -INF  # greedy improvement moves (no annealing) until then (see "Membership changes")
        # data node only
        self.launch_pending = 0
        self.next_launch = 0.0
        self.epoch_started = 0.0
        self.epoch_launches = 0  # units launched on the current wave
        self.first_out_at: float | None = None
        self.demand = config.capacity if config.is_data else 0
        self._relaunch_at = 0.0
        self.waves = config.waves if config.waves is not None else len(config.commodities) <= 1
        # ordered launches (several data nodes, see the module doc)
        self.ordered = not self.waves and (config.ordered_launches if config.ordered_launches is not None
                                           else len(config.commodities) > 1)
        self._bid_seq = 0
        self._bid_cost: float | None = None  # data node: the cost it last announced
        self._bid_at = -INF  # ... and when
        self._bid_first_at: float | None = None  # the first bid since the last launch (see _my_turn)
        self._bids: dict[str, tuple[int, float, float]] = {}  # data node: other data nodes' (seq, cost, heard at)
        self._bid_seen: dict[str, int] = {}  # relay: the newest seq passed on per data node
        self._bid_heard: dict[str, float] = {}  # relay: ... and its cost (relabelling waits for all INF)
        # relabelling (several data nodes, see the module doc)
        self.relabel = len(config.commodities) > 1 if config.relabel is None else config.relabel
        self._rl: dict[tuple[str, str], dict[str, float]] = {}  # (A, B) -> next-stage peer -> its RelabelCost
        self._r: dict[tuple[str, str], tuple[float, str | None]] = {}  # (A, B) -> (our relabel cost, via whom)
        self._r_sent: dict[tuple[str, str], float] = {}  # what prev peers were told
        self.cross = self.relabel and config.cross_displace
        self._crossed = 0  # cross displacements done here
        self._relabelled = 0  # relabels started here

    # ------------------------------------------------------------ helpers
    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def used(self) -> int:
        n = 0
        for v in self.inn.values():
            n += sum(v.values())
        return n

    def _changed(self, now: float) -> None:
        self.stats.flow_changes += 1
        self.stats.last_change = now

    def _out_eff(self, d: str) -> int:
        n = _dsum(self.out[d])
        for p in self.pending.values():
            if p.commodity == d:
                n += 1 if p.kind != "withdraw" else -1
        return n

    def imbalance(self, d: str) -> int:
        """Units held but not passed on (> 0) or passed on but not held (< 0)."""
        if self.cfg.is_data:
            return 0
        return _dsum(self.inn[d]) - self._out_eff(d)

    # ------------------------------------------------------------ labels
    def _compute(self, d: str) -> None:
        """Recompute this node's IN and OUT labels of commodity `d` from its neighbours' labels.

        Ties keep the current choice (sticky): a route changes only when a
        strictly cheaper one appears or the current one goes away, so that
        equal-cost alternatives cannot flap and the route behind a label is the
        one last announced.

        The four best candidates (forward / back, for OUT / IN) are cached with
        the state they were computed on (`_cache`), so that a next-stage
        neighbour's IN label, by far the most frequent news, is folded in in
        O(1) by `_fold_in` instead of a scan over every neighbour (see "Cost of
        a wave" in the module doc).
        """
        cfg = self.cfg
        tin, tout = self.tag_in, self.tag_out
        prev_out, prev_in = self.dec_out.get(d), self.dec_in.get(d)
        lin = self.lin[d]
        if cfg.is_data:
            if d != cfg.node_id:
                return
            cands = [(c + lab.cost, j, lab) for j, c in cfg.next_costs.items()
                     if (lab := lin.get(j)) is not None and lab.cost != INF and tout not in lab.path]
            arg = _pick(cands, prev_out[1] if prev_out else None)
            self._cache[d] = (self._sig(d), arg, None, None, None, False)
            self._decide_data(d, arg)
            return
        # The residual path behind a label must not revisit the side it starts from:
        # F for OUT starts at i-, F for IN at i+ then i-; B for IN at i+, B for OUT at i- then i+.
        room = self.used() < cfg.capacity
        # forward candidates by cost, so that only the cheapest are scanned for our tags (_cheapest)
        fwd = sorted([(c + lab.cost, j, lab) for j, c in cfg.next_costs.items()
                      if (lab := lin.get(j)) is not None and lab.cost != INF], key=_cost_of)
        fo = _cheapest(fwd, (tout,))
        fi = _cheapest(fwd, (tout, tin)) if room else []
        so = prev_out[1] if prev_out else None
        si = prev_in[1] if prev_in else None
        f_out = _pick(fo, so if prev_out and prev_out[0] == "F" else None)
        f_in = _pick(fi, si if prev_in and prev_in[0] == "F" else None)
        b_out, b_in = self._back(d)
        self._cache[d] = (self._sig(d), f_out, b_out, f_in, b_in, room)
        self._decide(d, f_out, b_out, f_in, b_in)

    def _back(self, d: str) -> tuple:
        """The best back candidates of `d` (hand a unit back upstream / displace one): from the upstream peers'
        OUT labels, for OUT and for IN (part of `_compute`)."""
        cfg = self.cfg
        tin, tout = self.tag_in, self.tag_out
        lout = self.lout[d]
        prev_out, prev_in = self.dec_out.get(d), self.dec_in.get(d)
        bo: list = []
        bi: list = []
        for p, n in self.inn[d].items():
            lab = lout.get(p)
            if n <= 0 or lab is None or lab.cost == INF or tin in lab.path:
                continue
            cand = (lab.cost - cfg.prev_costs[p], p, lab)
            if cfg.displace:
                bi.append(cand)
            if tout not in lab.path:
                bo.append(cand)
        so = prev_out[1] if prev_out else None
        si = prev_in[1] if prev_in else None
        return (_pick(bo, so if prev_out and prev_out[0] == "B" else None),
                _pick(bi, si if prev_in and prev_in[0] == "B" else None))

    def _fold_out(self, d: str) -> bool:
        """Upstream OUT labels of `d` changed: recompute the back candidates only, the forward ones stay cached
        (they do not depend on them; ties as in `_fold_in`).  False (the caller runs `_compute`) when the cache
        does not apply, and with free-running labels (several data nodes: measured a worse worst case on
        setting 6, 1.2072 of the LP bound against 1.1898; with waves the results are the same, byte for byte)."""
        cache = self._cache.get(d)
        if self.cfg.is_data or not self.waves or cache is None or not self._sig_ok(d, cache[0]):
            return False
        sig, f_out, _, f_in, _, room = cache
        b_out, b_in = self._back(d)
        self._cache[d] = (sig, f_out, b_out, f_in, b_in, room)
        self._decide(d, f_out, b_out, f_in, b_in)
        return True

    def _cross_in(self, d: str) -> None:
        """Cross displacement: take a unit of `d`, displace a unit of another data node B from upstream p (p routes
        it again: B's OUT label at p) and hand ours B's route from here on, relabelled to `d` (RelabelCost)."""
        tin = self.tag_in
        best = None
        if self._crossed >= self.cfg.cross_limit:
            return
        for b in self.cfg.commodities:
            if b == d:
                continue
            r, via = self._r.get((b, d), (INF, None))
            if via is None or r == INF:
                continue
            lout = self.lout[b]
            for p in sorted(self.inn[b]):
                lab = lout.get(p)
                if self.inn[b][p] <= 0 or lab is None or lab.cost == INF or tin in lab.path:
                    continue
                c = lab.cost - self.cfg.prev_costs[p] + r
                if best is None or c < best[0] - EPS:
                    best = (c, p, b, lab)
        if best is not None and best[0] < self.my_in[d].cost - EPS:
            self.my_in[d] = Label(d, Side.IN, best[0], (tin,) + best[3].path)
            self.dec_in[d] = ("X", best[1], best[2])

    def _sig(self, d: str) -> tuple:
        """The state the cached candidates of `d` depend on, besides the next-stage IN labels (the inflows of
        every commodity: they decide whether there is room)."""
        inn = self.inn
        if len(inn) == 1:
            return (self.epoch[d], self.cfg, dict(inn[d]))
        return (self.epoch[d], self.cfg, tuple(dict(v) for v in inn.values()))

    def _sig_ok(self, d: str, sig: tuple) -> bool:
        """`sig` (from `_sig`) still describes the state: compared in place, without building a new one."""
        cfg = sig[1]
        if sig[0] != self.epoch[d] or (cfg is not self.cfg and cfg != self.cfg):
            return False
        inn = self.inn
        return sig[2] == (inn[d] if len(inn) == 1 else tuple(inn.values()))

    def _decide_data(self, d: str, arg) -> None:
        if arg is None:
            self.my_out[d], self.dec_out[d] = Label(d, _OUT, INF, ()), None
        else:
            self.my_out[d] = Label(d, Side.OUT, arg[0], (self.tag_out,) + arg[2].path)
            self.dec_out[d] = ("F", arg[1])
        self.my_in[d] = Label(d, Side.IN, 0.0, (self.tag_in,))

    def _decide(self, d: str, f_out, b_out, f_in, b_in) -> None:
        prev_out, prev_in = self.dec_out.get(d), self.dec_in.get(d)
        tin, tout = self.tag_in, self.tag_out
        # OUT: forward the unit, or hand one back upstream (DENY)
        kind = _choose(f_out, b_out, prev_out[0] if prev_out else None)
        if kind == "F":
            self.my_out[d] = Label(d, _OUT, f_out[0], (tout,) + f_out[2].path)
            self.dec_out[d] = ("F", f_out[1])
        elif kind == "B":
            self.my_out[d] = Label(d, _OUT, b_out[0], (tout, tin) + b_out[2].path)
            self.dec_out[d] = ("B", b_out[1])
        else:
            self.my_out[d], self.dec_out[d] = Label(d, _OUT, INF, ()), None
        # IN: take the unit and forward it, or displace an upstream unit
        kind = _choose(f_in, b_in, prev_in[0] if prev_in else None)
        if kind == "F":
            self.my_in[d] = Label(d, _IN, f_in[0], (tin, tout) + f_in[2].path)
            self.dec_in[d] = ("F", f_in[1])
        elif kind == "B":
            self.my_in[d] = Label(d, _IN, b_in[0], (tin,) + b_in[2].path)
            self.dec_in[d] = ("B", b_in[1])
        else:
            self.my_in[d], self.dec_in[d] = Label(d, _IN, INF, ()), None
        if self.cross:  # several data nodes: the IN label may take another data node's slot instead
            self._cross_in(d)

    def _fold_in(self, d: str, j: str) -> int:
        """Fold next-stage neighbour `j`'s new IN label into the cached candidates of `d` (O(1)).

        Exactly what `_compute` would decide, except on a tie between `j` and
        another peer that is not the current choice (`_pick` would take the
        smaller id; here the current choice stays, which ties allow).  Returns
        0 (the caller runs `_compute`) when the cache does not apply: the
        state changed since, or `j` was the best and got dearer or unusable;
        1 when nothing changes; 2 when the labels were recomputed from the cache.
        """
        cache = self._cache.get(d)
        if cache is None or self.cross or not self._sig_ok(d, cache[0]):
            return 0
        _, f_out, b_out, f_in, b_in, room = cache
        lab = self.lin[d][j]
        cfg = self.cfg
        if (f_out is None or f_out[1] != j) and (f_in is None or f_in[1] != j):
            # the common case, decided on the cost alone (before the path scans): `j` is not the current
            # choice and its candidate is no cheaper than the best forward ones
            if lab.cost == INF:
                return 1
            c = cfg.next_costs[j] + lab.cost
            if f_out is not None and c >= f_out[0] - EPS and (not room or (f_in is not None
                                                                         and c >= f_in[0] - EPS)):
                return 1
        if lab.cost == INF:
            ok_o = ok_i = False
            cand = None
        else:
            ok_o = self.tag_out not in lab.path
            ok_i = ok_o and cache[5] and self.tag_in not in lab.path
            cand = (cfg.next_costs[j] + lab.cost, j, lab)
        if cfg.is_data:
            if f_out is not None and f_out[1] == j:
                if not ok_o or cand[0] > f_out[0] + EPS:
                    return 0
                f_out = cand
            elif ok_o and (f_out is None or cand[0] < f_out[0] - EPS):
                f_out = cand
            else:
                return 1  # nothing changes
            self._cache[d] = (cache[0], f_out, None, None, None, False)
            self._decide_data(d, f_out)
            return 2
        changed = False
        if f_out is not None and f_out[1] == j:
            if not ok_o or cand[0] > f_out[0] + EPS:
                return 0
            f_out, changed = cand, True
        elif ok_o and (f_out is None or cand[0] < f_out[0] - EPS):
            f_out, changed = cand, True
        if f_in is not None and f_in[1] == j:
            if not ok_i or cand[0] > f_in[0] + EPS:
                return 0
            f_in, changed = cand, True
        elif ok_i and (f_in is None or cand[0] < f_in[0] - EPS):
            f_in, changed = cand, True
        if changed:
            self._cache[d] = (cache[0], f_out, b_out, f_in, b_in, room)
            self._decide(d, f_out, b_out, f_in, b_in)
            return 2
        return 1

    def _refresh(self, commodities, eff: list[Effect], force_to: dict[str, set[str]] | None = None,
                 folds: dict[str, list[str]] | None = None, backs: set[str] | None = None) -> None:
        """Recompute labels; the ones worth announcing go out at the next flush (coalesced, latest value wins).

        Within an epoch only news is announced: a label of a new epoch, a lower
        cost, or a new route at the same cost.  A rise is not announced (the
        next wave recomputes every label from scratch; until then a Request
        Flow that expected the old cost is rejected with the current label).
        """
        cfg = self.cfg
        dn = cfg.node_id if cfg.is_data else None
        if self.cross:
            commodities = cfg.commodities  # IN labels depend on the other commodities' labels (_cross_in)
        for d in commodities:
            if dn is not None:
                if d != dn:
                    continue
                old_out = self.my_out.get(d)
            fold = folds.get(d) if folds else None
            if fold is None or not all(self._fold_in(d, j) for j in fold) \
                    or (backs and d in backs and not self._fold_out(d)):
                self._compute(d)
            lab = self.my_in.get(d)
            if lab is not None and lab.cost < self._pot_in.get(d, INF):
                self._pot_in[d] = lab.cost
            lab = self.my_out.get(d)
            if lab is not None and lab.cost < self._pot_out.get(d, INF):
                self._pot_out[d] = lab.cost
                if d in self._hold and self._hold[d] != self.epoch[d]:
                    now = self._now
                    self._quiet_at[d] = now + max(cfg.launch_settle_s, cfg.launch_quiet_factor
                                                  * (now - self._heard_at.get(d, now)))
            if dn is not None:
                new_out = self.my_out[d]
                if old_out is None or _cost_differs(new_out, old_out):
                    self._out_changed(new_out)
            if (dn is None or d == dn) and self._worth(d, _IN):
                self._dirty.add((d, _IN))
            if self.out[d] and self._worth(d, _OUT):
                self._dirty.add((d, _OUT))
        if force_to:
            for d, peers in force_to.items():
                for p in peers:
                    self._force.setdefault(p, set()).add(d)
        if not self.waves and self.ordered and cfg.ordered_coalesce_s > 0 and (self._dirty or self._force):
            if not self._flush_armed:  # ordered launches: cost news coalesced too (see "Ordered launches")
                self._flush_armed = True
                eff.append(SetTimer("announce", self._now + cfg.ordered_coalesce_s))
            return
        if not self.waves and (self._dirty or self._force):
            # free-running labels (several data nodes): a changed cost goes out at once (measured better than
            # coalescing), a new route at the same cost with the next `path_announce_s` flush
            urgent = {k for k in self._dirty if self._cost_news(*k)}
            if urgent or self._force:
                rest = self._dirty - urgent
                self._dirty = urgent
                self._flush(eff, rearm=False)
                self._dirty = rest
            if self._dirty and not self._flush_armed:
                self._flush_armed = True
                eff.append(SetTimer("announce", self._now + cfg.path_announce_s))
            return
        if (self._dirty or self._force) and not self._flush_armed:
            if cfg.announce_coalesce_s <= 0:
                self._flush(eff)
            else:
                self._flush_armed = True
                eff.append(SetTimer("announce", self._now + cfg.announce_coalesce_s + self._flush_delay()))

    def _flush_delay(self) -> float:
        """Waves: hold a label above its floor back in proportion to the gap (Dijkstra order, see doc)."""
        k = self.cfg.wave_order_s
        if k <= 0:
            return 0.0
        gap = 0.0
        for d, side in self._dirty:
            fl = self._floor.get(d)
            if fl is None:
                continue
            f = fl[0] if side is _IN else fl[1]
            lab = self.my_in.get(d) if side is _IN else self.my_out.get(d)
            if lab is not None and lab.cost != INF and f != INF and lab.cost - f > gap:
                gap = lab.cost - f
        return min(k * gap, self.cfg.wave_order_cap_s)

    def _cost_news(self, d: str, side: Side) -> bool:
        lab = self.my_in.get(d) if side == Side.IN else self.my_out.get(d)
        last = self._sent.get((d, side))
        return lab is not None and (last is None or last[0] != self.epoch[d]
                                    or _cost_differs(lab, Label(d, side, last[1], ())))

    def _worth(self, d: str, side: Side) -> bool:
        lab = self.my_in.get(d) if side is _IN else self.my_out.get(d)
        if lab is None or (lab.cost == INF and (self.waves or (d, side) not in self._sent)):
            return False
        last = self._sent.get((d, side))
        if not self.waves:  # free-running labels: every change, rises included
            return last is None or last[0] != self.epoch[d] or _cost_differs(lab, Label(d, side, last[1], ())) \
                or lab.path != last[2]
        if last is None or last[0] != self.epoch[d]:
            return True
        return lab.cost < last[1] - EPS or (lab.cost <= last[1] + EPS and lab.path != last[2])

    def _flush(self, eff: list[Effect], rearm: bool = True) -> None:
        if rearm:
            self._flush_armed = False
        if len(self._dirty) == 1 and not self._force:
            # the common case: one label, to every peer that takes it (the same as below, without the outbox)
            d, side = next(iter(self._dirty))
            self._dirty.clear()
            if self._worth(d, side):
                lab = self.my_in[d] if side is _IN else self.my_out[d]
                e = self.epoch[d]
                self._sent[(d, side)] = (e, lab.cost, lab.path)
                msg = CostAnnounce((_wire(lab, e),))
                _send_all(eff, self._in_recipients(d) if side is _IN else sorted(self.out[d]), msg)
            return
        outbox: dict[str, list[Label]] = {}
        sent_out: set[tuple[str, str]] = set()
        for d, side in sorted(self._dirty):
            if not self._worth(d, side):
                continue
            lab = self.my_in[d] if side is _IN else self.my_out[d]
            e = self.epoch[d]
            self._sent[(d, side)] = (e, lab.cost, lab.path)
            w = _wire(lab, e)
            if side is _IN:
                for p in self.cfg.prev_costs:
                    if p in self._data_prev and p != d:
                        continue  # another data node has no use for this commodity's labels
                    outbox.setdefault(p, []).append(w)
            else:
                for j in self.out[d]:
                    outbox.setdefault(j, []).append(w)
                    sent_out.add((j, d))
        self._dirty.clear()
        for p in sorted(self._force):
            for d in sorted(self._force[p]):
                lab = self.my_out.get(d)
                if (p, d) in sent_out or lab is None or lab.cost == INF:
                    continue
                outbox.setdefault(p, []).append(_wire(lab, self.epoch[d]))
        self._force.clear()
        made: dict[tuple[int, ...], CostAnnounce] = {}  # peers told the same labels share one message object
        for peer in sorted(outbox):
            labs = outbox[peer]
            key = tuple(map(id, labs))
            msg = made.get(key)
            if msg is None:
                msg = made[key] = CostAnnounce(tuple(labs))
            eff.append(Send(peer, msg))

    def _in_recipients(self, d: str) -> list[str]:
        """Who is told this node's IN label of `d`, sorted (see `_flush`); cached per config."""
        cached = self._recipients.get(d)
        if cached is None or cached[0] is not self.cfg:
            dp = self._data_prev
            cached = self._recipients[d] = (self.cfg, sorted(p for p in self.cfg.prev_costs
                                                             if not (p in dp and p != d)))
        return cached[1]

    def _refresh_all(self, eff: list[Effect], force_to=None) -> None:
        self._refresh(self.cfg.commodities, eff, force_to)

    # ------------------------------------------------------------ entry points
    def start(self, now: float) -> list[Effect]:
        eff: list[Effect] = []
        self._now = now
        if self.cfg.is_data:
            self._new_epoch(now, eff)  # the first wave: the data node announces its sink label
        else:
            self._refresh_all(eff)
        if self.cfg.joined and not self.cfg.is_data:
            self.greedy_until = now + self.cfg.change_improve_rounds * self.cfg.round_s
        phase = self.rng.uniform(0.0, self.cfg.round_s)
        eff.append(SetTimer("tick", now + phase))
        return eff

    def on_timer(self, now: float, key: str) -> list[Effect]:
        eff: list[Effect] = []
        self._now = now
        if key == "announce":
            self._flush(eff)
        if key == "stuck" and self.cfg.is_data:
            self._maybe_stuck(now, eff)
        if key == "tick":
            eff.append(SetTimer("tick", now + self.cfg.round_s))
            if self.cfg.is_data:
                self._maybe_lost_settlement(now, eff)
                self._maybe_retry_wave(now, eff)
            self.rejects_in_row = 0
            if self.move is not None and now >= self.move.deadline:
                self.move = None  # the peer never answered: give up the move
            if (self.cfg.improve or now < self.greedy_until) and not self.cfg.is_data and self.move is None \
                    and self._quiet():
                self._start_query(now, eff)
            if self.relabel and not self.cfg.is_data and self._data_prev and self.move is None and self._quiet():
                self._maybe_relabel(now, eff)
        self._act(now, eff)
        return eff

    def on_message(self, now: float, sender: str, msg) -> list[Effect]:
        self._now = now
        if type(msg) is CostAnnounce and len(msg.labels) == 1 and not self.cfg.is_data:
            # the bulk of a wave: one next-stage IN label of the current wave, most of which change nothing
            # here (what _on_announce does, without its generality)
            lab = msg.labels[0]
            d = lab.commodity
            lin = self.lin.get(d)
            cfg = self.cfg
            if lab.side is _IN and lin is not None and lab.epoch == self.epoch[d] \
                    and sender in cfg.next_costs and sender not in self._removed:
                lin[sender] = lab
                # `_fold_in`'s first test, inline: no news when `sender` is not the current choice and its
                # candidate is no cheaper than the cached best forward ones (cache still valid)
                cache = self._cache.get(d)
                if cache is not None:
                    sig, f_out, _, f_in, _, room = cache
                    inn = self.inn
                    if sig[1] is cfg and sig[0] == self.epoch[d] and len(inn) == 1 and sig[2] == inn[d] \
                            and f_out is not None and f_out[1] != sender and (f_in is None or f_in[1] != sender):
                        if lab.cost == INF:
                            return []
                        c = cfg.next_costs[sender] + lab.cost
                        if c >= f_out[0] - EPS and (not room or (f_in is not None and c >= f_in[0] - EPS)):
                            return []
                r = self._fold_in(d, sender)
                if r == 1:
                    return []
                eff: list[Effect] = []
                self._refresh((d,), eff, folds={d: []} if r == 2 else None)
                self._act(now, eff)
                return eff
        eff = []
        handler = _HANDLERS.get(type(msg))
        if handler is None or sender in self._removed:
            self.stats.ignored += 1  # unknown, or from a removed peer (sent before it was removed)
            return eff
        handler(self, now, sender, msg, eff)
        if self._idle:
            self._idle = False
        else:
            self._act(now, eff)
        return eff

    # ------------------------------------------------------------ membership changes
    def add_neighbour(self, now: float, peer: str, cost: float, side: str) -> list[Effect]:
        """`peer` is now linked to this node as a next-stage ("next"), previous-stage ("prev") or same-stage
        ("peer") neighbour; for "next"/"prev" `cost` is d(self, peer).  Adding a known neighbour again only
        updates its cost.  See "Membership changes" in the module doc."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        eff: list[Effect] = []
        self._now = now
        cfg = self.cfg
        if peer == cfg.node_id:
            return eff
        self._removed.discard(peer)
        self._membership_changed()
        if side == "peer":
            if peer not in cfg.peers:
                self.cfg = replace(cfg, peers=cfg.peers + (peer,))
        if not cfg.is_data:
            # flows may now be cheaper elsewhere: greedy moves for a while (see "Membership changes")
            self.greedy_until = max(self.greedy_until, now + cfg.change_improve_rounds * cfg.round_s)
        if side == "peer":
            return eff
        costs = dict(cfg.next_costs if side == "next" else cfg.prev_costs)
        known = peer in costs
        costs[peer] = float(cost)
        self.cfg = replace(cfg, **{f"{side}_costs": costs})
        self._data_prev = tuple(p for p in self.cfg.prev_costs if p in self.cfg.commodities)
        touched: set[str] = set()
        want = Side.IN if side == "next" else Side.OUT
        for (d, s_), wire in sorted(self._stash.get(peer, {}).items()):
            if s_ == want and self._ingest(peer, wire):
                touched.add(d)
        if side == "prev" and not known:
            # the newcomer needs our IN labels to route through us; they went out before it was there
            labs = []
            for d in cfg.commodities:
                lab = self.my_in.get(d)
                if lab is None or lab.cost == INF or (peer in cfg.commodities and peer != d):
                    continue
                labs.append(_wire(lab, self.epoch[d]))
            if labs:
                eff.append(Send(peer, CostAnnounce(tuple(labs))))
        self._refresh_all(eff)
        self._act(now, eff)
        return eff

    def set_cost(self, now: float, peer: str, cost: float) -> list[Effect]:
        """d(self, peer) was measured again.  Within a label wave a rise is not announced (see the module doc)."""
        eff: list[Effect] = []
        self._now = now
        cfg = self.cfg
        changes = {}
        if peer in cfg.next_costs:
            changes["next_costs"] = {**cfg.next_costs, peer: float(cost)}
        if peer in cfg.prev_costs:
            changes["prev_costs"] = {**cfg.prev_costs, peer: float(cost)}
        if changes:
            self.cfg = replace(cfg, **changes)
            self._refresh_all(eff)
            self._act(now, eff)
        return eff

    def remove_neighbour(self, now: float, peer: str) -> list[Effect]:
        """`peer` crashed or left: forget it on every side.  Units this node sent to it are unpaired again and
        re-routed; units it sent to this node are withdrawn downstream; requests and moves pending with it are
        dropped; its later messages are ignored.  See "Membership changes" in the module doc."""
        eff: list[Effect] = []
        self._now = now
        cfg = self.cfg
        self._stash.pop(peer, None)
        self._bid_heard.pop(peer, None)  # a data node gone: its last bid must not hold relabelling back
        if peer not in cfg.next_costs and peer not in cfg.prev_costs and peer not in cfg.peers:
            return eff
        self._removed.add(peer)
        self._membership_changed()
        self.cfg = replace(cfg, next_costs={p: c for p, c in cfg.next_costs.items() if p != peer},
                           prev_costs={p: c for p, c in cfg.prev_costs.items() if p != peer},
                           peers=tuple(p for p in cfg.peers if p != peer))
        self._data_prev = tuple(p for p in self.cfg.prev_costs if p in self.cfg.commodities)
        lost_out = False
        for d in cfg.commodities:
            n_out = self.out[d].pop(peer, 0)
            n_in = self.inn[d].pop(peer, 0)
            lost_out = lost_out or n_out > 0
            if n_out or n_in:
                self._changed(now)
            self.lin[d].pop(peer, None)
            self.lout[d].pop(peer, None)
        for rid in [rid for rid, p in self.pending.items() if p.peer == peer]:
            if self.pending.pop(rid).kind == "token":
                self.token_pending = False
        self._force.pop(peer, None)
        if self.query_target == peer:
            self.query_target = None
        if self.move is not None and peer in (self.move.peer, self.move.a, self.move.b):
            self.move = None
        if not cfg.is_data:
            self.greedy_until = max(self.greedy_until, now + cfg.change_improve_rounds * cfg.round_s)
        if cfg.is_data:
            d = cfg.node_id
            if lost_out:
                self.launch_pending = 0  # the unit in flight may have been with it: no settlement will come
            if self.waves:
                self._new_epoch(now, eff)  # labels rose: recompute them all (the demand is re-placed on it)
                self._act(now, eff)
                return eff
            if lost_out and self.next_launch == INF:
                self.next_launch = now
        self._refresh_all(eff)
        self._act(now, eff)
        return eff

    # ------------------------------------------------------------ acting on state
    def _quiet(self) -> bool:
        return not self.pending and all(self.imbalance(d) == 0 for d in self.cfg.commodities)

    def _act(self, now: float, eff: list[Effect]) -> None:
        if self.cfg.is_data:
            self._maybe_launch(now, eff)
            return
        if self.relabel:
            self._relabel_costs(eff)
        if now < self.grace_until:
            if any(self.imbalance(d) for d in self.cfg.commodities):
                eff.append(SetTimer("balance", self.grace_until))
            return
        if self.token_pending or (self.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT and not self._walk):
            return
        if self.used() > self.cfg.capacity:
            self._shed_one(now, eff)
            return
        for d in self.cfg.commodities:
            imb = self.imbalance(d)
            if imb > 0:
                self._dispatch(now, d, eff)
                return
            if imb < 0:
                self._withdraw_one(now, d, eff)
                return

    def _dispatch(self, now: float, d: str, eff: list[Effect]) -> None:
        """Move one unpaired unit along the OUT label: forward it, or DENY it back."""
        dec = self.dec_out.get(d)
        if self._walking() and self._gate(now, d, dec, eff):
            return
        if self.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
            return
        if dec is None:
            # no route known (yet: a new wave may be on its way): wait a little, then hand it back upstream
            since = self._noroute_since.setdefault(d, now)
            if now < since + self.cfg.noroute_grace_s:
                eff.append(SetTimer("balance", since + self.cfg.noroute_grace_s))
                return
            ups = sorted(p for p, n in self.inn[d].items() if n > 0)
            if not ups:
                return
            dec = ("B", ups[0])
        self._noroute_since.pop(d, None)
        kind, peer = dec
        if kind == "F":
            rid = self._id()
            self.pending[rid] = _Pending("token", peer, d)
            self.token_pending = True
            eff.append(Send(peer, RequestFlow(rid, d, self.lin[d][peer].cost)))
        else:
            _dec(self.inn[d], peer)
            self._changed(now)
            eff.append(Send(peer, Deny(d, DenyReason.NO_ROUTE)))
            self._log(d, ("bk", peer))
            self._refresh_all(eff)
            self._act(now, eff)

    # ------------------------------------------------------------ several units per wave
    def _walking(self) -> bool:
        return self.waves and self.cfg.same_wave_launches

    def _log(self, d: str, step: tuple) -> None:
        if self._walking():
            self._walk.setdefault(d, []).append(step)
            self._walked[d] = self.epoch[d]

    def _next_wave(self, d: str) -> None:
        """A new wave of `d`: this wave's lowest labels become the floor the next one cannot go below."""
        self._floor[d] = (self._pot_in.pop(d, INF), self._pot_out.pop(d, INF))

    def _arm_stuck(self, now: float, eff: list[Effect]) -> None:
        """Data node: if the launched unit has not settled by then, start a new wave (it is held somewhere)."""
        wave = (self.first_out_at - self.epoch_started) if self.first_out_at is not None else self.cfg.round_s
        self._stuck_epoch = self.epoch[self.cfg.node_id]
        eff.append(SetTimer("stuck", now + self.cfg.launch_settle_s + 2 * wave))

    def _maybe_stuck(self, now: float, eff: list[Effect]) -> None:
        d = self.cfg.node_id
        if self._stuck_epoch == self.epoch[d] and (self.launch_pending > 0 or self.token_pending) \
                and self._stuck_waves < MAX_STUCK_WAVES:
            self._stuck_waves += 1
            self._new_epoch(now, eff)
            self._arm_stuck(now, eff)

    def _membership_changed(self) -> None:
        """A neighbour came or went: this wave's steps and potentials say nothing reliable any more; the
        old way (route on the labels at any cost) until the next wave."""
        for d in self.cfg.commodities:
            self._gave_up[d] = self.epoch[d]
            self._hold.pop(d, None)
            self._walk.pop(d, None)

    def _tight(self, d: str) -> bool:
        """Data node: its OUT label is still the wave's (the potential): a launch now is a shortest path."""
        lab = self.my_out.get(d)
        return lab is not None and lab.cost != INF and lab.cost <= self._pot_out.get(d, INF) + EPS

    def _gate(self, now: float, d: str, dec, eff: list[Effect]) -> bool:
        """Same-wave launches: True when the unpaired unit must not move on along `dec` now.

        No tight route (the OUT label rose above the wave's potential): retreat
        (`_retreat`); if that is not possible, hold the unit for the next wave
        (the data node starts one when its launch does not settle, "stuck"),
        and move it only once the labels of that wave have been still here for
        a while (as the data node waits before it launches)."""
        held = self._hold.get(d)
        e = self.epoch[d]
        if held is not None and held == e:
            # still no new wave (after a membership change nobody may start one): after a while, the old way
            until = self._quiet_at.get(d, INF)
            if now < until:
                eff.append(SetTimer("balance", until))
                return True
            del self._hold[d]
            self._gave_up[d] = e  # and for the rest of this wave
            return False
        if held is not None:
            qa = self._quiet_at.get(d, INF)
            if now < qa:
                if qa != INF:
                    eff.append(SetTimer("balance", qa))
                return True
            del self._hold[d]
        if dec is not None and self.my_out[d].cost <= self._pot_out.get(d, INF) + EPS:
            return False
        if self._gave_up.get(d) == e:
            return False
        if self._walk.get(d):
            n = self._retreats.get(d, (e, 0))
            n = n[1] + 1 if n[0] == e else 1
            self._retreats[d] = (e, n)
            if n > MAX_RETREATS_PER_WAVE:
                self._gave_up[d] = e  # a loop (stale steps after a membership change): the old way
                return False
            if self._retreat(now, d, eff):
                return True
        if self._walked.get(d) == e and self._gave_up.get(d) != e:
            self._hold[d] = e
            self._quiet_at[d] = now + self.cfg.retry_epoch_rounds * self.cfg.round_s
            eff.append(SetTimer("balance", self._quiet_at[d]))
            return True
        return False

    def _retreat(self, now: float, d: str, eff: list[Effect]) -> bool:
        """A unit here has no tight route any more: undo the step that brought it (see "Several units").

        The reverse of a step taken on this wave is tight, so the flow keeps
        its optimality; the unit then tries the neighbour it came from, which
        learns of the rise from our rejection if it asks us again."""
        walk = self._walk.get(d)
        if walk and walk[-1][0] in ("in", "rin"):
            step = walk.pop()
            if step[0] == "in" and self.inn[d].get(step[1], 0) > 0:
                _dec(self.inn[d], step[1])
                self._changed(now)
                eff.append(Send(step[1], Deny(d, DenyReason.NO_ROUTE)))
                self._refresh_all(eff)
                self._act(now, eff)
                return True
            if step[0] == "rin" and step[1] in self.cfg.next_costs:
                # it handed us the unit along the residual arc of our OUT label: tell it that label rose
                lab = self.my_out.get(d)
                if lab is not None:
                    eff.append(Send(step[1], CostAnnounce((_wire(lab, self.epoch[d]),))))
                rid = self._id()
                self.pending[rid] = _Pending("forced", step[1], d)
                eff.append(Send(step[1], RequestFlow(rid, d, 0.0, forced=True)))
                return True
        # the last step here was a unit leaving ("fwd", "thru", "bk"): the one we hold came otherwise, and
        # undoing older steps would unwind units that already settled: hold it for the next wave instead
        return False

    def _walk_back(self, now: float, sender: str, msg: RequestFlow, eff: list[Effect]) -> bool:
        """A forced Request Flow that undoes a step of ours (`_retreat` at `sender`): take the unit back and,
        if it only passed through here (displacement), hand it back to where it came from."""
        d = msg.commodity
        walk = self._walk.get(d)
        if not walk:
            return False
        top = walk[-1]
        if not ((top[0] == "thru" and top[2] == sender) or (top[0] == "bk" and top[1] == sender)):
            return False
        walk.pop()
        _inc(self.inn[d], sender)
        self._changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if top[0] == "thru" and _dec(self.inn[d], top[1]):
            eff.append(Send(top[1], Deny(d, DenyReason.NO_ROUTE)))
        self._refresh_all(eff)
        return True

    def _shed_one(self, now: float, eff: list[Effect]) -> None:
        """Over capacity (an agreed move raced with new work): hand the dearest inflow back."""
        cands = [(self.cfg.prev_costs[p], d, p) for d in self.cfg.commodities for p, n in self.inn[d].items() if n > 0]
        _, d, p = max(sorted(cands))
        _dec(self.inn[d], p)
        self._changed(now)
        eff.append(Send(p, Deny(d, DenyReason.NO_ROUTE)))
        self._refresh_all(eff)
        self._act(now, eff)

    def _withdraw_one(self, now: float, d: str, eff: list[Effect]) -> None:
        """Too much outflow: take back the unit on the dearest downstream route."""
        def dearness(j: str) -> float:
            lab = self.lin[d].get(j)
            return self.cfg.next_costs[j] + (lab.cost if lab is not None else INF)
        cands = [j for j, n in self.out[d].items() if n > 0]
        if not cands:
            return
        j = max(sorted(cands), key=dearness)
        rid = self._id()
        self.pending[rid] = _Pending("withdraw", j, d)
        eff.append(Send(j, Withdraw(rid, d)))

    def _new_epoch(self, now: float, eff: list[Effect]) -> None:
        """Data node: start a label wave; every label of this commodity is recomputed from scratch."""
        d = self.cfg.node_id
        self.epoch[d] += 1
        self.lin[d].clear()
        self.lout[d].clear()
        self._cache.pop(d, None)
        self._next_wave(d)
        self.epoch_launches = 0
        self.epoch_started = now
        self.first_out_at = None
        self.next_launch = INF
        self._refresh([d], eff)
        if self._flush_armed or self._dirty:
            self._flush(eff)  # the wave starts now
        if not self.waves:
            self.next_launch = now

    def _out_changed(self, lab: Label) -> None:
        """Data node: its OUT label moved; launch once it has been still for a while."""
        now = self._now
        if not self.waves:
            return
        if lab.cost == INF:
            self.next_launch = INF
            return
        if self.first_out_at is None:
            self.first_out_at = now
        # the time the wave took; a route that shows up long after (a node joined) does not make the data node
        # wait that long: capped at `retry_epoch_rounds` (a wave of a static run takes well under a round)
        wave = min(self.first_out_at - self.epoch_started, self.cfg.retry_epoch_rounds * self.cfg.round_s)
        self.next_launch = now + max(self.cfg.launch_settle_s, self.cfg.launch_quiet_factor * wave)

    def _maybe_lost_settlement(self, now: float, eff: list[Effect]) -> None:
        """Tick of a data node: a launched unit whose settlement will not come counts as settled.

        Units are counts, so a launched unit can cancel against a hole on its way: a relay whose inflow was
        withdrawn or removed (a membership change) keeps the outflow for `balance_grace_s`, and a unit arriving
        then pairs with it.  The route is complete, but no Request Flow reaches the sink, so the data node
        would wait for the settlement forever (with waves: `next_launch` stays INF, no new wave).  Every unit
        sent out being back (inflow >= outflow) while nothing changed here for `retry_epoch_rounds` says that
        the unit is not in flight any more.  (Withdrawing the hole at once when a unit arrives keeps the
        signal, but also breaks the pairing of agreed moves: measured worse on Table V setting 3 under churn.)
        """
        d = self.cfg.node_id
        if self.launch_pending <= 0 or self.token_pending or self.pending:
            return
        if now - self.stats.last_change < self.cfg.retry_epoch_rounds * self.cfg.round_s:
            return
        if _dsum(self.inn[d]) >= _dsum(self.out[d]):
            self._settled(now, eff)

    def _maybe_retry_wave(self, now: float, eff: list[Effect]) -> None:
        """Tick of a data node: start a new wave when stuck (a rejected launch, or no route while
        other data nodes may free capacity)."""
        d = self.cfg.node_id
        if not self.waves or self.token_pending or self.launch_pending > 0 or _dsum(self.out[d]) >= self.demand:
            return
        if now - self.epoch_started < self.cfg.retry_epoch_rounds * self.cfg.round_s:
            return
        lab = self.my_out.get(d, _NO_LABEL)
        # no route: with several data nodes others may free capacity; with one, a flow changed here since the
        # wave (a membership change elsewhere: a Withdraw reached the sink, a re-routed unit arrived) may have
        # opened a route that this wave's labels, which only fall, cannot show
        changed = self.stats.last_change > self.epoch_started + EPS
        stuck = self.rejects_in_row > 0 or (lab.cost == INF and (len(self.cfg.commodities) > 1 or changed))
        if stuck:
            self._new_epoch(now, eff)

    def _update_bid(self, now: float, eff: list[Effect]) -> None:
        """Ordered launches, data node: announce the cost of its next launch when it changed (frozen while a
        launch is out: the data node in flight keeps the lowest bid, so the others wait for it)."""
        if self.token_pending or self.launch_pending > 0:
            return
        d = self.cfg.node_id
        lab = self.my_out.get(d)
        cost = lab.cost if lab is not None and self.dec_out.get(d) is not None and self._out_eff(d) < self.demand \
            else INF
        last = self._bid_cost
        if last is None and cost == INF:
            return  # an unknown bid and an infinite one mean the same to the others
        if last is not None and abs(cost - last) <= EPS or (cost == INF and last == INF):
            return
        if now < self._bid_at + self.cfg.path_announce_s:  # at most one bid per path_announce_s (labels may flap)
            eff.append(SetTimer("bid", self._bid_at + self.cfg.path_announce_s))
            return
        self._bid_seq += 1
        self._bid_cost, self._bid_at = cost, now
        if self._bid_first_at is None:
            self._bid_first_at = now
        msg = LaunchBid(d, self._bid_seq, cost)
        for j in sorted(self.cfg.next_costs):
            eff.append(Send(j, msg))

    def _my_turn(self, now: float, eff: list[Effect]) -> bool:
        """Ordered launches: launch only when no other data node bids less (ties: the smaller id), and once
        our own bid has been out for `launch_settle_s`; a cheaper bid unchanged for `bid_patience_rounds` (its
        data node may be stuck or gone) is ignored."""
        cfg = self.cfg
        mine = self._bid_cost
        if mine is None or mine == INF:
            return True  # not announced yet (a route this instant): nothing to compare
        if self._bid_first_at is None:
            self._bid_first_at = now  # the same bid as before the last launch: not sent again
        wait = self._bid_first_at + cfg.ordered_settle_s  # let the others' bids arrive first
        if now >= wait:
            wait = INF
            me = cfg.node_id
            patience = cfg.bid_patience_rounds * cfg.round_s
            for e, (_, c, t) in self._bids.items():
                if c < mine - EPS or (c <= mine + EPS and e < me):
                    if now < t + patience:
                        wait = min(wait, t + patience)
        if wait == INF:
            return True
        eff.append(SetTimer("launch", wait))
        return False

    def _on_launch_bid(self, now: float, sender: str, msg: LaunchBid, eff: list[Effect]) -> None:
        """A data node hears another's bid; a relay passes a bid on, once per seq, to its data-node neighbours."""
        origin = msg.data_node
        if self.cfg.is_data:
            old = self._bids.get(origin)
            if origin == self.cfg.node_id or (old is not None and msg.seq <= old[0]):
                self._idle = True
                return
            self._bids[origin] = (msg.seq, msg.cost, now)
            return
        self._idle = True
        if msg.seq <= self._bid_seen.get(origin, 0):
            return
        self._bid_seen[origin] = msg.seq
        self._bid_heard[origin] = msg.cost
        cms = self.cfg.commodities
        targets = {p for p in self.cfg.prev_costs if p in cms} | {j for j in self.cfg.next_costs if j in cms}
        for p in sorted(targets - {sender, origin}):
            eff.append(Send(p, msg))

    # ------------------------------------------------------------ relabelling (several data nodes)
    def _relabel_costs(self, eff: list[Effect]) -> None:
        """Relay: recompute, per pair (A, B), the cheapest change of the hop back to a data node when one unit of A
        sent from here on becomes B's, along the current flow; tell prev relays what changed (RelabelCost)."""
        cfg = self.cfg
        cms = cfg.commodities
        nxt = cfg.next_costs
        changed: list[RelabelCost] = []
        for a in cms:
            outs = self.out[a]
            for b in cms:
                if b == a:
                    continue
                key = (a, b)
                best, arg = INF, None
                rl = self._rl.get(key, {})
                for j in sorted(outs):
                    if outs[j] <= 0:
                        continue
                    if j in cms:  # last stage: the unit would go back to b instead of j (= a)
                        v = nxt[b] - nxt[j] if b in nxt and j in nxt else INF
                    else:
                        v = rl.get(j, INF)
                    if v < best - EPS:
                        best, arg = v, j
                self._r[key] = (best, arg)
                last = self._r_sent.get(key)
                if last is None and best == INF:
                    continue
                if last is None or (best == INF) != (last == INF) or (best != INF and abs(best - last) > EPS):
                    self._r_sent[key] = best
                    changed.append(RelabelCost(a, b, best))
        if changed:
            for p in sorted(cfg.prev_costs):
                if p not in cms:
                    for msg in changed:
                        eff.append(Send(p, msg))
            if self.cross:
                self._refresh_all(eff)

    def _maybe_relabel(self, now: float, eff: list[Effect]) -> None:
        """First-stage relay, quiet, on its tick: turn one unit of data node A that it receives into data node B's
        when B's hop to here plus the change of the hop back (RelabelCost) is cheaper than A's."""
        cfg = self.cfg
        if self._relabelled >= cfg.relabel_limit:
            return
        if self.ordered and any(c != INF for c in self._bid_heard.values()):
            return  # a data node will still launch: relabelling now would change the routes it is shown
        best, pick = -EPS, None
        for a in self._data_prev:
            if self.inn[a].get(a, 0) <= 0:
                continue
            for b in self._data_prev:
                if b == a:
                    continue
                r, via = self._r.get((a, b), (INF, None))
                if via is None or r == INF:
                    continue
                gain = cfg.prev_costs[b] - cfg.prev_costs[a] + r
                if gain < best - EPS:
                    best, pick = gain, (a, b)
        if pick is None:
            return
        a, b = pick
        self._relabelled += 1
        _dec(self.inn[a], a)
        _inc(self.inn[b], b)
        eff.append(Send(a, Relabel(a, b)))
        eff.append(Send(b, Relabel(a, b)))
        self._relabel_down(now, a, b, eff)

    def _relabel_down(self, now: float, a: str, b: str, eff: list[Effect]) -> None:
        """One unit of `a` received here is now `b`'s: relabel one we send on, along the cheapest RelabelCost (a unit
        for the last stage goes back to `b` instead).  Without an `a` unit to relabel, the imbalance this leaves is
        repaired like any other (Request Flow / Withdraw)."""
        cms = self.cfg.commodities
        _, j = self._r.get((a, b), (INF, None))
        if j is None or self.out[a].get(j, 0) <= 0:
            j = next((k for k in sorted(self.out[a]) if self.out[a][k] > 0), None)
        if j is not None:
            _dec(self.out[a], j)
            if j in cms:  # last stage: back to b instead of a
                if b in self.cfg.next_costs:
                    _inc(self.out[b], b)
                    eff.append(Send(b, Relabel(a, b)))
                eff.append(Send(j, Relabel(a, b)))
            else:
                _inc(self.out[b], j)
                eff.append(Send(j, Relabel(a, b)))
        self._changed(now)
        self._refresh_all(eff)

    def _on_relabel(self, now: float, sender: str, msg: Relabel, eff: list[Effect]) -> None:
        a, b = msg.from_commodity, msg.to_commodity
        if a not in self.inn or b not in self.inn:
            self._idle = True
            return
        if self.cfg.is_data:
            me = self.cfg.node_id
            if sender in self.cfg.next_costs:  # a first-stage relay: a unit we send it
                if a == me:
                    _dec(self.out[a], sender)
                if b == me:
                    _inc(self.out[b], sender)
            elif sender in self.cfg.prev_costs:  # a last-stage relay: a unit it sends us
                if a == me:
                    _dec(self.inn[a], sender)
                if b == me:
                    _inc(self.inn[b], sender)
            self._changed(now)
            self._refresh_all(eff)
            return
        if not _dec(self.inn[a], sender):
            # The unit is not here any more: we handed it back (Deny) or it was relabelled meanwhile, and the
            # sender, crossing that, already counts it as `b`'s on this link.  Hand the `b` unit back so that both
            # ends agree (an ignored Relabel left the link inconsistent: setting 6 seed 3, 10 % of relays killed).
            self.stats.ignored += 1
            eff.append(Send(sender, Deny(b, DenyReason.NO_ROUTE)))
            return
        _inc(self.inn[b], sender)
        self._relabel_down(now, a, b, eff)

    def _on_relabel_cost(self, now: float, sender: str, msg: RelabelCost, eff: list[Effect]) -> None:
        self._idle = True  # only a first-stage relay's tick acts on these; others pass them on in _relabel_costs
        if sender not in self.cfg.next_costs:
            return
        self._rl.setdefault((msg.from_commodity, msg.to_commodity), {})[sender] = msg.cost
        self._relabel_costs(eff)

    def _maybe_launch(self, now: float, eff: list[Effect]) -> None:
        d = self.cfg.node_id
        if self.ordered:
            self._update_bid(now, eff)
        if self.token_pending or self.launch_pending > 0:
            return
        # pending forced requests count (a Reroute of an agreed Redirect is on its way to the new first hop)
        if self._out_eff(d) >= self.demand or self.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
            return
        dec = self.dec_out.get(d)
        if dec is None or self.next_launch == INF:
            return
        if now < self.next_launch:
            eff.append(SetTimer("launch", self.next_launch))
            return
        if self.ordered:
            if not self._my_turn(now, eff):
                return
            self._bid_first_at = None
        j = dec[1]
        rid = self._id()
        self.pending[rid] = _Pending("token", j, d)
        self.token_pending = True
        if self.waves:
            self.epoch_launches += 1
            if self._walking():
                self._stuck_waves = 0
                self._arm_stuck(now, eff)
            self._relaunch_at = self.next_launch  # restored if the launch is rejected
            self.next_launch = INF  # the next launch waits for the wave its settlement starts
        eff.append(Send(j, RequestFlow(rid, d, self.lin[d][j].cost)))

    def _settled(self, now: float, eff: list[Effect], arrived: bool = False) -> None:
        """A data node's launched unit arrived or came back: a new wave, then the next unit.

        The unit can reach the sink before the first hop's approval is back at
        the data node, so the count may dip below zero for a moment; launching
        waits while it is positive.

        A unit that was not launched also settles here (re-routed after a
        membership change and arriving at the sink, or DENYed back to the data
        node): it starts a new wave (flows changed) but is not counted while no
        launch is outstanding.  Counting it (-1) used to pre-settle the *next*
        launch: its approval brought the count to 0, so when that unit then
        paired with a hole on its way and never reached the sink,
        `_maybe_lost_settlement` (which needs a launch outstanding) did not
        fire and, with waves, `next_launch` stayed INF for good.
        """
        launched = self.launch_pending > 0 or self.token_pending
        if self.launch_pending > 0:
            self.launch_pending -= 1
        elif self.token_pending:
            self.launch_pending = -1  # the launch in flight reached the sink before its approval came back
        if self.waves:
            d = self.cfg.node_id
            if arrived and launched and self._walking() and self._tight(d) and self._out_eff(d) < self.demand \
                and self._gave_up.get(d) != self.epoch[d]:
                self.next_launch = now  # the wave still has a tight route: the next unit goes on it
                return
            self._new_epoch(now, eff)
        else:
            self.next_launch = now + (self.cfg.ordered_settle_s if self.ordered else self.cfg.launch_settle_s)
            eff.append(SetTimer("launch", self.next_launch))

    # ------------------------------------------------------------ handlers
    def _ingest(self, sender: str, wire: Label) -> bool:
        """Store a neighbour's label; a label of a newer wave clears that commodity's older ones."""
        d = wire.commodity
        if d not in self.lin:
            return False
        if sender not in (self.cfg.next_costs if wire.side == Side.IN else self.cfg.prev_costs):
            if sender not in self._removed and sender != self.cfg.node_id:
                if sender not in self._stash and len(self._stash) >= MAX_STASHED_SENDERS:
                    self._stash.pop(next(iter(self._stash)))
                self._stash.setdefault(sender, {})[(d, wire.side)] = wire
            return False
        e, lab = wire.epoch, wire  # stored as received: the epoch field is only read here and re-stamped on send
        cur = self.epoch[d]
        if e < cur:
            self.stats.ignored += 1
            return False
        if e > cur:
            if self.cfg.is_data and d == self.cfg.node_id:
                return False  # only the data node starts waves of its commodity
            self.epoch[d] = e
            self.lin[d].clear()
            self.lout[d].clear()
            self._cache.pop(d, None)
            self._next_wave(d)
            self._walk.pop(d, None)
            self._heard_at[d] = self._now
        if wire.side == Side.IN:
            self.lin[d][sender] = lab
        else:
            self.lout[d][sender] = lab  # the cached back candidates are stale: the caller refreshes (_fold_out)
        return True

    def _on_announce(self, now: float, sender: str, msg: CostAnnounce, eff: list[Effect]) -> None:
        labels = msg.labels
        if len(labels) == 1 and labels[0].side == Side.IN and not self.cfg.is_data:
            # the common case (a wave): one next-stage IN label, folded in O(1); most change nothing here
            lab = labels[0]
            d = lab.commodity
            if not self._ingest(sender, lab):
                return
            r = self._fold_in(d, sender)
            if r == 1:
                self._idle = True  # no label moved: nothing for _act to do
                return
            self._refresh((d,), eff, folds={d: []} if r == 2 else None)
            return
        touched: dict[str, None] = {}
        folds: dict[str, list[str]] = {}
        backs: set[str] = set()
        for lab in msg.labels:
            d = lab.commodity
            if self._ingest(sender, lab):
                touched[d] = None
                if lab.side == Side.IN:
                    f = folds.setdefault(d, [])
                    if f is not None:
                        f.append(sender)
                else:
                    folds.setdefault(d, [])
                    backs.add(d)  # an OUT label (upstream): the back candidates again (_fold_out)
        if touched:
            self._refresh(touched, eff, folds=folds, backs=backs)

    def _on_request_flow(self, now: float, sender: str, msg: RequestFlow, eff: list[Effect]) -> None:
        d = msg.commodity
        cfg = self.cfg
        if sender not in cfg.prev_costs or d not in self.inn:
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NOT_LINKED, None)))
            return
        if cfg.is_data:
            if d != cfg.node_id:
                eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, None)))
                return
            _inc(self.inn[d], sender)  # the sink always takes its own units
            self._changed(now)
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
            if not msg.forced:
                self._settled(now, eff, arrived=True)
            return
        if msg.forced and self._walk_back(now, sender, msg, eff):
            return
        if msg.forced:
            _inc(self.inn[d], sender)
            self._changed(now)
            self.grace_until = max(self.grace_until, now + cfg.balance_grace_s)
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
            self._refresh_all(eff)
            return
        lab = self.my_in.get(d, _NO_LABEL)
        if lab.cost == INF:
            self.stats.rejects += 1
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY, _wire(lab, self.epoch[d]))))
            return
        if abs(lab.cost - msg.expected_cost) > EPS:
            self.stats.rejects += 1
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.COST_CHANGED, _wire(lab, self.epoch[d]))))
            return
        dec = self.dec_in[d]
        if dec is not None and dec[0] == "B" and dec[1] == sender:
            # taking the unit would displace the requester's own unit: a no-op it must not retry
            self.stats.rejects += 1
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_CAPACITY,
                                           _wire(Label(d, Side.IN, INF, ()), self.epoch[d]))))
            return
        _inc(self.inn[d], sender)
        self._changed(now)
        eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
        if dec is not None and dec[0] == "B":
            _dec(self.inn[d], dec[1])
            eff.append(Send(dec[1], Deny(d, DenyReason.DISPLACED)))
            self._log(d, ("thru", sender, dec[1]))
        elif dec is not None and dec[0] == "X":
            p, b = dec[1], dec[2]
            if _dec(self.inn[b], p):
                self._crossed += 1
                eff.append(Send(p, Deny(b, DenyReason.DISPLACED)))
                self._relabel_down(now, b, d, eff)
        else:
            self._log(d, ("in", sender))
        self._refresh_all(eff)

    def _on_flow_reply(self, now: float, sender: str, msg: FlowReply, eff: list[Effect]) -> None:
        pend = self.pending.pop(msg.req_id, None)
        if pend is None:
            self.stats.ignored += 1
            return
        d = pend.commodity
        if pend.kind == "token":
            self.token_pending = False
        if msg.outcome == Reply.APPROVED:
            self.rejects_in_row = 0
            if pend.kind == "withdraw":
                _dec(self.out[d], sender)
            else:
                first = self.out[d].get(sender, 0) == 0
                _inc(self.out[d], sender)
                if self.cfg.is_data and pend.kind == "token":
                    self.launch_pending += 1
                elif pend.kind == "token":
                    self._log(d, ("fwd", sender))
                if first:
                    self._refresh([d], eff, {d: {sender}})
            self._changed(now)
            return
        if pend.kind == "withdraw":
            return  # already handed back by the peer: its Deny/Reroute adjusts our count
        if pend.kind == "token" and self.cfg.is_data and self.waves and self.next_launch == INF:
            self.next_launch = self._relaunch_at
        self.rejects_in_row += 1
        if msg.current is not None:
            self._ingest(sender, msg.current)
        else:
            self.lin[d][sender] = Label(d, Side.IN, INF, ())
        self._refresh([d], eff)
        if pend.kind == "token" and self.cfg.is_data and self.waves and self.cfg.same_wave_launches \
                and d == self.cfg.node_id and self.epoch_launches > 0:
            # a later launch of this wave found its first hop dearer: another tight first hop, else a new wave
            if self._tight(d) and self.rejects_in_row < MAX_REJECTS_BEFORE_WAIT:
                self.next_launch = now
            else:
                self._new_epoch(now, eff)

    def _on_deny(self, now: float, sender: str, msg: Deny, eff: list[Effect]) -> None:
        d = msg.commodity
        if d not in self.out or not _dec(self.out[d], sender):
            self.stats.ignored += 1
            return
        self._changed(now)
        if self.cfg.is_data:
            self._settled(now, eff)
        elif self._walking():
            walk = self._walk.setdefault(d, [])
            if msg.reason == DenyReason.NO_ROUTE and walk and walk[-1] == ("fwd", sender):
                walk.pop()  # the unit we handed `sender` retreated: it is ours to route again
            else:
                walk.append(("rin", sender))  # a unit handed back along a residual arc (a step, not a retreat)
        self._refresh([d], eff)

    def _on_reroute(self, now: float, sender: str, msg: Reroute, eff: list[Effect]) -> None:
        d = msg.commodity
        if d not in self.out or not _dec(self.out[d], sender):
            self.stats.ignored += 1
            return
        self._changed(now)
        if msg.to in self.cfg.next_costs:
            rid = self._id()
            self.pending[rid] = _Pending("forced", msg.to, d)
            eff.append(Send(msg.to, RequestFlow(rid, d, 0.0, forced=True)))
        self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)

    def _on_withdraw(self, now: float, sender: str, msg: Withdraw, eff: list[Effect]) -> None:
        d = msg.commodity
        if d in self.inn and _dec(self.inn[d], sender):
            self._changed(now)
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
            if not self.cfg.is_data:
                self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)
                self._refresh_all(eff)
        else:
            eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.NO_SUCH_FLOW, None)))

    # ------------------------------------------------------------ improvement moves
    def _start_query(self, now: float, eff: list[Effect]) -> None:
        if not self.cfg.peers:
            return
        self.query_target = self.rng.choice(self.cfg.peers)
        eff.append(Send(self.query_target, QueryFlows(self._id())))

    def _on_query(self, now: float, sender: str, msg: QueryFlows, eff: list[Effect]) -> None:
        ins, outs = [], []
        for d in self.cfg.commodities:
            for p, n in sorted(self.inn[d].items()):
                if n > 0:
                    ins.append(HopFlow(d, p, n, self.cfg.prev_costs[p]))
            for j, n in sorted(self.out[d].items()):
                if n > 0:
                    outs.append(HopFlow(d, j, n, self.cfg.next_costs[j]))
        eff.append(Send(sender, FlowReport(msg.query_id, self.cfg.capacity, self.used(), tuple(ins),
                                           tuple(outs), tuple(sorted(self.cfg.next_costs.items())))))

    def _on_report(self, now: float, sender: str, rep: FlowReport, eff: list[Effect]) -> None:
        if sender != self.query_target or self.move is not None or not self._quiet():
            return
        self.query_target = None
        cfg = self.cfg
        peer_next = dict(rep.next_costs)
        best = None  # (delta, kind, d, a, b)
        for h in rep.outflows:  # Request Change: swap my j1 with the peer's j2
            d, j2 = h.commodity, h.peer
            if j2 not in cfg.next_costs:
                continue
            for j1, n in sorted(self.out[d].items()):
                if n <= 0 or j1 == j2 or j1 not in peer_next:
                    continue
                delta = cfg.next_costs[j2] + peer_next[j1] - cfg.next_costs[j1] - h.cost
                if best is None or delta < best[0] - EPS:
                    best = (delta, "change", d, j1, j2)
        if self.used() < cfg.capacity:  # Request Redirect: carry prev -> peer -> next myself
            for hi in rep.inflows:
                if hi.peer not in cfg.prev_costs:
                    continue
                for ho in rep.outflows:
                    if ho.commodity != hi.commodity or ho.peer not in cfg.next_costs:
                        continue
                    delta = cfg.prev_costs[hi.peer] + cfg.next_costs[ho.peer] - hi.cost - ho.cost
                    if best is None or delta < best[0] - EPS:
                        best = (delta, "redirect", hi.commodity, hi.peer, ho.peer)
        if best is None or abs(best[0]) <= EPS:
            return
        delta, kind, d, a, b = best
        annealed = False
        if delta > 0:
            if not self.cfg.improve or not self.annealer.accepts_worse(delta, self.rng):
                return
            annealed = True
            self.stats.anneal_accepts += 1
        mid = self._id()
        self.move = _Move(mid, sender, kind, d, a, b, now + cfg.round_s)
        if kind == "change":
            eff.append(Send(sender, RequestChange(mid, d, a, b, cfg.next_costs[b] - cfg.next_costs[a], annealed)))
        else:
            via = cfg.prev_costs[a] + cfg.next_costs[b]
            eff.append(Send(sender, RequestRedirect(mid, d, a, b, via, annealed)))

    def _busy(self) -> bool:
        return self.move is not None or not self._quiet()

    def _on_request_change(self, now: float, sender: str, msg: RequestChange, eff: list[Effect]) -> None:
        d, j1, j2 = msg.commodity, msg.requester_next, msg.receiver_next
        cfg = self.cfg
        if self._busy():
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.BUSY)))
            return
        if d not in self.out or self.out[d].get(j2, 0) <= 0:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NO_SUCH_FLOW)))
            return
        if j1 not in cfg.next_costs:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_LINKED)))
            return
        total = msg.requester_delta + cfg.next_costs[j1] - cfg.next_costs[j2]
        if total >= -EPS and not msg.temperature_accept:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_IMPROVING)))
            return
        self._apply_swap(now, d, drop=j2, add=j1, eff=eff)
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.APPROVED)))

    def _on_request_redirect(self, now: float, sender: str, msg: RequestRedirect, eff: list[Effect]) -> None:
        d, p, q = msg.commodity, msg.prev, msg.next
        if self._busy():
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.BUSY)))
            return
        if d not in self.inn or self.inn[d].get(p, 0) <= 0 or self.out[d].get(q, 0) <= 0:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NO_SUCH_FLOW)))
            return
        mine = self.cfg.prev_costs[p] + self.cfg.next_costs[q]
        if msg.via_requester_cost - mine >= -EPS and not msg.temperature_accept:
            eff.append(Send(sender, MoveReply(msg.move_id, Reply.NOT_IMPROVING)))
            return
        _dec(self.inn[d], p)
        self._changed(now)
        eff.append(Send(p, Reroute(d, sender)))
        rid = self._id()
        self.pending[rid] = _Pending("withdraw", q, d)
        eff.append(Send(q, Withdraw(rid, d)))
        self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)
        self.stats.moves_done += 1
        eff.append(Send(sender, MoveReply(msg.move_id, Reply.APPROVED)))
        self._refresh_all(eff)

    def _apply_swap(self, now: float, d: str, drop: str, add: str, eff: list[Effect]) -> None:
        rid = self._id()
        self.pending[rid] = _Pending("withdraw", drop, d)
        eff.append(Send(drop, Withdraw(rid, d)))
        rid = self._id()
        self.pending[rid] = _Pending("forced", add, d)
        eff.append(Send(add, RequestFlow(rid, d, 0.0, forced=True)))
        self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)
        self.stats.moves_done += 1

    def _on_move_reply(self, now: float, sender: str, msg: MoveReply, eff: list[Effect]) -> None:
        mv = self.move
        if mv is None or mv.move_id != msg.move_id:
            self.stats.ignored += 1
            return
        self.move = None
        if msg.outcome != Reply.APPROVED:
            return
        self.annealer.cool()
        d = mv.commodity
        if mv.kind == "change":
            self._apply_swap(now, d, drop=mv.a, add=mv.b, eff=eff)
        else:
            # the peer reroutes prev's unit to us; we send it on to `next`
            rid = self._id()
            self.pending[rid] = _Pending("forced", mv.b, d)
            eff.append(Send(mv.b, RequestFlow(rid, d, 0.0, forced=True)))
            self.grace_until = max(self.grace_until, now + self.cfg.balance_grace_s)


_HANDLERS = {
    CostAnnounce: FlowNode._on_announce,
    RequestFlow: FlowNode._on_request_flow,
    FlowReply: FlowNode._on_flow_reply,
    Deny: FlowNode._on_deny,
    Reroute: FlowNode._on_reroute,
    Withdraw: FlowNode._on_withdraw,
    QueryFlows: FlowNode._on_query,
    FlowReport: FlowNode._on_report,
    RequestChange: FlowNode._on_request_change,
    RequestRedirect: FlowNode._on_request_redirect,
    MoveReply: FlowNode._on_move_reply,
    LaunchBid: FlowNode._on_launch_bid,
    Relabel: FlowNode._on_relabel,
    RelabelCost: FlowNode._on_relabel_cost,
}

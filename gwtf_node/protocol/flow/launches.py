"""The data node's launches: label waves, one unit at a time, and settlement (section V-C).

A data node launches one unit at a time (Request Flow to the neighbour behind
its OUT label) and waits for it to settle (arrive at the sink or come back),
so that each unit follows a shortest augmenting path on converged labels: with
one data node this is successive shortest paths, which reaches the maximum
flow at minimum cost.  We chose this over the paper's greedy back-to-front
pairing, which leaves a gap to the optimum that Request Change and Request
Redirect alone do not close (the residual "displace" step closes it).

Label waves (`waves`, on with one data node).  Free-running distance vectors
explode with depth: every unit that moves raises labels, and a rise explores
path after path.  So with a single data node the labels are recomputed in
*waves*: when its launched unit settles and the wave has no tight route left
(waves.py), the data node starts wave e+1 by announcing its sink label
(`new_wave`); a node that hears a label of a newer wave drops every label of
the older one for that commodity and recomputes from scratch
(labels.ingest).  Within a wave labels only fall (Bellman-Ford from infinity on
a residual graph without negative cycles).  The data node launches once its
OUT label has been still for `launch_quiet_factor` x the time the wave took to
reach it (`out_changed`).  The wave number rides on the wire in `Label.epoch`;
free-running labels stay at epoch 0.  With several data nodes each data node's
wave races the others' units for shared capacity, so waves default to off there
(free-running labels with ordered launches, bids.py, do better: docs/bench_flow.md).

Stuck launches.  The data node starts a new wave when its launch has not
settled in 2 x the wave's time + `launch_settle_s` (`arm_stuck`, "stuck"
timer), up to MAX_STUCK_WAVES per launch (a large swarm needs many: a held
unit moves only on a new wave).  From the second stuck wave on that ends a
formation wave (waves.py) with a route at the data node
(`LaunchState.held_waves`: the unit is held where the labels have not been
still long enough), each waits twice as long as the one before, up to 2 **
MAX_BACKOFF: over links of hundreds of milliseconds a wave's labels fall for
seconds, and waves that came faster than that held units for good
(tests/sim/test_flow_delays.py).  Units are counts, so a launched unit can
cancel against a hole left by a removal and never reach the sink:
`maybe_lost_settlement` counts it as settled when every unit sent is back and
nothing changed for `retry_epoch_rounds`.  A unit that reaches the data node
without having been launched (re-routed after a removal) starts a wave but
settles no launch unless one is outstanding (`settled`).

Recall waves.  A launch on a wave's stale labels can go out after the
maximum flow is placed: the unit explores tight steps and is held where it
can neither go on nor retreat, taking capacity the placed units would use.
When a wave begun after the launch gives the data node no route (its OUT
label INF), the stuck timer starts a *recall wave* (`recall_due`): once the
wave has reached the data node (the time its last wave took, `open_recall`)
its OUT label falls to the retire label of cycles.py (cost 0), so the relays'
OUT labels price the cheapest way back to it over the residual network, which
undoes the launch at no cost to the flows (the reverse of its tight steps is
such a way: successive shortest paths then go on from the flows as they
were).  The unit's return (a Deny at the data node) or arrival ends the
recall, and each launch waits twice as long for its stuck timer per recall
since a unit last reached the sink (`backoff`): relays hold units until their
labels are still, and a stuck timer that restarts the waves faster than that
holds them for good.  With one commodity
and no route, the data node starts a new wave when a flow changed at it since
the last one (`maybe_retry_wave`): removals raise labels, which a wave does not
announce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, Label, RequestFlow
from . import announce, bids, cycles, labels, waves
from .state import EPS, MAX_REJECTS_BEFORE_WAIT, MAX_STUCK_WAVES, NO_LABEL, PendingKind, marked, total

if TYPE_CHECKING:
    from .node import FlowNode

MAX_BACKOFF = 4  # a launch's stuck timer waits at most 2 ** this x twice the wave's time (`LaunchState.backoff`)


@dataclass
class LaunchState:
    """A data node's launches (relays leave it untouched)."""

    demand: int = 0  # units to place: its capacity
    pending: int = 0  # launched units approved by the first hop and not settled yet
    next_at: float = 0.0  # the next launch, not before (INF: wait for a new wave)
    relaunch_at: float = 0.0  # `next_at` restored when a launch is rejected
    wave_started: float = 0.0  # when the current wave started
    wave_launches: int = 0  # units launched on the current wave
    first_out_at: float | None = None  # when this wave first gave the data node an OUT label
    stuck_wave: int = -1  # the wave of the launch the "stuck" timer watches
    stuck_waves: int = 0  # waves started by the stuck timer for the current launch
    held_waves: int = 0  # ... of them, those started while the data node had a route (the unit held for still labels)
    launch_wave: int = -1  # the wave of the last launch
    most_in: int = 0  # the most units the sink has held
    recall: bool = False  # the current wave is a recall wave (`recall_due`)
    retire: bool = False  # ... and its retire label is out (`open_recall`)
    backoff: int = 0  # recalls since a unit last reached the sink: the stuck timer waits 2 ** this x longer
    wave_s: float | None = None  # the time the last wave that gave the data node an OUT label took to reach it


def arm_stuck(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Data node: if the launched unit has not settled by then, start a new wave (it is held somewhere)."""
    launch, cfg = node.launch, node.cfg
    wave = (launch.first_out_at - launch.wave_started) if launch.first_out_at is not None else cfg.round_s
    wave *= 2 ** min(launch.backoff + max(0, launch.held_waves - 1), MAX_BACKOFF)
    if launch.recall:  # the unit comes back hop by hop, each relay waiting for still labels
        wave = max(wave, cfg.retry_epoch_rounds * cfg.round_s / 2)
    node.launch.stuck_wave = node.labels.epoch[node.cfg.node_id]
    eff.append(SetTimer("stuck", now + cfg.launch_settle_s + 2 * wave))

def maybe_stuck(node: FlowNode, now: float, eff: list[Effect]) -> None:
    d = node.cfg.node_id
    if node.launch.stuck_wave == node.labels.epoch[d] and (node.launch.pending > 0 or node.units.token_pending) \
            and node.launch.stuck_waves < MAX_STUCK_WAVES:
        node.launch.stuck_waves += 1
        if marked(node, d) and node.labels.my_out.get(d, NO_LABEL).cost != INF:
            node.launch.held_waves += 1  # a route, yet no settlement: the unit waits for still labels (module doc)
        new_wave(node, now, eff, recall=recall_due(node))
        arm_stuck(node, now, eff)

def recall_due(node: FlowNode) -> bool:
    """Data node, its launch stuck: a wave begun after the launch shows it no route (its OUT label INF): the unit
    out is to come back (a recall wave, module doc).  Not with improvement moves on all the time: annealed moves
    leave flows whose labels do not price the way back at no cost (Table V settings 1 and 3 with annealing, the
    five instances that recall: 2 cheaper on one, 7 and 14 dearer on two, the same on two)."""
    d = node.cfg.node_id
    return (len(node.cfg.commodities) == 1 and not node.improving and node.launch.pending > 0
            and not node.units.token_pending
            and node.launch.launch_wave < node.labels.epoch[d]
            and (node.launch.recall or node.labels.my_out.get(d, NO_LABEL).cost == INF))

def open_recall(node: FlowNode, eff: list[Effect]) -> None:
    """Data node: the labels of its recall wave have reached it (the time its last wave took): out goes its
    retire label, a fall within the wave that travels downstream (module doc)."""
    if node.launch.recall and not node.launch.retire:
        node.launch.retire = True
        announce.refresh(node, [node.cfg.node_id], eff)

def new_wave(node: FlowNode, now: float, eff: list[Effect], recall: bool = False) -> None:
    """Data node: start a label wave; every label of this commodity is recomputed from scratch; on a recall wave
    its OUT label falls to the retire label once the wave has reached it (`open_recall`, module doc)."""
    d = node.cfg.node_id
    node.launch.recall, node.launch.retire = recall, False
    if recall:
        node.stats.recall()
        wait = node.launch.wave_s if node.launch.wave_s is not None else node.cfg.round_s
        eff.append(SetTimer("recall", now + wait))
    labels.new_wave(node, d, node.labels.epoch[d] + 1)
    waves.begin(node, d)
    waves.next_wave(node, d)
    node.launch.wave_launches = 0
    node.launch.wave_started = now
    node.launch.first_out_at = None
    node.launch.next_at = INF
    announce.refresh(node, [d], eff)
    if node.announcer.armed or node.announcer.dirty:
        announce.flush(node, eff)  # the wave starts now
    if not node.waves:
        node.launch.next_at = now

def out_changed(node: FlowNode, lab: Label) -> None:
    """Data node: its OUT label moved; launch once it has been still for a while."""
    now = node.now
    if not node.waves:
        return
    if lab.cost == INF:
        node.launch.next_at = INF
        return
    if node.launch.first_out_at is None:
        node.launch.first_out_at = now
        if not node.launch.recall:
            node.launch.wave_s = now - node.launch.wave_started
    # the time the wave took; a route that shows up long after (a node joined) does not make the data node
    # wait that long: capped at `retry_epoch_rounds` (a wave of a static run takes well under a round)
    wave = min(node.launch.first_out_at - node.launch.wave_started, node.cfg.retry_epoch_rounds * node.cfg.round_s)
    node.launch.next_at = now + max(node.cfg.launch_settle_s, node.cfg.launch_quiet_factor * wave)

def reform(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Data node: a unit of its flows was lost or a neighbour came or went: from now on no formation waves; the
    current one ends with a new, unmarked wave (waves.py, "Formation waves")."""
    if node.waves and waves.reformed(node):
        new_wave(node, now, eff)

def note_sink(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Tick of a data node: fewer units at its sink than it held is a loss (a relay upstream was removed and its
    units withdrawn).  Checked at the tick, not at the Withdraw: acting at once re-formed worse after a link was
    recosted (tests/protocol/test_flow_membership.py, `test_recost_moves_the_flows_off_a_link_that_became_dearer`:
    1.07 of the optimum against 1.05)."""
    d = node.cfg.node_id
    held = total(node.units.inn[d])
    if held < node.launch.most_in:
        reform(node, now, eff)
    node.launch.most_in = max(node.launch.most_in, held)

def maybe_lost_settlement(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Tick of a data node: a launched unit whose settlement will not come counts as settled.

    Units are counts, so a launched unit can cancel against a hole on its way: a relay whose inflow was
    withdrawn or removed (a membership change) keeps the outflow for `balance_grace_s`, and a unit arriving
    then pairs with it.  The route is complete, but no Request Flow reaches the sink, so the data node
    would wait for the settlement forever (with waves: `LaunchState.next_at` stays INF, no new wave).  Every unit
    sent out being back (inflow >= outflow) while nothing changed here for `retry_epoch_rounds` says that
    the unit is not in flight any more.  (Withdrawing the hole at once when a unit arrives keeps the
    signal, but also breaks the pairing of agreed moves, which re-forms worse flows under churn.)
    """
    d = node.cfg.node_id
    if node.launch.pending <= 0 or node.units.token_pending or node.units.pending:
        return
    if now - node.stats.last_change < node.cfg.retry_epoch_rounds * node.cfg.round_s:
        return
    if total(node.units.inn[d]) >= total(node.units.out[d]):
        settled(node, now, eff)

def maybe_retry_wave(node: FlowNode, now: float, eff: list[Effect]) -> None:
    """Tick of a data node: start a new wave when stuck (a rejected launch, or no route while
    other data nodes may free capacity)."""
    d = node.cfg.node_id
    if not node.waves or node.units.token_pending or node.launch.pending > 0 or total(node.units.out[d]) >= node.launch.demand:
        return
    if now - node.launch.wave_started < node.cfg.retry_epoch_rounds * node.cfg.round_s:
        return
    lab = node.labels.my_out.get(d, NO_LABEL)
    # no route: with several data nodes others may free capacity; with one, a flow changed here since the
    # wave (a membership change elsewhere: a Withdraw reached the sink, a re-routed unit arrived) may have
    # opened a route that this wave's labels, which only fall, cannot show
    changed = node.stats.last_change > node.launch.wave_started + EPS
    stuck = node.units.rejects_in_row > 0 or (lab.cost == INF and (len(node.cfg.commodities) > 1 or changed))
    if stuck:
        new_wave(node, now, eff)

def maybe_launch(node: FlowNode, now: float, eff: list[Effect]) -> None:
    d = node.cfg.node_id
    if node.ordered:
        bids.update_bid(node, now, eff)
    if node.units.token_pending or node.launch.pending > 0:
        return
    # pending forced requests count (a Reroute of an agreed Redirect is on its way to the new first hop)
    if node.outflow_committed(d) >= node.launch.demand or node.units.rejects_in_row >= MAX_REJECTS_BEFORE_WAIT:
        return
    dec = node.labels.dec_out.get(d)
    ch = cycles.choice(node) if node.cycles.on else None
    if dec is None or node.launch.next_at == INF or (node.cycles.on and ch is None):
        return
    if now < node.launch.next_at:
        eff.append(SetTimer("launch", node.launch.next_at))
        return
    if node.ordered:
        if not bids.my_turn(node, now, eff):
            return
        bids.launched(node)
    j = dec[1]
    if ch is not None:
        j = ch[1]
        cycles.launching(node, j, ch[2])
    rid = node.units.request(PendingKind.LAUNCH, j, d, node.labels.lin[d][j].cost)
    if node.waves:
        node.launch.wave_launches += 1
        node.launch.launch_wave = node.labels.epoch[d]
        if waves.walking(node):
            node.launch.stuck_waves = node.launch.held_waves = 0
            arm_stuck(node, now, eff)
        node.launch.relaunch_at = node.launch.next_at  # restored if the launch is rejected
        node.launch.next_at = INF  # the next launch waits for the wave its settlement starts
    eff.append(Send(j, RequestFlow(rid, d, node.labels.lin[d][j].cost)))

def settled(node: FlowNode, now: float, eff: list[Effect], arrived: bool = False) -> None:
    """A data node's launched unit arrived or came back: a new wave, then the next unit.

    The unit can reach the sink before the first hop's approval is back at
    the data node, so the count may dip below zero for a moment; launching
    waits while it is positive.

    A unit that was not launched also settles here (re-routed after a
    membership change and arriving at the sink, or DENYed back to the data
    node): it starts a new wave (flows changed) but is not counted while no
    launch is outstanding.  Counting it (-1) would pre-settle the *next*
    launch: its approval would bring the count to 0, so if that unit then
    paired with a hole on its way and never reached the sink,
    `maybe_lost_settlement` (which needs a launch outstanding) would not
    fire and, with waves, `LaunchState.next_at` would stay INF for good.
    """
    launched = node.launch.pending > 0 or node.units.token_pending
    if node.launch.pending > 0:
        node.launch.pending -= 1
    elif node.units.token_pending:
        node.launch.pending = -1  # the launch in flight reached the sink before its approval came back
    if arrived:
        node.launch.backoff = 0
    elif node.launch.recall and launched:
        node.launch.backoff += 1  # the recall brought it back: the next launch waits longer (module doc)
    if node.waves:
        d = node.cfg.node_id
        if arrived and not launched:
            waves.reformed(node)  # a unit re-routed after a removal: the wave below is no formation wave
        if arrived and launched and waves.walking(node) and waves.tight(node, d) \
                and node.outflow_committed(d) < node.launch.demand and node.wave.gave_up.get(d) != node.labels.epoch[d]:
            if node.launch.launch_wave == node.labels.epoch[d] or not marked(node, d):
                node.launch.next_at = now  # the wave still has a tight route: the next unit goes on it
            # else a new wave began while the unit was out: on a formation wave the next unit waits for the OUT
            # label to be still (`out_changed`), as the relays wait (waves.py)
            return
        new_wave(node, now, eff)
    else:
        node.launch.next_at = now + (node.cfg.ordered_settle_s if node.ordered else node.cfg.launch_settle_s)
        eff.append(SetTimer("launch", node.launch.next_at))

def approved(node: FlowNode) -> None:
    """Data node: the first hop approved its launch; the unit is on its way to the sink."""
    node.launch.pending += 1

def rejected(node: FlowNode) -> None:
    """Data node with waves: the first hop rejected its launch; the launch waits as it did before it."""
    if node.launch.next_at == INF:
        node.launch.next_at = node.launch.relaunch_at

def relaunch(node: FlowNode, now: float, at_once: bool = False) -> None:
    """Data node: launch again from `now` on; unless `at_once`, only if it was waiting for a new wave (a first
    hop lost: the unit out may have been with it)."""
    if at_once or node.launch.next_at == INF:
        node.launch.next_at = now

def first_hop_lost(node: FlowNode) -> None:
    """Data node: a first hop with its units went; the unit in flight may have been with it (no settlement)."""
    node.launch.pending = 0

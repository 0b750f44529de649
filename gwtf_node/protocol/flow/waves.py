"""Several units per wave, and retreats (one data node, label waves; section V-C's flow formation, made exact).

The labels of a settled wave are exact distances to the sink, i.e.
potentials pi with every residual arc's reduced cost c(u, v) + pi(v) - pi(u)
>= 0; a unit that moves only along *tight* arcs (reduced cost 0) follows a
shortest augmenting path, and pi stays feasible (a tight arc's reverse is
tight).  So after a unit reaches the sink the data node launches the next
one at once, without a new wave, while its OUT label still has the wave's
value (`tight`); a node keeps, as its potential, the lowest OUT label of the
wave (`WaveState.pot_out`), and sends a unit on only while its OUT label is still that (`gate`).

Labels only rise within a wave and rises are not announced, so a unit may find
its route gone (a relay filled up, a Request Flow rejected with a dearer
label): then it *retreats* (`retreat`), undoing the step that brought it,
which is tight too: DENY to the node whose Request Flow brought it, or, for a
unit handed back by a displacement or a DENY, a forced Request Flow back to
that node after telling it that our OUT label rose (`walk_back` there hands on
the unit it had taken, to where it came from).  Each node logs the steps of
the wave (`WaveState.walk`, `Step`).  A retreat that reaches the data node
starts a new wave.  A unit that can neither go on nor retreat (its arrival is
not the last step logged: undoing older steps would unwind settled units) is
held; the data node starts a new wave when its launch does not settle
(launches.py, "stuck"), and the held unit moves once the new wave's labels at
its node have been still for a while.

A removal or a changed link cost makes the logged steps and the potentials
meaningless: at that node the rest of the wave goes the old way, routing on
the labels at any cost (`membership_changed`); so does a held unit after
`retry_epoch_rounds` (nobody may start the wave it waits for), and every unit
at a node that retreated more than MAX_RETREATS_PER_WAVE times in one wave.

Formation waves (`FlowConfig.formation_waits`).  A label announced while the
wave is still spreading can fall again, and a unit that moves on it takes a
route that is not a shortest augmenting path: the flows then admit a negative
cycle, every later wave's labels describe it, the path check leaves a node on
it without a route, and launches retreat wave after wave (without formation
waves the flows of 1000 x 16 seeds 1-3 stall at 71-83 of 87-91 units:
docs/bench_flow.md, "Other seeds, and formation waves").  So while
the data node has lost no unit and seen no neighbour go, its waves
are *formation waves* (`Label.formation`, stamped on every label of the
wave): a relay moves a unit only once its OUT label has been still for
`launch_quiet_factor` x the time since it heard the wave (at least
`launch_settle_s`, that time counted up to `retry_epoch_rounds` rounds;
`still_at`, `gate`), nor before the previous wave's labels stopped falling
here (`span`: over slow links they fall for seconds, and units moved on the
first were rejected wave after wave: tests/sim/test_flow_delays.py); a unit
whose wait a new wave cut short (`cut`: the stuck timer's waves came faster
than its labels stood still) waits `launch_settle_s` once its OUT label falls
to the previous wave's lowest, below which successive shortest paths (no
improvement moves) never go.  After a crash the labels fall for seconds and
such waits stack up, so re-formation moves units at once: a node that sees a
neighbour go or a link cost change stamps the rest of the wave unmarked, a
node that hears an unmarked label of the wave does the same (the news of a
change travels with the labels it changes), and a data node that hears one,
loses a unit at its sink (launches.py `note_sink`), receives one it did not
launch (re-routed after a removal) or sees a neighbour go or a cost change
starts an unmarked wave and marks none again (`reformed`).  A newcomer keeps
the formation (joins that ended it stalled the flows: docs/bench_flow.md,
"Relays that join"); its labels from before it was added wait for the next
wave (`defer`), later ones count at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..effects import Effect, Send, SetTimer
from ..messages import INF, CostAnnounce, Deny, DenyReason, FlowReply, Label, Reply, RequestFlow, Side
from . import announce
from .state import EPS, MAX_RETREATS_PER_WAVE, PendingKind, Step, as_sent, marked, total

if TYPE_CHECKING:
    from .node import FlowNode


@dataclass
class WaveState:
    """A node's view of the current wave, per commodity."""

    pot_in: dict[str, float] = field(default_factory=dict)  # lowest IN label of the current wave
    pot_out: dict[str, float] = field(default_factory=dict)  # lowest OUT label: the potential (`tight`, `gate`)
    floor: dict[str, tuple[float, float]] = field(default_factory=dict)  # lowest (IN, OUT) of the previous wave
    walk: dict[str, list[tuple]] = field(default_factory=dict)  # (Step, peer[, peer]) units took here this wave
    walked: dict[str, int] = field(default_factory=dict)  # the last wave in which a unit stepped here
    hold: dict[str, int] = field(default_factory=dict)  # the wave in which a unit got stuck here (held for the next)
    gave_up: dict[str, int] = field(default_factory=dict)  # the wave whose rest goes the old way (any cost)
    retreats: dict[str, tuple[int, int]] = field(default_factory=dict)  # (wave, retreats in it)
    heard_at: dict[str, float] = field(default_factory=dict)  # when this wave's first label arrived
    quiet_at: dict[str, float] = field(default_factory=dict)  # a held unit moves on after this
    still_at: dict[str, float] = field(default_factory=dict)  # formation waves: units move on after this
    fell_at: dict[str, float] = field(default_factory=dict)  # the last fall of the OUT label in this wave
    span: dict[str, float] = field(default_factory=dict)  # the previous wave here: from its first label to its
    # OUT label's last fall
    formation: dict[str, int] = field(default_factory=dict)  # the current wave, while it is a formation wave
    cut: dict[str, bool] = field(default_factory=dict)  # a new wave came while a unit here waited for still labels
    reformed: bool = False  # data node: it lost a unit, a neighbour went or a link cost changed: it marks no wave
    # any more
    deferred: dict[str, tuple[dict[str, int], float]] = field(default_factory=dict)  # next-stage newcomer ->
    # (the wave per commodity when it came, until when its labels of that wave wait: `defer`)


def walking(node: FlowNode) -> bool:
    return node.waves and node.cfg.same_wave_launches

def log_step(node: FlowNode, d: str, step: tuple) -> None:
    if walking(node):
        node.wave.walk.setdefault(d, []).append(step)
        node.wave.walked[d] = node.labels.epoch[d]

def next_wave(node: FlowNode, d: str) -> None:
    """A new wave of `d`: this wave's lowest labels become the floor the next one cannot go below."""
    node.wave.floor[d] = (node.wave.pot_in.pop(d, INF), node.wave.pot_out.pop(d, INF))

def heard_new_wave(node: FlowNode, d: str, lab: Label) -> None:
    """A label of a newer wave of `d` arrived (labels.ingest): its steps start again, and its time is kept."""
    next_wave(node, d)
    w = node.wave
    w.walk.pop(d, None)
    w.cut[d] = (d in w.formation and node.now < w.still_at.get(d, 0.0) and not node.cfg.is_data
                and total(node.units.inn[d]) > total(node.units.out[d]))
    heard, fell = w.heard_at.get(d), w.fell_at.pop(d, None)
    if heard is not None and fell is not None and fell >= heard:
        w.span[d] = min(fell - heard, node.cfg.retry_epoch_rounds * node.cfg.round_s)  # (as `labels_lowered`)
    w.heard_at[d] = node.now
    w.still_at[d] = max(node.now + node.cfg.launch_settle_s, span_over(node, d))
    if lab.formation:
        w.formation[d] = lab.epoch
    else:
        w.formation.pop(d, None)

def span_over(node: FlowNode, d: str) -> float:
    """When the previous wave's labels of `d` had stopped falling here, counted from this wave's first label
    (`WaveState.span`, x `launch_quiet_factor`): a unit of a formation wave moves on no earlier (module doc)."""
    w = node.wave
    return w.heard_at.get(d, node.now) + node.cfg.launch_quiet_factor * w.span.get(d, 0.0)

def heard_unmarked(node: FlowNode, d: str, lab: Label) -> None:
    """A label of the current wave of `d` without the formation mark: the wave is not one here either (a
    membership change upstream of it), and a data node marks no wave any more (module doc)."""
    if node.wave.formation.get(d) == lab.epoch:
        del node.wave.formation[d]
        if node.cfg.is_data and d == node.cfg.node_id:
            node.wave.reformed = True

def begin(node: FlowNode, d: str) -> None:
    """Data node: it started a wave of its commodity `d`; a formation wave unless it has reformed."""
    if node.waves and node.cfg.formation_waits and not node.wave.reformed:
        node.wave.formation[d] = node.labels.epoch[d]
    else:
        node.wave.formation.pop(d, None)

def reformed(node: FlowNode) -> bool:
    """Data node: it lost a unit, a neighbour came or went (module doc) or it adopted units another formation
    placed (`FlowNode.adopt`); True the first time (with formation waits): a new, unmarked wave is to end the
    formation wave, which the relays may still hold."""
    was = node.wave.reformed
    node.wave.reformed = True
    return not was and node.cfg.formation_waits

def free_back(node: FlowNode, d: str) -> bool:
    """A hand-back of `d` costs 0 here (labels.py `back_candidates`): the current wave is one after a removal or
    a cost change (unmarked, with formation waits on) and `FlowConfig.reform_free_back` is on."""
    cfg = node.cfg
    return cfg.reform_free_back and node.waves and cfg.formation_waits and node.labels.epoch[d] > 0 \
        and not marked(node, d)

def labels_lowered(node: FlowNode, d: str) -> None:
    """This node's labels of `d` were recomputed (announce.refresh): the wave's lowest ones are its potentials,
    and a held unit waits for the labels of a new wave to be still (module doc)."""
    w = node.wave
    lab = node.labels.my_in.get(d)
    if lab is not None and lab.cost < w.pot_in.get(d, INF):
        w.pot_in[d] = lab.cost
    lab = node.labels.my_out.get(d)
    if lab is not None and lab.cost < w.pot_out.get(d, INF):
        w.pot_out[d] = lab.cost
        e, now, cfg = node.labels.epoch[d], node.now, node.cfg
        w.fell_at[d] = now
        age = now - w.heard_at.get(d, now)
        if w.formation.get(d) == e:
            # a fall long after the wave came (a cost measured again) holds units no longer than the data node waits
            # for a route that shows up late (launches.out_changed); a unit whose wait the wave cut short (`cut`)
            # waits `launch_settle_s` after a fall to the previous wave's lowest OUT label (module doc)
            wait = cfg.launch_quiet_factor * min(age, cfg.retry_epoch_rounds * cfg.round_s)
            floor = w.floor.get(d, (INF, INF))[1]
            if w.cut.get(d) and not node.improving and floor != INF and lab.cost <= floor + EPS:
                w.still_at[d] = now + cfg.launch_settle_s
            else:
                w.still_at[d] = max(now + max(cfg.launch_settle_s, wait), span_over(node, d))
        if w.hold.get(d, e) != e:
            w.quiet_at[d] = now + max(cfg.launch_settle_s, cfg.launch_quiet_factor * age)

def denied(node: FlowNode, d: str, sender: str, reason: DenyReason) -> None:
    """A unit this node sent `sender` came back (Deny): the step it undoes, or a step of its own."""
    walk = node.wave.walk.setdefault(d, [])
    if reason == DenyReason.NO_ROUTE and walk and walk[-1] == (Step.FORWARD, sender):
        walk.pop()  # the unit we handed `sender` retreated: it is ours to route again
    else:
        walk.append((Step.HANDED_BACK, sender))  # a unit handed back along a residual arc (a step, not a retreat)

def forget(node: FlowNode, d: str) -> None:
    """The data node of `d` restarted: nothing of its waves is kept."""
    w = node.wave
    for table in (w.pot_in, w.pot_out, w.floor, w.walk, w.walked, w.hold, w.gave_up, w.retreats, w.heard_at,
                  w.quiet_at, w.still_at, w.formation, w.cut, w.fell_at, w.span):
        table.pop(d, None)

def membership_changed(node: FlowNode) -> None:
    """A neighbour came or went: this wave's steps and potentials say nothing reliable any more; the
    old way (route on the labels at any cost) until the next wave."""
    for d in node.cfg.commodities:
        node.wave.gave_up[d] = node.labels.epoch[d]
        node.wave.formation.pop(d, None)  # the rest of this wave goes out unmarked (module doc)
        node.wave.hold.pop(d, None)
        node.wave.walk.pop(d, None)

def forming(node: FlowNode) -> bool:
    """A formation wave is on here (at a data node: it marks its waves): a newcomer keeps it (`defer`)."""
    return node.cfg.formation_waits and bool(node.wave.formation)

def defer(node: FlowNode, peer: str) -> None:
    """A next-stage newcomer during a formation wave: its labels that `labels.ingest` takes (those it sent before
    it was added, kept in the stash) wait until its label of a newer wave, or `retry_epoch_rounds` rounds if none
    comes (`undefer_due`); a label it sends now counts at once (`labels.wave_label`; module doc).  A data node that
    has launched nothing yet takes them at once (no unit moves on this wave)."""
    cfg = node.cfg
    if cfg.is_data and not any(n > 0 for n in node.units.out[cfg.node_id].values()):
        return
    node.wave.deferred[peer] = ({d: node.labels.epoch[d] for d in cfg.commodities},
                                node.now + cfg.retry_epoch_rounds * cfg.round_s)

def deferred(node: FlowNode, sender: str, wire: Label) -> bool:
    """`wire`, from `sender`, waits for the next wave (`defer`); a label of a newer wave ends the wait."""
    ent = node.wave.deferred.get(sender)
    if ent is None or wire.side is not Side.IN:
        return False
    if wire.epoch > ent[0].get(wire.commodity, -1):
        del node.wave.deferred[sender]
        return False
    return node.now < ent[1]

def undefer_due(node: FlowNode, now: float) -> list[str]:
    """Tick: the newcomers whose wait is over without a new wave (their kept labels are to be taken in)."""
    due = sorted(p for p, (_, until) in node.wave.deferred.items() if now >= until)
    for p in due:
        del node.wave.deferred[p]
    return due

def undefer(node: FlowNode, peer: str) -> None:
    node.wave.deferred.pop(peer, None)

def tight(node: FlowNode, d: str) -> bool:
    """Data node: its OUT label is still the wave's (the potential): a launch now is a shortest path."""
    lab = node.labels.my_out.get(d)
    return lab is not None and lab.cost != INF and lab.cost <= node.wave.pot_out.get(d, INF) + EPS

def gate(node: FlowNode, now: float, d: str, dec, eff: list[Effect]) -> bool:
    """Same-wave launches: True when the unpaired unit must not move on along `dec` now.

    No tight route (the OUT label rose above the wave's potential): retreat
    (`retreat`); if that is not possible, hold the unit for the next wave
    (the data node starts one when its launch does not settle, "stuck"),
    and move it only once the labels of that wave have been still here for
    a while (as the data node waits before it launches).  On a formation
    wave every unit waits for still labels first (module doc)."""
    held = node.wave.hold.get(d)
    e = node.labels.epoch[d]
    still = node.wave.still_at.get(d, 0.0)
    if now < still and node.wave.formation.get(d) == e and node.wave.gave_up.get(d) != e:
        eff.append(SetTimer("balance", still))  # a formation wave whose labels here may still fall
        return True
    if held is not None and held == e:
        # still no new wave (after a membership change nobody may start one): after a while, the old way
        until = node.wave.quiet_at.get(d, INF)
        if now < until:
            eff.append(SetTimer("balance", until))
            return True
        del node.wave.hold[d]
        node.wave.gave_up[d] = e  # and for the rest of this wave
        return False
    if held is not None:
        qa = node.wave.quiet_at.get(d, INF)
        if now < qa:
            if qa != INF:
                eff.append(SetTimer("balance", qa))
            return True
        del node.wave.hold[d]
    if dec is not None and node.labels.my_out[d].cost <= node.wave.pot_out.get(d, INF) + EPS:
        return False
    if node.wave.gave_up.get(d) == e:
        return False
    if node.wave.walk.get(d):
        n = node.wave.retreats.get(d, (e, 0))
        n = n[1] + 1 if n[0] == e else 1
        node.wave.retreats[d] = (e, n)
        if n > MAX_RETREATS_PER_WAVE:
            node.wave.gave_up[d] = e  # a loop (stale steps after a membership change): the old way
            return False
        if retreat(node, now, d, eff):
            return True
    if node.wave.walked.get(d) == e and node.wave.gave_up.get(d) != e:
        node.wave.hold[d] = e
        node.wave.quiet_at[d] = now + node.cfg.retry_epoch_rounds * node.cfg.round_s
        eff.append(SetTimer("balance", node.wave.quiet_at[d]))
        return True
    return False

def retreat(node: FlowNode, now: float, d: str, eff: list[Effect]) -> bool:
    """A unit here has no tight route any more: undo the step that brought it (module doc).

    The reverse of a step taken on this wave is tight, so the flow keeps
    its optimality; the unit then tries the neighbour it came from, which
    learns of the rise from our rejection if it asks us again."""
    walk = node.wave.walk.get(d)
    if walk and walk[-1][0] in (Step.IN, Step.HANDED_BACK):
        step = walk.pop()
        if step[0] == Step.IN and node.units.inn[d].get(step[1], 0) > 0:
            node.units.take_in(d, step[1])
            node.changed(now)
            eff.append(Send(step[1], Deny(d, DenyReason.NO_ROUTE)))
            announce.refresh_all(node, eff)
            node.act_on_units(now, eff)
            return True
        if step[0] == Step.HANDED_BACK and step[1] in node.cfg.next_costs:
            # it handed us the unit along the residual arc of our OUT label: tell it that label rose
            lab = node.labels.my_out.get(d)
            if lab is not None:
                eff.append(Send(step[1], CostAnnounce((as_sent(node, lab, d),))))
            rid = node.units.request(PendingKind.FORCED, step[1], d)
            eff.append(Send(step[1], RequestFlow(rid, d, 0.0, forced=True)))
            return True
    # the last step here was a unit leaving (Step.FORWARD, Step.THROUGH, Step.BACK): the one we hold came otherwise, and
    # undoing older steps would unwind units that already settled: hold it for the next wave instead
    return False

def walk_back(node: FlowNode, now: float, sender: str, msg: RequestFlow, eff: list[Effect]) -> bool:
    """A forced Request Flow that undoes a step of ours (`retreat` at `sender`): take the unit back and,
    if it only passed through here (displacement), hand it back to where it came from."""
    d = msg.commodity
    walk = node.wave.walk.get(d)
    if not walk:
        return False
    top = walk[-1]
    if not ((top[0] == Step.THROUGH and top[2] == sender) or (top[0] == Step.BACK and top[1] == sender)):
        return False
    walk.pop()
    node.units.add_in(d, sender)
    node.changed(now)
    eff.append(Send(sender, FlowReply(msg.req_id, d, Reply.APPROVED, None)))
    if top[0] == Step.THROUGH and node.units.take_in(d, top[1]):
        eff.append(Send(top[1], Deny(d, DenyReason.NO_ROUTE)))
    announce.refresh_all(node, eff)
    return True

"""Formation waves (flow/waves.py, "Formation waves"): while the data node has lost no unit and seen no neighbour
go, its waves are marked on the wire (`Label.formation`) and a relay moves a unit only once its labels of the wave
are still; a removal or a changed link cost, an unmarked label of the wave, or a loss at the sink ends that, and a
newcomer joins the wave."""

from __future__ import annotations

import random

import pytest

from gwtf_node.protocol.codec import decode, encode
from gwtf_node.protocol.effects import Send, SetTimer
from gwtf_node.protocol.flow import FlowConfig, FlowNode
from gwtf_node.protocol.messages import CostAnnounce, Label, RequestFlow, Side, Withdraw

D = "d0"


def relay(**extra) -> FlowNode:
    cfg = FlowConfig("R", False, 1, (D,), {"N1": 3.0, "N2": 7.0}, {"P1": 2.0, "P2": 5.0}, peers=("S",), **extra)
    m = FlowNode(cfg, random.Random(0))
    m.start(0.0)
    return m


def data_node(**extra) -> tuple[FlowNode, list]:
    m = FlowNode(FlowConfig(D, True, 2, (D,), {"A": 1.0}, {"Z": 1.0}, **extra), random.Random(0))
    return m, m.start(0.0)


def delivered(m: FlowNode, eff: list) -> list:
    """`eff` and what the node sends when its pending announcement goes out (coalesced: `announce` timer)."""
    due = timers(eff, "announce")
    return eff + (m.on_timer(max(due), "announce") if due else [])


def wave_label(node: str, cost: float, epoch: int = 1, formation: bool = True) -> Label:
    return Label(D, Side.IN, cost, (node + "+", node + "-", D + "+"), epoch, formation)


def announced(eff) -> list[Label]:
    return [lab for e in eff if isinstance(e, Send) and isinstance(e.msg, CostAnnounce) for lab in e.msg.labels]


def requests(eff, to: str) -> list[RequestFlow]:
    return [e.msg for e in eff if isinstance(e, Send) and isinstance(e.msg, RequestFlow) and e.to == to]


def timers(eff, key: str) -> list[float]:
    return [e.deadline for e in eff if isinstance(e, SetTimer) and e.key == key]


def test_the_mark_crosses_the_wire():
    lab = wave_label("N1", 10.0)
    assert decode(encode("R", CostAnnounce((lab,))))[1].labels[0].formation is True
    assert decode(encode("R", CostAnnounce((wave_label("N1", 10.0, formation=False),))))[1].labels[0].formation \
        is False


def test_a_relay_moves_a_unit_of_a_formation_wave_once_its_labels_are_still():
    m = relay()
    labs = announced(delivered(m, m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0),)))))
    assert labs and all(lab.epoch == 1 and lab.formation for lab in labs)  # it passes the mark on
    eff = m.on_message(0.15, "P1", RequestFlow(1, D, 13.0))
    assert m.inn[D] == {"P1": 1} and not requests(eff, "N1")  # taken, but held: the labels may still fall
    still = 0.10 + m.cfg.launch_settle_s
    assert timers(eff, "balance") == [still]
    assert not requests(m.on_timer(still - 0.01, "balance"), "N1")
    fwd = requests(m.on_timer(still, "balance"), "N1")
    assert [r.expected_cost for r in fwd] == [10.0]


def test_a_later_fall_of_the_label_extends_the_wait():
    m = relay()
    m.on_message(0.10, "N2", CostAnnounce((wave_label("N2", 9.0),)))  # OUT 16 via N2
    m.on_message(0.50, "N1", CostAnnounce((wave_label("N1", 10.0),)))  # OUT falls to 13 via N1, 0.4 s into the wave
    eff = m.on_message(0.55, "P1", RequestFlow(1, D, 13.0))
    assert not requests(eff, "N1") and timers(eff, "balance") == [0.50 + 0.40]  # launch_quiet_factor x 0.4 s
    assert [r.expected_cost for r in requests(m.on_timer(0.90, "balance"), "N1")] == [10.0]


def test_a_unit_waits_at_least_as_long_as_the_previous_waves_labels_fell_here():
    # over slow links a wave's labels fall for seconds after the first arrives (tests/sim/test_flow_delays.py): the
    # first label of the next wave is no more final than the first of this one was
    m = relay()
    m.on_message(0.10, "N2", CostAnnounce((wave_label("N2", 9.0),)))
    m.on_message(0.50, "N1", CostAnnounce((wave_label("N1", 10.0),)))  # wave 1 falls here for 0.4 s
    m.on_message(1.00, "N1", CostAnnounce((wave_label("N1", 10.0, epoch=2),)))  # wave 2: OUT 13 at once
    eff = m.on_message(1.05, "P1", RequestFlow(1, D, 13.0))
    assert not requests(eff, "N1") and timers(eff, "balance") == [pytest.approx(1.00 + 0.40)]  # not 1.0 + 0.2
    assert not requests(m.on_timer(1.30, "balance"), "N1")
    assert [r.expected_cost for r in requests(m.on_timer(1.40, "balance"), "N1")] == [10.0]


@pytest.mark.parametrize("improve, cut", [(False, True), (True, True), (False, False)])
def test_a_unit_whose_wait_a_new_wave_cut_short_waits_less_at_the_previous_waves_lowest_label(improve, cut):
    # successive shortest paths: a label never falls below the previous wave's lowest; a unit held for still labels
    # when a new wave comes (the data node's stuck timer) waits only launch_settle_s once its label falls to that
    # lowest; not with improvement moves on (distances may fall from wave to wave), nor for a unit that came later
    m = relay(improve=improve)
    m.on_message(0.10, "N2", CostAnnounce((wave_label("N2", 9.0),)))
    m.on_message(0.50, "N1", CostAnnounce((wave_label("N1", 10.0),)))  # wave 1's lowest OUT label: 13
    if cut:
        assert timers(m.on_message(0.55, "P1", RequestFlow(1, D, 13.0)), "balance") == [pytest.approx(0.90)]
    m.on_message(0.70, "N2", CostAnnounce((wave_label("N2", 9.0, epoch=2),)))  # wave 2 (OUT 16), the unit held
    if not cut:
        m.on_message(0.75, "P1", RequestFlow(1, D, 16.0))
    eff = m.on_message(1.10, "N1", CostAnnounce((wave_label("N1", 10.0, epoch=2),)))  # falls to 13, 0.4 s in
    wait = m.cfg.launch_settle_s if cut and not improve else 0.40
    assert m.inn[D] == {"P1": 1} and not requests(eff, "N1") and timers(eff, "balance") == [pytest.approx(1.10 + wait)]
    assert [r.expected_cost for r in requests(m.on_timer(timers(eff, "balance")[0], "balance"), "N1")] == [10.0]


def test_an_unmarked_wave_moves_units_at_once():
    m = relay()
    eff = delivered(m, m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0, formation=False),))))
    assert announced(eff) and not any(lab.formation for lab in announced(eff))
    eff = m.on_message(0.15, "P1", RequestFlow(1, D, 13.0))
    assert [r.expected_cost for r in requests(eff, "N1")] == [10.0]


def test_without_formation_waits_nothing_is_held():
    m = relay(formation_waits=False)  # (a relay follows the mark it hears; the data node does not set it)
    d, eff = data_node(formation_waits=False)
    assert announced(eff) and not any(lab.formation for lab in announced(eff))
    m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0, formation=False),)))
    assert requests(m.on_message(0.15, "P1", RequestFlow(1, D, 13.0)), "N1")


def test_an_unmarked_label_of_the_wave_ends_the_formation_here_and_travels_on():
    m = relay()
    delivered(m, m.on_message(0.10, "N2", CostAnnounce((wave_label("N2", 9.0),))))
    # N1 saw a membership change: its label of the same wave comes unmarked, and lowers ours
    labs = announced(delivered(m, m.on_message(0.20, "N1", CostAnnounce((wave_label("N1", 10.0, formation=False),)))))
    assert labs and all(lab.epoch == 1 and not lab.formation for lab in labs)
    # a newer formation wave is one again
    labs = announced(delivered(m, m.on_message(1.0, "N1", CostAnnounce((wave_label("N1", 11.0, epoch=2),)))))
    assert labs and all(lab.epoch == 2 and lab.formation for lab in labs)


def test_a_unit_moves_at_once_once_the_wave_came_unmarked():
    m = relay()
    delivered(m, m.on_message(0.10, "N2", CostAnnounce((wave_label("N2", 9.0),))))
    assert not requests(m.on_message(0.15, "P1", RequestFlow(1, D, 16.0)), "N2")  # held (formation wave)
    eff = m.on_message(0.20, "N1", CostAnnounce((wave_label("N1", 10.0, formation=False),)))
    eff += m.on_timer(0.20, "balance")
    assert [r.expected_cost for r in requests(eff, "N1")] == [10.0]  # unmarked: on at once, on the lower label


@pytest.mark.parametrize("change", ["remove", "recost"])
def test_a_removal_or_a_changed_cost_at_a_relay_ends_the_formation_of_the_wave(change):
    m = relay()
    delivered(m, m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0),))))
    m.remove_neighbour(0.20, "N2") if change == "remove" else m.add_neighbour(0.20, "N2", 4.0, "next")
    # N1's label of the wave, still marked, lowers ours: it goes out unmarked all the same
    labs = announced(delivered(m, m.on_message(0.30, "N1", CostAnnounce((wave_label("N1", 8.0),)))))
    assert labs and all(lab.epoch == 1 and not lab.formation for lab in labs)
    assert [r.expected_cost for r in requests(m.on_message(0.35, "P1", RequestFlow(1, D, 11.0)), "N1")] == [8.0]


def newcomer_sent_its_label() -> FlowNode:
    """N3's label of the wave came before this relay was told of the newcomer (kept aside), then it is added."""
    m = relay()
    delivered(m, m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0),))))
    m.on_message(0.15, "N3", CostAnnounce((wave_label("N3", 8.0),)))
    delivered(m, m.add_neighbour(0.20, "N3", 1.0, "next"))
    return m


def test_a_newcomers_earlier_label_waits_for_the_next_wave():
    """A new neighbour during a formation wave: the wave stays one, and the label the newcomer sent before it was
    added waits (units move on this wave's labels as computed without it); its label of the next wave counts."""
    m = newcomer_sent_its_label()
    assert m.wave.formation == {D: 1} and m.labels.my_in[D].cost == 13.0  # via N1: 3 + 10
    labs = announced(delivered(m, m.on_message(0.50, "N3", CostAnnounce((wave_label("N3", 8.0, epoch=2),)))))
    assert m.wave.formation == {D: 2} and not m.wave.deferred
    assert {(lab.cost, lab.epoch, lab.formation) for lab in labs if lab.side is Side.IN} == {(9.0, 2, True)}


def test_a_newcomers_earlier_label_counts_after_a_while_without_a_new_wave():
    m = newcomer_sent_its_label()
    wait = m.cfg.retry_epoch_rounds * m.cfg.round_s
    m.on_timer(0.20 + wait - 0.01, "tick")
    assert m.labels.my_in[D].cost == 13.0
    labs = announced(delivered(m, m.on_timer(0.20 + wait, "tick")))
    assert m.labels.my_in[D].cost == 9.0 and {lab.cost for lab in labs if lab.side is Side.IN} == {9.0}
    assert m.wave.formation == {D: 1}


def test_the_earlier_label_does_not_replace_one_the_newcomer_sent_once_added():
    m = newcomer_sent_its_label()  # its label 8 of the wave waits
    delivered(m, m.on_message(0.30, "N3", CostAnnounce((wave_label("N3", 7.0),))))  # sent once added: counts
    assert m.labels.my_in[D].cost == 8.0
    delivered(m, m.on_timer(0.20 + m.cfg.retry_epoch_rounds * m.cfg.round_s, "tick"))  # the wait ends
    assert m.labels.my_in[D].cost == 8.0 and not m.wave.deferred


def test_a_label_the_newcomer_sends_once_added_counts_as_a_fall_of_the_wave():
    m = relay()
    delivered(m, m.on_message(0.10, "N1", CostAnnounce((wave_label("N1", 10.0),))))
    m.add_neighbour(0.20, "N3", 1.0, "next")
    labs = announced(delivered(m, m.on_message(0.30, "N3", CostAnnounce((wave_label("N3", 8.0),)))))
    assert m.labels.my_in[D].cost == 9.0 and {(lab.cost, lab.formation) for lab in labs} == {(9.0, True)}
    eff = m.on_message(0.35, "P1", RequestFlow(1, D, 9.0))  # our IN label: 1 + 8, via the newcomer
    assert not requests(eff, "N3") and timers(eff, "balance")  # held: a formation wave whose labels here just fell


def test_the_data_node_marks_its_waves_until_it_loses_a_unit():
    m, eff = data_node()
    e0 = m.epoch[D]
    assert announced(eff) and all(lab.formation and lab.epoch == e0 for lab in announced(eff))
    # its launched unit reaches the sink: a new wave, still a formation wave
    m.launch.pending = 1
    eff = delivered(m, m.on_message(1.0, "Z", RequestFlow(7, D, 0.0)))
    assert m.inn[D] == {"Z": 1} and m.epoch[D] == e0 + 1 and m.launch.pending == 0
    assert announced(eff) and all(lab.formation for lab in announced(eff))
    m.on_timer(1.5, "tick")
    # a Withdraw takes it back (a relay upstream was removed): at the next tick an unmarked wave, and no more marks
    m.on_message(2.0, "Z", Withdraw(8, D))
    assert m.inn[D] == {} and m.epoch[D] == e0 + 1
    eff = delivered(m, m.on_timer(2.5, "tick"))
    assert m.epoch[D] == e0 + 2 and announced(eff) and not any(lab.formation for lab in announced(eff))
    m.launch.pending = 1
    m.on_message(3.0, "Z", RequestFlow(9, D, 0.0))
    assert m.epoch[D] == e0 + 3 and not m.wave.formation


def test_a_unit_that_reaches_the_sink_unlaunched_ends_the_formation_waves():
    m, _ = data_node()
    e0 = m.epoch[D]
    eff = delivered(m, m.on_message(1.0, "Z", RequestFlow(7, D, 0.0)))  # re-routed after a removal upstream
    assert m.epoch[D] == e0 + 1 and announced(eff) and not any(lab.formation for lab in announced(eff))


@pytest.mark.parametrize("change", ["remove", "recost"])
def test_a_neighbour_of_the_data_node_going_or_changing_cost_ends_its_formation_waves(change):
    m, _ = data_node()
    e0 = m.epoch[D]
    eff = delivered(m, m.remove_neighbour(1.0, "A") if change == "remove" else m.add_neighbour(1.0, "A", 3.0, "next"))
    assert m.epoch[D] == e0 + 1  # a new wave, unmarked
    assert not any(lab.formation for lab in announced(eff))
    assert not m.wave.formation and m.wave.reformed


def test_a_newcomer_next_to_the_data_node_keeps_its_formation_waves():
    m, _ = data_node()
    e0 = m.epoch[D]
    eff = delivered(m, m.add_neighbour(1.0, "Y", 2.0, "prev"))  # a last-stage relay joins: told the sink label
    assert m.epoch[D] == e0 and m.wave.formation == {D: e0} and not m.wave.reformed
    labs = [e.msg.labels for e in eff if isinstance(e, Send) and e.to == "Y" and isinstance(e.msg, CostAnnounce)]
    assert labs and all(lab.formation and lab.epoch == e0 for ls in labs for lab in ls)
    m.add_neighbour(1.5, "B", 2.0, "next")  # a first-stage relay joins: nothing launched yet, so it counts at once
    assert m.epoch[D] == e0 and m.wave.formation == {D: e0} and not m.wave.deferred


def test_a_fall_long_after_the_wave_holds_a_unit_no_longer_than_the_data_node_waits():
    m = relay()
    m.on_message(0.10, "N2", CostAnnounce((wave_label("N2", 9.0),)))
    m.set_cost(60.0, "N1", 3.0)  # (no label of N1 yet: nothing changes)
    m.on_message(60.0, "N1", CostAnnounce((wave_label("N1", 10.0),)))  # a fall a minute into the wave
    eff = m.on_message(60.05, "P1", RequestFlow(1, D, 13.0))
    cap = m.cfg.retry_epoch_rounds * m.cfg.round_s
    assert not requests(eff, "N1") and timers(eff, "balance") == [60.0 + m.cfg.launch_quiet_factor * cap]

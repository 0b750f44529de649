"""`scripts/bench_flow_scale.py --bound`: successive shortest paths computed centrally reach the optimum (networkx
min-cost max-flow), and the flow machines' label waves are never fewer than the distinct augmentation costs (the
waves of a primal-dual scheme, which docs/bench_flow.md quotes as the floor of the wave count)."""

from __future__ import annotations

import pytest

from gwtf_node.sim.baselines import optimal_routing
from gwtf_node.sim.flowsim import run_gwtf
from gwtf_node.sim.scenarios import load_flow_setting

from support.helpers import load_script


def _bench():
    return load_script("bench_flow_scale")


@pytest.mark.parametrize("setting, seed", [(1, 0), (3, 0), (3, 1)])
def test_ssp_bound_is_the_optimum_and_a_floor_of_the_waves(setting, seed):
    sc = load_flow_setting(setting, seed)
    bound = _bench().ssp_waves(sc)
    opt = optimal_routing(sc)
    assert bound["ssp_units"] == opt.num_flows
    assert bound["ssp_total_cost"] == pytest.approx(opt.mean_cost * opt.num_flows)
    assert 1 <= bound["pd_waves"] <= bound["ssp_units"]
    assert 0 < bound["tight_in_per_node_pd"] <= bound["changed_in_per_node_pd"] <= bound["changed_in_per_node"]
    assert bound["changed_in_per_node"] <= bound["ssp_units"] * bound["links_per_node"] + 1e-9
    run = run_gwtf(sc, seed=seed)
    assert run.num_flows == opt.num_flows
    assert run.extra["waves"] >= bound["pd_waves"]


def test_setting3_seed0_has_fewer_primal_dual_waves_than_augmentations():
    bound = _bench().ssp_waves(load_flow_setting(3, 0))
    assert (bound["ssp_units"], bound["pd_waves"]) == (47, 22)


def test_skewed_links_count_the_links_whose_reduced_cost_rises():
    """A limit told against the floors of the previous wave (reduced costs) holds on a link whose two ends rose
    alike; `_skew` counts the others (the receiver's threshold rose more than the sender's label), by > 0 and by
    more than the slack."""
    b = _bench()
    prevs = {"r": [(("o", "p"), 1.0), (("o", "q"), 1.0), (("o", "u"), 1.0)]}
    skew = [0, 0]
    # r's IN label rises by 1; p's OUT label by 1 (uniform), q's by 2, u's by 5 (more than 1 + the slack 2)
    b._skew(skew, prevs, {"r": 10.0}, {"r": 11.0}, {("o", "p"): 11.0, ("o", "q"): 11.0, ("o", "u"): 11.0},
            {("o", "p"): 12.0, ("o", "q"): 13.0, ("o", "u"): 16.0})
    assert skew == [2, 1]
    # an unreachable end counts nothing
    b._skew(skew, prevs, {"r": 10.0}, {"r": float("inf")}, {("o", "u"): 11.0}, {("o", "u"): 16.0})
    assert skew == [2, 1]
    bound = b.ssp_waves(load_flow_setting(3, 0))
    assert 0 <= bound["skewed_links_per_node_pd_slack"] <= bound["skewed_links_per_node_pd"] \
        <= bound["pd_waves"] * bound["links_per_node"]


def test_rises_count_the_usual_rise_per_stage_and_what_a_pruned_wave_announces():
    """`_rises`: per stage the labels that rose by the stage's most common rise, the announcements (to every
    previous-stage peer) of the labels that rose by at most the data node's rise, a label newly reachable
    included (an unreachable one is not), and those of the labels that did not rise by their stage's usual rise
    (one that became reachable or unreachable included)."""
    b = _bench()
    inf = float("inf")
    stage_of = {"a": 0, "b": 0, "c": 0, "x": 1, "y": 1, "z": 1}
    prevs = {r: [(("o", "p"), 1.0)] * (2 if stage_of[r] == 0 else 3) for r in stage_of}
    old = {"a": 5.0, "b": 6.0, "c": 7.0, "x": 2.0, "y": 3.0, "z": inf}
    new = {"a": 7.0, "b": 8.0, "c": 12.0, "x": 2.0, "y": inf, "z": 4.0}
    rises = [0, 0, 0, 0]
    b._rises(rises, prevs, stage_of, old, new, top=2.0)
    # stage 0: rises 2, 2, 5 (usual 2: two of three); stage 1: x rose by 0 (one of one; y and z are not finite
    # both times).  Announced: a, b (rose by 2 <= 2: 2 peers each), x (0: 3 peers), z (newly reachable: 3 peers).
    # Not by the usual rise: c (2 peers), y (now unreachable: 3 peers), z (newly reachable: 3 peers)
    assert rises == [4, 3, 2 + 2 + 3 + 3, 2 + 3 + 3]
    bound = b.ssp_waves(load_flow_setting(3, 0))
    assert 0 < bound["stage_rise_share_pd"] <= 1
    assert bound["links_per_node"] < bound["stage_shift_per_node_pd"] \
        <= bound["links_per_node"] + (bound["pd_waves"] - 1) * (1 + bound["links_per_node"]) + 0.2  # (rounded)
    assert bound["tight_in_per_node_pd"] <= bound["pruned_in_per_node_pd"] <= bound["pd_waves"] * bound["links_per_node"]


def test_truncated_counts_labels_that_rose_less_than_the_data_node():
    """`_truncated`: an IN label that rose by less than the data node's rise (an unchanged one included), or became
    reachable or unreachable, goes to every previous-stage peer; one that rose by the data node's rise exactly or
    more needs no message; an OUT label that rose by less goes to the next-stage relays its node sends units to."""
    b = _bench()
    inf = float("inf")
    prevs = {"a": [(("o", "p"), 1.0)] * 2, "b": [(("o", "p"), 1.0)] * 3, "c": [(("o", "p"), 1.0)] * 4,
             "x": [(("o", "q"), 1.0)] * 5, "y": [(("o", "q"), 1.0)] * 6}
    old = {"a": 5.0, "b": 6.0, "c": 7.0, "x": 2.0, "y": inf}
    new = {"a": 5.0, "b": 9.0, "c": 8.0, "x": inf, "y": 4.0}
    # p sends units to a and b (the reverse arcs i-side > p hold capacity), not to c; its own i-side does not count
    g = {("o", "p"): {("i", "a"): [0, 3.0], ("i", "b"): [0, 3.0], ("i", "c"): [1, 3.0], ("i", "p"): [0, 0.0]},
         ("i", "a"): {("o", "p"): [1, -3.0]}, ("i", "b"): {("o", "p"): [1, -3.0]}, ("i", "c"): {("o", "p"): [0, -3.0]},
         ("i", "p"): {("o", "p"): [1, 0.0]}}
    trunc = [0, 0]
    b._truncated(trunc, g, prevs, (old, new), ({("o", "p"): 10.0}, {("o", "p"): 12.0}), top=3.0)
    # a unchanged (2 peers), c rose by 1 < 3 (4), x now unreachable (5), y newly reachable (6); b rose by 3: silent.
    # p's OUT label rose by 2 < 3: to a and b
    assert trunc == [2 + 4 + 5 + 6, 2]
    b._truncated(trunc, g, prevs, (new, new), ({("o", "p"): 12.0}, {("o", "p"): 15.0}), top=3.0)
    assert trunc == [17 + 2 + 3 + 4 + 6, 2]  # every finite IN label unchanged: told; x unreachable both times: not
    bound = b.ssp_waves(load_flow_setting(3, 0))
    assert bound["truncated_in_per_node_pd"] <= (bound["pd_waves"] - 1) * bound["links_per_node"] + 0.1
    assert bound["truncated_per_node_pd"] == pytest.approx(
        bound["links_per_node"] + bound["truncated_in_per_node_pd"] + bound["truncated_out_per_node_pd"]
        + (bound["pd_waves"] - 1) * (1 - 1 / 41), abs=0.2)  # 41 nodes: one message a node but the data node's


@pytest.mark.parametrize("bcast, sent", [(float("inf"), 9), (1.0, 8)])
def test_choosers_count_rises_to_choosers_and_requests_for_stale_candidates(bcast, sent):
    """`Choosers`: every label once to every peer, a rise only to the peer that chooses it (or, with `bcast`, to
    every peer once it rose that much), and a request and its answer for a candidate whose stale label made it
    look cheapest; the peer ends on the exact cheapest candidate and tells it (and the old choice)."""
    ch = _bench().Choosers({"a": [("p", 1.0)], "b": [("p", 2.0)], "c": [("p", 5.0)]}, bcast)
    ch.step({"a": 10.0, "b": 10.0, "c": 10.0})
    assert (ch.sent, ch.choice) == (4, {"p": "a"})  # three labels, then p tells its choice a (1 + 10)
    # a rises to 13 (p chooses it: told), b to 11 (told only with bcast 1), c stays: p's cheapest is b (2 + 11)
    ch.step({"a": 13.0, "b": 11.0, "c": 10.0})
    assert (ch.sent, ch.choice, ch.known[("p", "b")]) == (sent, {"p": "b"}, 11.0)


def test_choosers_send_fewer_than_every_label_to_every_peer():
    bound = _bench().ssp_waves(load_flow_setting(3, 0))
    assert bound["links_per_node"] <= bound["choosers_per_node"] < bound["changed_in_per_node"]
    assert bound["choosers_per_node_bcast4"] >= bound["links_per_node"]


def test_receipts_split_the_labels_told_by_why_they_went_out():
    """`--receipts`' `sent_per_node`: the labels the flush tells, once per recipient, split into the first of a wave,
    falls within it and new routes at the same cost.  With one commodity a CostAnnounce carries one label, so the
    split adds up to the CostAnnounces sent (but the few that go out other than through the flush, within the
    rounding); the wrapping is undone on exit."""
    from gwtf_node.protocol.flow import announce

    b = _bench()
    sc = load_flow_setting(1, 0)
    flush = announce.flush
    with b.Receipts() as rec:
        run = run_gwtf(sc, seed=0)
    assert announce.flush is flush
    split = rec.report(len(sc.nodes))["sent_per_node"]
    assert set(split) <= {f"{s}_{w}" for s in ("in", "out") for w in ("wave", "fall", "route")}
    assert split["in_wave"] > 0 and split["in_fall"] > 0 and split["out_wave"] > 0
    told = sum(split.values()) * len(sc.nodes)
    labels = run.extra["messages_by_type"]["CostAnnounce"]
    assert 0.9 * labels <= told <= labels + 0.05 * len(sc.nodes) * len(split)  # each key rounded to 0.1 a node

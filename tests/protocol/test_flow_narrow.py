"""With several data nodes an IN label depends on every commodity (cross displacement), yet a flow machine
recomputes only what changed: the commodities of next-stage IN labels (`announce.refresh(narrow=True)`), those
whose RelabelCosts moved (`RelabelState.stale`), and the RelabelCost pairs whose inputs moved
(`relabel.relabel_costs`).  These tests run swarms of several data nodes and check, after every such narrowed
step, that a full recomputation would have changed nothing."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.flow import announce, labels, relabel
from gwtf_node.protocol.messages import INF
from gwtf_node.protocol.flow.state import EPS
from gwtf_node.sim.train import run_train


def _labels_of(node, d):
    return node.my_in.get(d), node.my_out.get(d), node.dec_in.get(d), node.dec_out.get(d)


def _best_from_scratch(node, a, b):
    """`relabel_costs`'s value of pair (a, b), computed over every input as the unnarrowed code does."""
    cms, nxt = node.cfg.commodities, node.cfg.next_costs
    best, arg = INF, None
    rl = node.relabelling.heard.get((a, b), {})
    for j in sorted(node.out[a]):
        if node.out[a][j] <= 0:
            continue
        v = (nxt[b] - nxt[j] if b in nxt and j in nxt else INF) if j in cms else rl.get(j, INF)
        if v < best - EPS:
            best, arg = v, j
    return best, arg


@pytest.fixture
def checked(monkeypatch):
    seen = {"narrowed": 0, "others": 0, "label_diffs": 0, "pairs": 0, "pair_diffs": 0}
    refresh, costs = announce.refresh, relabel.relabel_costs

    def checking_refresh(node, commodities, eff, force_to=None, folds=None, backs=None, narrow=False):
        stale = set(node.relabelling.stale)
        refresh(node, commodities, eff, force_to, folds, backs, narrow)
        if not (narrow and node.cross) or node.cfg.is_data:
            return
        seen["narrowed"] += 1
        for d in node.cfg.commodities:
            if d in commodities or d in stale:
                continue
            kept, cache = _labels_of(node, d), node.cache.get(d)
            labels.compute(node, d)  # what the unnarrowed refresh would have computed
            seen["others"] += 1
            seen["label_diffs"] += _labels_of(node, d) != kept
            node.my_in[d], node.my_out[d], node.dec_in[d], node.dec_out[d] = kept
            node.cache[d] = cache

    def checking_costs(node, eff):
        costs(node, eff)
        for (a, b), got in node.relabelling.best.items():
            seen["pairs"] += 1
            seen["pair_diffs"] += _best_from_scratch(node, a, b) != got

    monkeypatch.setattr(announce, "refresh", checking_refresh)
    monkeypatch.setattr(relabel, "relabel_costs", checking_costs)
    return seen


@pytest.mark.parametrize("setting,churn", [("table6-x1", 0.0), ("table6-x2", 0.1)])
def test_narrowed_recomputation_changes_nothing_a_full_one_would(checked, setting, churn):
    r = run_train(setting, "gwtf", churn, 2, 0, placement="swarm")
    assert r["flow_messages"] > 0
    assert checked["narrowed"] > 100 and checked["others"] > 100 and checked["pairs"] > 1000
    assert checked["label_diffs"] == 0
    assert checked["pair_diffs"] == 0


def test_label_without_init_is_the_same_label():
    from dataclasses import FrozenInstanceError

    from gwtf_node.protocol.flow.state import label, stamped
    from gwtf_node.protocol.messages import Label, Side

    fast, slow = label("d1", Side.OUT, 2.5, ("a+", "b-")), Label("d1", Side.OUT, 2.5, ("a+", "b-"))
    assert fast == slow and hash(fast) == hash(slow) and fast.epoch == 0
    assert stamped(fast, 3) == Label("d1", Side.OUT, 2.5, ("a+", "b-"), 3)
    with pytest.raises(FrozenInstanceError):
        fast.cost = 1.0

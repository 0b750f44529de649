"""`sim train` runs what the daemon runs: joining through the leader's membership machine, the daemon's timing
priors, and the daemon's all-reduce algorithm (gwtf_node/sim/train/joining.py, allreduce.py,
protocol/recovery/priors.py)."""

from __future__ import annotations

import pytest

from gwtf_node.protocol.recovery.priors import E2E_PRIOR_S, HOP_PRIOR_S, e2e_prior_s, hop_prior_s, hop_priors
from gwtf_node.sim import train as T
from gwtf_node.sim.train.setting import OPTIMIZER_STEP_S, gradient_mb


def test_priors_are_the_fixed_ones_on_loopback_and_grow_with_the_transfer() -> None:
    assert hop_prior_s(0.0) == HOP_PRIOR_S and e2e_prior_s(4, [0.0, 0.0]) == E2E_PRIOR_S
    assert e2e_prior_s(4, []) == E2E_PRIOR_S
    assert hop_prior_s(20_000.0) == pytest.approx(HOP_PRIOR_S + 20.0)
    assert e2e_prior_s(4, [10_000.0, 30_000.0]) == pytest.approx(E2E_PRIOR_S + 2 * 5 * 20.0)
    assert hop_priors({"a": 1000.0, "b": 0.0}) == {"a": HOP_PRIOR_S + 1.0, "b": HOP_PRIOR_S}


@pytest.mark.parametrize("priors", T.PRIOR_RULES)
def test_the_simulators_machines_start_from_the_daemons_priors(priors: str) -> None:
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, priors=priors))
    relay, nxt = "s1r0", "s2r0"
    rec = sim.nodes[relay].rec
    links = hop_prior_s(sim._flow_cost(relay, nxt))
    if priors == "links":
        assert rec.est[nxt] == links
        d = sim.nodes["d0"].rec
        assert d.e2e_est == e2e_prior_s(len(T.STAGE_SIZES), [sim._flow_cost("d0", j) for j in d.next_peers])
    else:
        assert rec.est[nxt] != links


def test_a_crashed_relay_rejoins_through_the_leaders_placement_at_the_bottleneck() -> None:
    """Two of stage 2's three relays die: their machines come back as joiners, ask the elected leader, are placed
    in stage 2 (the bottleneck), load the state after the current iteration's step from the stage's last member
    and come in with that many steps applied.  (Told stage costs only: told link costs too, as by default, the
    search finds C / F^2 a hair lower with the second joiner in stage 1, 4437 against 4458.)"""
    s = T.make_setting("table2-homogeneous", 0)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, crash_plan=[(100.0, "s2r0"), (100.0, "s2r1")],
                                         join_links=False))
    sim.trace = []
    sim.run(4)
    rep = sim.report(4)
    assert rep["lost_microbatches"] == 0 and rep["unfinished_iterations"] == 0
    assert rep["joining"] == {"asked": 2, "placed": 2, "loaded": 2, "in": 2, "stuck": 0, "waiting": 0}
    joiners = sorted(n for n in sim.nodes if "~" in n)
    assert len(joiners) == 2 and all(sim.stage[j] == 2 for j in joiners)
    msgs = [(e[5], e[3], e[4]) for e in sim.trace if e[0] == "ctl"]
    leader = next(d for d in T.DATA_NODES if sim.nodes[d].leader.is_leader(sim.now))
    for j in joiners:
        assert ("JoinRequest", j, leader) in msgs
        assert ("Assignment", leader, j) in msgs
        assert ("StageStateRequest", j, "s2r2") in msgs  # the only member left is the source
        assert sim.nodes[j].phases.applied >= 1  # the state after a step, never the one in flight
    assert ("UtilizationReport", "s2r2", leader) in msgs


def test_a_stage_that_lost_every_member_after_the_first_step_takes_no_joiner() -> None:
    """No member is left to hand its state over: the leader places the joiners elsewhere.  In the model without
    the pause (`pause_empty=False`) the iterations defer their microbatches without stalling; the daemon pauses
    instead, until the stage comes back from a checkpoint (tests/sim/test_sim_pausing_rules.py)."""
    s = T.make_setting("table2-homogeneous", 0)
    crash = [(200.0, r) for r in ("s2r0", "s2r1", "s2r2")]
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, crash_plan=crash, pause_empty=False))
    sim.run(3)
    rep = sim.report(3)
    assert rep["unfinished_iterations"] == 0 and rep["lost_microbatches"] == 0
    assert not [n for n in sim.nodes if sim.stage.get(n) == 2 and n not in sim.dead]
    assert rep["joining"]["in"] == 3 and rep["deferred_microbatches"] > 0
    # the older model restores the stage (with a state from nowhere): nothing deferred
    sim2 = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, crash_plan=crash, joining="restart",
                                          pause_empty=False))
    sim2.run(3)
    assert sim2.report(3)["deferred_microbatches"] == 0


def _round_ends(sim: T.TrainSim, members: list[str]) -> dict[str, float]:
    """The owner-based all-reduce of runtime/node/allreduce.py over these members, all starting at 0, by hand."""
    n = len(members)
    part = gradient_mb(sim.stage[members[0]]) / n
    sums = {i: max(sim.net.transfer_s(j, i, part) for j in members if j != i) for i in members}
    return {j: max([sums[j]] + [sums[i] + sim.net.transfer_s(i, j, part) for i in members if i != j])
            + OPTIMIZER_STEP_S for j in members}


def test_the_step_is_the_daemons_all_reduce_over_the_links() -> None:
    s = T.make_setting("table2-heterogeneous", 3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=3))
    group = sorted(r for r in s.relays if s.relays[r][0] == 1)
    for r in group[:-1]:
        sim._start_step(r, 0)
        assert sim._agg_pending[r][1] is None  # waiting for the others: a round is collective
    sim._start_step(group[-1], 0)
    want = _round_ends(sim, group)
    assert {r: sim._agg_pending[r][0] for r in group} == pytest.approx(want)


def test_a_member_dead_before_its_part_makes_the_survivors_redo_the_round_at_the_report() -> None:
    s = T.make_setting("table2-heterogeneous", 3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=3))
    group = sorted(r for r in s.relays if s.relays[r][0] == 1)
    dead = group[0]
    for r in group[1:]:
        sim._start_step(r, 0)
    sim._crash(dead)  # it never started its step: the round cannot complete
    assert all(sim._agg_pending[r][1] is None for r in group[1:])
    sim.reported_gone.add(dead)
    sim._allreduce_gone(dead)
    assert {r: sim._agg_pending[r][0] for r in group[1:]} == pytest.approx(_round_ends(sim, group[1:]))


def test_cli_sim_train_takes_the_parity_switches(capsys) -> None:
    import json

    from gwtf_node import cli
    assert cli.main(["sim", "train", "--setting", "table2-homogeneous", "--churn", "0.1", "--policy", "swarm",
                     "--iterations", "2", "--seed", "1", "--joining", "restart", "--priors", "modelled",
                     "--no-spare-last", "--no-join-links", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lost_microbatches"] == 0
    args = cli.build_parser().parse_args(["sim", "train", "--setting", "table2-homogeneous", "--churn", "0",
                                          "--policy", "gwtf", "--iterations", "1", "--seed", "0"])
    opts = cli.sim_train_options(args)
    assert (opts["joining"], opts["priors"], opts["spare_last"], opts["join_links"]) == ("machines", "links", True, True)


def test_a_round_started_after_a_crash_it_did_not_hear_of_yet_is_redone_at_the_report() -> None:
    """The dead member is still in the group (not reported yet) when the others start: they redo the round
    without it at the report (seed 1, heterogeneous, 20 %: the run used to stall there)."""
    s = T.make_setting("table2-heterogeneous", 3)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=3))
    group = sorted(r for r in s.relays if s.relays[r][0] == 1)
    dead = group[0]
    sim._crash(dead)
    for r in group[1:]:
        sim._start_step(r, 0)
    sim.reported_gone.add(dead)
    sim._allreduce_gone(dead)
    assert {r: sim._agg_pending[r][0] for r in group[1:]} == pytest.approx(_round_ends(sim, group[1:]))


@pytest.mark.parametrize("join_links", [True, False])
def test_joiners_and_members_tell_the_leader_their_link_costs_as_the_daemon(join_links: bool) -> None:
    """A joiner's JoinRequest carries the Equation 1 cost of its link to every live node (`Joining.join`), a
    member's UtilizationReport the costs of its flow links (`Joining.on_utilization_query`), so the leader's
    search routes over them (`known_links`, `place_by_search`); `join_links=False` tells stage costs only."""
    from gwtf_node.protocol.messages import JoinRequest, UtilizationReport

    class Capture(T.TrainSim):
        def _send(self, nid, e):
            fm = self.fnodes.get(nid)
            self.sent.append((nid, e.to, e.msg, None if fm is None else set(fm.cfg.prev_costs) | set(fm.cfg.next_costs)))
            super()._send(nid, e)

    s = T.make_setting("table2-homogeneous", 0)
    sim = Capture(s, T.TrainSimOptions(policy="gwtf", churn=0.0, seed=0, crash_plan=[(100.0, "s2r0")],
                                       join_links=join_links))
    sim.sent = []
    sim.run(3)
    assert sim.report(3)["joining"]["in"] == 1
    requests = [(a, m) for a, _b, m, _links in sim.sent if isinstance(m, JoinRequest)]
    reports = [(a, m, links) for a, _b, m, links in sim.sent if isinstance(m, UtilizationReport)]
    assert requests and reports
    for joiner, msg in requests:
        if not join_links:
            assert msg.link_costs == ()
            continue
        told = dict(msg.link_costs)
        assert set(told) >= set(T.DATA_NODES) and "s2r1" in told and joiner not in told and "s2r0" not in told
        assert all(told[p] == pytest.approx(sim._flow_cost(joiner, p), abs=1e-3) for p in told)
    for _member, msg, links in reports:  # a member: its flow machine's links when it answered
        if not msg.serving:  # a joiner answers from its JoinerMachine, with no flow links yet (as in the daemon)
            assert msg.link_costs == () and links is None
            continue
        if not join_links:
            assert msg.link_costs == ()
            continue
        assert dict(msg.link_costs).keys() == links

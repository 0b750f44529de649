"""Value bounds of the wire messages (protocol/bounds.py): one check per type, each code reachable, honest
runs never refused."""

from __future__ import annotations

import inspect
import typing
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf_node.protocol import bounds
from gwtf_node.protocol import messages as m
from gwtf_node.protocol.bounds import Context, Violation
from gwtf_node.protocol.flow import FlowNode
from gwtf_node.protocol.scenario import parse_scenario
from gwtf_node.sim.flowsim import run_gwtf

from test_flowsim import layered

CTX = Context(n_stages=2, iteration=10, term=3, epochs={"d": 5}, sender_capacity=2, units_from_sender=2,
              hidden_shape=(2, 8, 16), hidden_dtype="float32", grad_len=100)
H = m.TensorHeader("float32", (2, 8, 16), 2 * 8 * 16 * 4)


def test_every_wire_message_has_a_check():
    assert set(bounds.CHECKS) == set(typing.get_args(m.Message))


def test_every_violation_code_says_why_in_a_comment():
    src = inspect.getsource(Violation)
    for v in Violation:
        line = next(ln for ln in src.splitlines() if ln.strip().startswith(f"{v.name} ="))
        assert '# "' in line, f"{v.name} has no one-line reason"


REFUSED = [
    (m.CostAnnounce((m.Label("d", m.Side.IN, -5.0, ()),)), Violation.NEGATIVE_COST),
    (m.CostAnnounce((m.Label("d", m.Side.IN, 1e12, ()),)), Violation.COST_OUT_OF_RANGE),
    (m.CostAnnounce((m.Label("d", m.Side.IN, float("-inf"), ("a+",)),)), Violation.COST_OUT_OF_RANGE),
    (m.CostAnnounce((m.Label("d", m.Side.IN, 3.0, (), epoch=2**31),)), Violation.EPOCH_JUMP),
    (m.CostAnnounce((m.Label("e", m.Side.IN, 3.0, (), epoch=2**21),)), Violation.EPOCH_JUMP),  # unseen commodity
    (m.RequestFlow(1, "d", 3.0), Violation.OVER_CAPACITY),  # the sender hands us 2 units already, its capacity
    (m.LinkCost(-1.0), Violation.NEGATIVE_COST),
    (m.LinkCost(float("inf")), Violation.COST_OUT_OF_RANGE),
    (m.RequestRedirect(1, "d", "a", "b", -3.0, False), Violation.NEGATIVE_COST),
    (m.LeaderHeartbeat(3 + 65, 0.0, ()), Violation.TERM_JUMP),
    (m.RequestVote(2**40, False, 0.0), Violation.TERM_JUMP),
    (m.Assignment(4, "n", 7, "s", 11), Violation.STAGE_OUT_OF_RANGE),
    (m.Forward("d", 1, 10 + 17, ("d",), H), Violation.ITERATION_FAR),
    (m.BeginAggregation(2**40, 1), Violation.ITERATION_FAR),
    (m.Forward("d", 1, 10, ("d",), m.TensorHeader("float16", (2, 8, 16), 2 * 8 * 16 * 2)), Violation.TENSOR_DTYPE),
    (m.Backward("d", 1, 10, m.TensorHeader("float32", (2, 8, 17), 2 * 8 * 17 * 4)), Violation.TENSOR_SHAPE),
    (m.Backward("d", 1, 10, m.TensorHeader("float32", (2, 8, 16), 12)), Violation.TENSOR_SIZE),
    (m.Backward("d", 1, 10, None), Violation.TENSOR_SHAPE),
    # Top-K (model/compression.py): k int32 indices and k values, k at most the tensor's elements
    (m.Forward("d", 1, 10, ("d",), m.TensorHeader("float32", (2, 8, 16), 2 * 8 * 16 * 4, sparse_kept=64)),
     Violation.TENSOR_SIZE),
    (m.Forward("d", 1, 10, ("d",), m.TensorHeader("float32", (2, 8, 16), 300 * 8, sparse_kept=300)),
     Violation.TENSOR_SIZE),
    (m.AllReduceChunk("k", 0, 1, 1.5, m.TensorHeader("float32", (4,), 16)), Violation.COUNT_OUT_OF_RANGE),
    (m.AllReduceChunk("k", 0, 1, 1.0, m.TensorHeader("float32", (400,), 1600)), Violation.TENSOR_SHAPE),
    (m.AllReduceChunk("k", 0, 3, 1.0, m.TensorHeader("float32", (4,), 16)), Violation.COUNT_OUT_OF_RANGE),
    # the run's wire dtype (float32 in CTX): a bfloat16 all-reduce chunk is another run's
    (m.AllReduceChunk("k", 0, 1, 1.0, m.TensorHeader("bfloat16", (4,), 8)), Violation.TENSOR_DTYPE),
    (m.IterationDone(10, 2**30, 1.0), Violation.COUNT_OUT_OF_RANGE),
    (m.IterationDone(10, 2, float("inf")), Violation.COUNT_OUT_OF_RANGE),
    (m.IterationDone(10, 2, 1.0, completed_seqs=(3, 4), completed_attempts=(0,)), Violation.COUNT_OUT_OF_RANGE),
    (m.BeginAggregation(10, 2, completed=(m.CompletedSeqs("d", (3, 4), (0, 1, 2)),)), Violation.COUNT_OUT_OF_RANGE),
    # holders: one per seq and stage of the run (CTX: 2 stages)
    (m.IterationDone(10, 2, 1.0, completed_seqs=(3, 4), completed_holders=(1, 2, 3)), Violation.COUNT_OUT_OF_RANGE),
    (m.BeginAggregation(10, 2, completed=(m.CompletedSeqs("d", (3, 4), (), (7,) * 6),)), Violation.COUNT_OUT_OF_RANGE),
    (m.FlowReport(1, 2**30, 0, (), (), ()), Violation.COUNT_OUT_OF_RANGE),
    (m.PeerList(tuple("a" for _ in range(5000))), Violation.TOO_MANY),
    (m.Revocations(b""), Violation.TOO_MANY),
    (m.Revocations(b"x" * (bounds.MAX_REVOCATIONS_BYTES + 1)), Violation.TOO_MANY),
    (m.Hello("r", "relay", 0, "x" * 5000, 1, ()), Violation.TOO_MANY),
    (m.JoinRequest(1, (-1.0,)), Violation.NEGATIVE_COST),
    (m.RelabelCost("a", "b", 1.0, (m.RelabelPair("a", "c", float("-inf")),)), Violation.COST_OUT_OF_RANGE),
    (m.RelabelCost("a", "b", 1.0, tuple(m.RelabelPair("a", "c", 1.0) for _ in range(5000))), Violation.TOO_MANY),
    (m.RelabelCost("a" * (bounds.MAX_STRING_CHARS + 1), "b", 1.0), Violation.TOO_MANY),
]


@pytest.mark.parametrize("msg,code", REFUSED, ids=lambda x: type(x).__name__ if not isinstance(x, Violation) else "")
def test_out_of_range_values_are_refused_with_their_code(msg, code):
    p = bounds.check(msg, CTX)
    assert p is not None and p.code is code, p


ACCEPTED = [
    m.CostAnnounce((m.Label("d", m.Side.IN, -20.0, ("r2+", "r1-", "d+"), epoch=6),)),  # residual: negative with its route
    m.CostAnnounce((m.Label("d", m.Side.OUT, float("inf"), (), epoch=5 + 256),)),
    m.CostAnnounce((m.Label("e", m.Side.IN, 3.0, (), epoch=5000),)),  # a commodity whose waves this node has not seen
    m.RelabelCost("a", "b", -7.0),
    m.RelabelCost("a", "b", -7.0, (m.RelabelPair("a", "c", 2.0), m.RelabelPair("b", "a", float("inf")))),
    m.Forward("d", 1, 11, ("d",), H),
    m.Forward("d", 1, 11, ("d",), m.TensorHeader("float32", (2, 8, 16), 64 * 8, sparse_kept=64)),  # Top-K
    m.Backward("d", 1, 3, H),  # old: stale, the machines ignore it
    m.LeaderHeartbeat(3 + 64, 0.0, ("d",)),
    m.AllReduceChunk("k", 0, 2, 4.0, m.TensorHeader("float32", (100,), 400)),
    m.IterationDone(10, 4, 12.5, 1, 0),
    m.IterationDone(10, 2, 1.0, completed_seqs=(3, 4), completed_attempts=(0, 2)),
    m.BeginAggregation(10, 2, completed=(m.CompletedSeqs("d", (3, 4), (0, 2), (9,) * 4), m.CompletedSeqs("e", (1,)))),
    m.Assignment(4, "n", 1, "s", 11),
    m.StageStateRequest(-1, 11),  # a restarted data node asks another for the data nodes' part (data_resume.py)
    m.Ping(2**64 - 1),
    m.Hello("r", "relay", -2, "auto", 1, ()),  # a relay the leader has not placed yet
    m.Hello("r", "relay", 5, "other", 1, ()),  # a stage this run lacks: discovery refuses it, with a reply
]


@pytest.mark.parametrize("msg", ACCEPTED, ids=lambda x: type(x).__name__)
def test_values_in_range_pass(msg):
    assert bounds.check(msg, CTX) is None


def test_an_all_reduce_chunk_travels_in_the_runs_wire_dtype():
    bf16 = Context(n_stages=2, iteration=10, hidden_shape=(2, 8, 16), hidden_dtype="bfloat16", grad_len=100)
    assert bounds.check(m.AllReduceChunk("k", 0, 1, 1.0, m.TensorHeader("bfloat16", (4,), 8)), bf16) is None
    assert bounds.check(m.AllReduceChunk("k", 0, 1, 1.0, m.TensorHeader("float32", (4,), 16)),
                        bf16).code is Violation.TENSOR_DTYPE


def test_an_empty_context_skips_the_relative_checks_and_keeps_the_absolute_ones():
    assert bounds.check(m.Forward("d", 1, 2**40, ("d",), H), Context()) is None
    assert bounds.check(m.RequestFlow(1, "d", 3.0), Context()) is None
    assert bounds.check(m.LinkCost(-1.0), Context()).code is Violation.NEGATIVE_COST


def test_request_flow_within_the_senders_capacity_passes():
    ctx = Context(sender_capacity=3, units_from_sender=2)
    assert bounds.check(m.RequestFlow(1, "d", -4.0, forced=True), ctx) is None
    assert bounds.check(m.RequestFlow(1, "d", 4.0), Context(sender_capacity=3, units_from_sender=3)).code \
        is Violation.OVER_CAPACITY


def test_magnitude_bound():
    assert bounds.check_magnitude(1e5, "x") is None
    assert bounds.check_magnitude(1e7, "x").code is Violation.TENSOR_MAGNITUDE


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(obj=layered(max_data=3), seed=st.integers(0, 1000))
def test_flow_machines_of_an_honest_run_never_send_a_value_out_of_bounds(obj, seed):
    """Every message of simulated flow formation (several data nodes, relabelling, moves, waves) passes the
    checks with the context the daemon builds: the receiver's epochs, the sender's capacity and its units."""
    sc = parse_scenario(obj)
    caps = {n.id: n.capacity for n in sc.nodes}
    problems = []
    orig = FlowNode.on_message

    def checked(self, now, sender, msg):
        ctx = Context(epochs=dict(self.epoch), sender_capacity=caps[sender],
                      units_from_sender=bounds.units_from(self.inn, sender))
        if (p := bounds.check(msg, ctx)) is not None:
            problems.append((sender, self.cfg.node_id, msg, p))
        return orig(self, now, sender, msg)

    FlowNode.on_message = checked
    try:
        run_gwtf(sc, seed=seed)
    finally:
        FlowNode.on_message = orig
    assert not problems, problems[:3]


@pytest.mark.parametrize("churn, seed", [(0.1, 3)])
def test_the_training_simulators_messages_stay_in_bounds(churn, seed):
    """Recovery, phases and election of a simulated run with crashes (the same machines as the daemon): every
    message passes the checks with the absolute bounds (node ids are not peer ids there; the context is empty)."""
    from gwtf_node.sim import train as T

    s = T.make_setting("table2-homogeneous", seed)
    sim = T.TrainSim(s, T.TrainSimOptions(policy="gwtf", churn=churn, seed=seed))
    problems = []

    def observe(node, kind, what):
        msg = what[1]
        if isinstance(msg, (m.Forward, m.Backward, m.Recover)) and msg.tensor is None:
            msg = replace(msg, tensor=H)  # the simulator moves no tensors; the daemon attaches them when it sends
        if kind == "msg" and (p := bounds.check(msg, Context())) is not None:
            problems.append((what[0], node, msg, p))

    sim.observer = observe
    sim.run(4)
    assert not problems, problems[:3]

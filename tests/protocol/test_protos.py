"""The wire format: generated code is current, and every message survives encode/decode."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtf_node.protocol.scalemsgs import SIDE_KINDS
from gwtf_node.protocol import codec, messages
from gwtf_node.protocol import gwtf_pb2 as pb
from gwtf_node.protocol.codec import MAX_FRAME_BYTES, DecodeError, EncodeError, decode, encode
from gwtf_node.protocol.messages import (
    BidFeed,
    CostAnnounce,
    Deny,
    DenyReason,
    FlowReply,
    FlowReport,
    HopFlow,
    Label,
    LabelLimit,
    LaunchBid,
    MoveReply,
    QueryFlows,
    Reply,
    RequestChange,
    RequestFlow,
    RequestRedirect,
    Relabel,
    RelabelCost,
    RelabelPair,
    Reroute,
    Side,
    Withdraw,
)
from gwtf_node.protocol import messages as m

ROOT = Path(__file__).resolve().parents[2]
UINT64_MAX = 2**64 - 1
UINT32_MAX = 2**32 - 1
PROTO_ENUMS = {Side: pb.Side, Reply: pb.Outcome, DenyReason: pb.DenyReason, m.PhaseKind: pb.PhaseKind,
               m.RefusalCode: pb.RefusalCode}
PROTO_PREFIX = {Side: "SIDE_", Reply: "OUTCOME_", DenyReason: "DENY_REASON_", m.PhaseKind: "PHASE_KIND_",
                m.RefusalCode: "REFUSAL_CODE_"}

# ---- strategies -----------------------------------------------------------

ids = st.text(st.characters(codec="utf-8"), max_size=12)  # peer ids, commodities
costs = st.floats(allow_nan=False)  # includes +/-inf, -0.0, subnormals
u64 = st.integers(0, UINT64_MAX)
u32 = st.integers(0, UINT32_MAX)
small_tuples = lambda s: st.lists(s, max_size=4).map(tuple)  # noqa: E731

labels = st.builds(Label, commodity=ids, side=st.sampled_from(Side), cost=costs, path=small_tuples(ids), epoch=u32)
hops = st.builds(HopFlow, commodity=ids, peer=ids, count=u32, cost=costs)

STRATEGIES: dict[type, st.SearchStrategy] = {
    CostAnnounce: st.builds(CostAnnounce, labels=small_tuples(labels)),
    RequestFlow: st.builds(RequestFlow, req_id=u64, commodity=ids, expected_cost=costs, forced=st.booleans()),
    FlowReply: st.builds(
        FlowReply, req_id=u64, commodity=ids, outcome=st.sampled_from(Reply), current=st.none() | labels
    ),
    Deny: st.builds(Deny, commodity=ids, reason=st.sampled_from(DenyReason)),
    Withdraw: st.builds(Withdraw, req_id=u64, commodity=ids),
    Reroute: st.builds(Reroute, commodity=ids, to=ids),
    LaunchBid: st.builds(LaunchBid, data_node=ids, seq=u64, cost=costs,
                         feeds=small_tuples(st.builds(BidFeed, data_node=ids, relay=ids)), full=st.booleans()),
    Relabel: st.builds(Relabel, from_commodity=ids, to_commodity=ids),
    RelabelCost: st.builds(RelabelCost, from_commodity=ids, to_commodity=ids, cost=costs,
                           more=small_tuples(st.builds(RelabelPair, from_commodity=ids, to_commodity=ids, cost=costs))),
    LabelLimit: st.builds(LabelLimit, commodity=ids, cost=costs),
    QueryFlows: st.builds(QueryFlows, query_id=u64),
    FlowReport: st.builds(
        FlowReport,
        query_id=u64,
        capacity=u32,
        used=u32,
        inflows=small_tuples(hops),
        outflows=small_tuples(hops),
        next_costs=small_tuples(st.tuples(ids, costs)),
    ),
    RequestChange: st.builds(
        RequestChange,
        move_id=u64,
        commodity=ids,
        requester_next=ids,
        receiver_next=ids,
        requester_delta=costs,
        temperature_accept=st.booleans(),
    ),
    RequestRedirect: st.builds(
        RequestRedirect,
        move_id=u64,
        commodity=ids,
        prev=ids,
        next=ids,
        via_requester_cost=costs,
        temperature_accept=st.booleans(),
    ),
    MoveReply: st.builds(MoveReply, move_id=u64, outcome=st.sampled_from(Reply)),
}
i32 = st.integers(-(2**31), 2**31 - 1)
tensors = st.builds(m.TensorHeader, dtype=ids, shape=small_tuples(st.integers(-(2**63), 2**63 - 1)), nbytes=u64)
STRATEGIES.update({
    m.Hello: st.builds(m.Hello, run_id=ids, role=ids, stage=i32, name=ids, capacity=u32,
                       addrs=small_tuples(ids), tensor_addr=ids, joining=st.booleans(), ready_from=u64,
                       leaving=st.booleans(), leave_after=u64, forgot_you=st.booleans()),
    m.Goodbye: st.builds(m.Goodbye, after_iteration=u64),
    m.PeerList: st.builds(m.PeerList, addrs=small_tuples(ids)),
    m.Revocations: st.builds(m.Revocations, signed=st.binary(min_size=1, max_size=256)),
    m.Forward: st.builds(m.Forward, data_node=ids, seq=u64, iteration=u64, path=small_tuples(ids),
                         tensor=st.none() | tensors),
    m.Backward: st.builds(m.Backward, data_node=ids, seq=u64, iteration=u64, tensor=st.none() | tensors),
    m.Complete: st.builds(m.Complete, data_node=ids, seq=u64, iteration=u64),
    m.IterationDone: st.builds(m.IterationDone, iteration=u64, completed=u32, loss_sum=costs),
    m.BeginAggregation: st.builds(m.BeginAggregation, iteration=u64, microbatches=u32,
                                  groups=small_tuples(st.builds(m.StageMembers, stage=i32,
                                                                peers=small_tuples(ids)))),
    m.CanTake: st.builds(m.CanTake, iteration=u64, stage=i32),
    m.PhaseAck: st.builds(m.PhaseAck, kind=st.sampled_from(m.PhaseKind), iteration=u64),
    m.AllReduceChunk: st.builds(m.AllReduceChunk, key=ids, part=u32, phase=u32, count=costs,
                                tensor=st.none() | tensors),
    m.LinkCost: st.builds(m.LinkCost, cost=costs, reform=st.booleans()),
    m.Ping: st.builds(m.Ping, nonce=u64),
    m.Pong: st.builds(m.Pong, nonce=u64, compute_ms=costs),
    m.LinkProbe: st.builds(m.LinkProbe, nonce=u64),
    m.StageStateRequest: st.builds(m.StageStateRequest, stage=i32, after=u64),
    m.StageState: st.builds(m.StageState, stage=i32, iteration=u64, sha256=ids, tensor=st.none() | tensors),
})
STRATEGIES.update({
    m.MbDeny: st.builds(m.MbDeny, data_node=ids, seq=u64, iteration=u64),
    m.Probe: st.builds(m.Probe, data_node=ids, seq=u64, iteration=u64, path=small_tuples(ids)),
    m.ProbeAck: st.builds(m.ProbeAck, data_node=ids, seq=u64, iteration=u64),
    m.Recover: st.builds(m.Recover, data_node=ids, seq=u64, iteration=u64, path=small_tuples(ids),
                         rest=small_tuples(ids), tensor=st.none() | tensors),
    m.Resume: st.builds(m.Resume, data_node=ids, seq=u64, iteration=u64, path=small_tuples(ids),
                        rest=small_tuples(ids), tensor=st.none() | tensors),
    m.BackwardStuck: st.builds(m.BackwardStuck, data_node=ids, seq=u64, iteration=u64, stage=i32),
    m.Room: st.builds(m.Room, free=u32),
    m.Lend: st.builds(m.Lend, iteration=u64, hop=ids),
    m.Release: st.builds(m.Release, data_node=ids, seq=u64, iteration=u64),
})
STRATEGIES.update({  # recovery.py: the attempt number, the data node's probe answers and repair orders
    m.MbState: st.builds(m.MbState, data_node=ids, seq=u64, iteration=u64, attempt=u32, stage=i32, state=ids),
    m.RepairOrder: st.builds(m.RepairOrder, data_node=ids, seq=u64, iteration=u64, attempt=u32,
                             rest=small_tuples(ids)),
    m.Release: st.builds(m.Release, data_node=ids, seq=u64, iteration=u64, attempt=u32),
    m.Forward: st.builds(m.Forward, data_node=ids, seq=u64, iteration=u64, path=small_tuples(ids),
                         tensor=st.none() | tensors, attempt=u32),
})
STRATEGIES.update({
    m.RequestVote: st.builds(m.RequestVote, term=u64, pre=st.booleans(), sent_at=costs),
    m.Vote: st.builds(m.Vote, term=u64, pre=st.booleans(), granted=st.booleans(), sent_at=costs),
    m.LeaderHeartbeat: st.builds(m.LeaderHeartbeat, term=u64, sent_at=costs, data_nodes=small_tuples(ids)),
    m.HeartbeatAck: st.builds(m.HeartbeatAck, term=u64, sent_at=costs, ok=st.booleans()),
    m.JoinRequest: st.builds(m.JoinRequest, capacity=u32, stage_costs=small_tuples(costs)),
    m.UtilizationQuery: st.builds(m.UtilizationQuery, query_id=u64),
    m.UtilizationReport: st.builds(m.UtilizationReport, query_id=u64, stage=i32, flows=u32, capacity=u32,
                                   serving=st.booleans()),
    m.Assignment: st.builds(m.Assignment, term=u64, node=ids, stage=i32, download_from=ids,
                            start_iteration=u64),
})
STRATEGIES.update({  # pooled formation's homing (flow/pool.py)
    m.HomingStart: st.builds(m.HomingStart, round=u32),
    m.TraceUnit: st.builds(m.TraceUnit, round=u32, origin=ids, path=small_tuples(ids), end=ids),
    m.CostQuery: st.builds(m.CostQuery, round=u32, peers=small_tuples(ids)),
    m.CostReply: st.builds(m.CostReply, round=u32, costs=small_tuples(st.tuples(ids, costs))),
    m.Install: st.builds(m.Install, round=u32, routes=small_tuples(
        st.builds(m.Route, commodity=ids, prev=ids, next=ids, count=u32))),
    m.PoolFrame: st.builds(m.PoolFrame, role=ids, sender_role=ids, frame=st.binary(max_size=64)),
})
kinds = st.sampled_from(SIDE_KINDS)
credits = st.builds(lambda n, d: f"{min(n, d)}/{d}", st.integers(0, 2**70), st.integers(1, 2**70)) | st.just("1")
prices = st.integers(-2**62, 2**62)
STRATEGIES.update({  # scaled formation (flow/scaling.py)
    m.ScalePhase: st.builds(m.ScalePhase, number=u32, eps=u64, credit=credits, alpha=u64, seq=u32, ack=u32),
    m.ScalePush: st.builds(m.ScalePush, tail=kinds, head=kinds, amount=u32, price=prices, phase=u32, eps=u64,
                           credit=credits, cost=u32, seq=u32, ack=u32),
    m.ScaleRefuse: st.builds(m.ScaleRefuse, tail=kinds, head=kinds, amount=u32, price=prices, phase=u32, eps=u64,
                             credit=credits, gone=st.booleans(), cost=u32, seq=u32, ack=u32),
    m.ScaleCredit: st.builds(m.ScaleCredit, credit=credits, seq=u32, ack=u32),
    m.ScaleDone: st.builds(m.ScaleDone, phases=u32, seq=u32, ack=u32),
    m.ScalePrice: st.builds(m.ScalePrice, side=kinds, price=prices),
    m.ScaleAbort: st.builds(m.ScaleAbort, reason=ids, seq=u32, ack=u32),
    m.ScaleNack: st.builds(m.ScaleNack, seqs=small_tuples(u32)),
    m.ScaleProbe: st.builds(m.ScaleProbe, phase=u32, last=u32),
})
STRATEGIES.update({  # start-up: the answer to a refused Hello
    m.Refused: st.builds(m.Refused, code=st.sampled_from(m.RefusalCode), reason=ids),
})
WIRE_TYPES = typing.get_args(messages.Message)
any_message = st.one_of(*STRATEGIES.values())


# ---- the generated code and the schema ------------------------------------


def test_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_notices_stale_generated_code(tmp_path: Path) -> None:
    generated = ("gwtf_node/protocol/gwtf_pb2.py", "gwtf_node/protocol/gwtf_pb2.pyi")
    for rel in ("scripts/gen_protos.py", "protos/gwtf.proto", *generated):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    proto = tmp_path / "protos" / "gwtf.proto"
    proto.write_text(proto.read_text() + "\nmessage Extra {}\n")
    result = subprocess.run(
        [sys.executable, str(tmp_path / "scripts" / "gen_protos.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "gwtf_pb2.py" in result.stderr and "run python scripts/gen_protos.py" in result.stderr


def test_every_wire_message_has_a_strategy_and_an_envelope_field() -> None:
    assert set(STRATEGIES) == set(WIRE_TYPES)
    body = pb.Envelope.DESCRIPTOR.oneofs_by_name["body"]
    assert {f.message_type.name for f in body.fields} == {t.__name__ for t in WIRE_TYPES}


@pytest.mark.parametrize("cls", [*WIRE_TYPES, Label, HopFlow], ids=lambda c: c.__name__)
def test_proto_fields_match_dataclass_fields(cls: type) -> None:
    descriptor = getattr(pb, cls.__name__).DESCRIPTOR
    assert {f.name for f in descriptor.fields} == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("py_enum", list(PROTO_ENUMS), ids=lambda e: e.__name__)
def test_proto_enums_match_python_enums(py_enum: type) -> None:
    proto_enum = PROTO_ENUMS[py_enum]
    prefix = PROTO_PREFIX[py_enum]
    expected = {prefix + "UNSPECIFIED": 0} | {prefix + m.name: m.value for m in py_enum}
    assert dict(proto_enum.items()) == expected


def test_every_enum_value_has_a_comment() -> None:
    lines = (ROOT / "protos" / "gwtf.proto").read_text().splitlines()
    for proto_enum in PROTO_ENUMS.values():
        for name in proto_enum.keys():
            (line,) = [ln for ln in lines if ln.strip().startswith(f"{name} =")]
            assert "//" in line and line.split("//", 1)[1].strip(), f"{name} has no comment"


# ---- round trips ----------------------------------------------------------


@given(sender=ids, msg=any_message)
def test_every_message_round_trips(sender: str, msg: messages.Message) -> None:
    data = encode(sender, msg)
    assert len(data) <= MAX_FRAME_BYTES
    got_sender, got = decode(data)
    assert got_sender == sender
    assert got == msg
    assert type(got) is type(msg)


@pytest.mark.parametrize("cls", WIRE_TYPES, ids=lambda c: c.__name__)
def test_each_type_round_trips(cls: type) -> None:
    @given(STRATEGIES[cls])
    def check(msg: messages.Message) -> None:
        assert decode(encode("peer", msg)) == ("peer", msg)

    check()


def test_infinite_costs_and_enums_survive() -> None:
    msg = CostAnnounce(
        labels=(
            Label("d0", Side.IN, math.inf, ("r1:in", "d0:out")),
            Label("d1", Side.OUT, -math.inf, ()),
        )
    )
    _, got = decode(encode("r0", msg))
    assert got == msg
    assert isinstance(got.labels[0].side, Side)
    assert got.labels[0].path == ("r1:in", "d0:out")


def test_absent_current_label_stays_absent() -> None:
    _, got = decode(encode("r0", FlowReply(1, "d0", Reply.NO_CAPACITY)))
    assert got.current is None


# ---- malformed frames -----------------------------------------------------


def _envelope(**kwargs: typing.Any) -> bytes:
    return pb.Envelope(**{"version": codec.PROTOCOL_VERSION, "sender": "p", **kwargs}).SerializeToString()


@given(st.binary(max_size=256))
def test_garbage_never_raises_anything_but_decode_error(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError:
        pass


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\xff",  # truncated varint tag
        b"\x0a\x05ab",  # sender says 5 bytes, 2 follow
        b"\x12\x02\xc3\x28",  # sender field with invalid UTF-8
    ],
    ids=["truncated-tag", "truncated-length", "bad-utf8"],
)
def test_malformed_bytes(data: bytes) -> None:
    with pytest.raises(DecodeError, match="not a gwtf.v1.Envelope"):
        decode(data)


def test_empty_frame_and_empty_envelope() -> None:
    with pytest.raises(DecodeError):
        decode(b"")
    with pytest.raises(DecodeError, match="no message body"):
        decode(_envelope())


def test_unknown_body_from_a_newer_peer() -> None:
    # field 99 is not in our oneof: it parses as an unknown field, leaving the body empty
    unknown = b"\x9a\x06\x00"  # tag (99 << 3 | 2), length 0
    with pytest.raises(DecodeError, match="no message body"):
        decode(_envelope() + unknown)


@pytest.mark.parametrize("version", [1, 3])
def test_wrong_version(version: int) -> None:
    data = pb.Envelope(version=version, sender="p", withdraw=pb.Withdraw(req_id=1, commodity="d0")).SerializeToString()
    with pytest.raises(DecodeError, match=f"version {version}, this node speaks version 2"):
        decode(data)


@pytest.mark.parametrize(
    "kwargs, where",
    [
        ({"move_reply": pb.MoveReply(move_id=1, outcome=42)}, "MoveReply.outcome is 42"),
        ({"move_reply": pb.MoveReply(move_id=1)}, "MoveReply.outcome is 0"),
        ({"deny": pb.Deny(commodity="d0", reason=9)}, "Deny.reason is 9"),
        ({"flow_reply": pb.FlowReply(outcome=1, current=pb.Label(side=3))}, "FlowReply.current.side is 3"),
        ({"cost_announce": pb.CostAnnounce(labels=[pb.Label(side=7)])}, r"labels\[0\].side is 7"),
    ],
)
def test_unknown_enum_values(kwargs: dict, where: str) -> None:
    with pytest.raises(DecodeError, match=where):
        decode(_envelope(**kwargs))


def test_nan_cost_is_rejected() -> None:
    data = _envelope(request_flow=pb.RequestFlow(req_id=1, commodity="d0", expected_cost=math.nan))
    with pytest.raises(DecodeError, match="NaN"):
        decode(data)


def test_oversized_frame_is_rejected_before_parsing() -> None:
    with pytest.raises(DecodeError, match=f"exceeds the {MAX_FRAME_BYTES}-byte limit"):
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    # a well-formed envelope over the limit is refused too
    big = _envelope(withdraw=pb.Withdraw(commodity="x" * MAX_FRAME_BYTES))
    with pytest.raises(DecodeError, match="exceeds"):
        decode(big)


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    probe = MAX_FRAME_BYTES - 64
    padding = probe + MAX_FRAME_BYTES - len(encode("p", Withdraw(1, "x" * probe)))  # varint sizes do not change
    msg = Withdraw(1, "x" * padding)
    data = encode("p", msg)
    assert len(data) == MAX_FRAME_BYTES
    assert decode(data) == ("p", msg)


def test_encode_refuses_what_peers_would_reject() -> None:
    with pytest.raises(EncodeError, match="frame limit"):
        encode("p", Withdraw(1, "x" * MAX_FRAME_BYTES))
    with pytest.raises(EncodeError, match="cannot encode a Label"):
        encode("p", Label("d0", Side.IN, 1.0, ()))  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        encode("p", QueryFlows(query_id=-1))

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Side(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIDE_UNSPECIFIED: _ClassVar[Side]
    SIDE_IN: _ClassVar[Side]
    SIDE_OUT: _ClassVar[Side]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_APPROVED: _ClassVar[Outcome]
    OUTCOME_COST_CHANGED: _ClassVar[Outcome]
    OUTCOME_NO_CAPACITY: _ClassVar[Outcome]
    OUTCOME_NO_SUCH_FLOW: _ClassVar[Outcome]
    OUTCOME_NOT_IMPROVING: _ClassVar[Outcome]
    OUTCOME_BUSY: _ClassVar[Outcome]
    OUTCOME_NOT_LINKED: _ClassVar[Outcome]

class DenyReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DENY_REASON_UNSPECIFIED: _ClassVar[DenyReason]
    DENY_REASON_NO_ROUTE: _ClassVar[DenyReason]
    DENY_REASON_DISPLACED: _ClassVar[DenyReason]

class PhaseKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_KIND_UNSPECIFIED: _ClassVar[PhaseKind]
    PHASE_KIND_DONE: _ClassVar[PhaseKind]
    PHASE_KIND_BEGIN: _ClassVar[PhaseKind]
    PHASE_KIND_CAN_TAKE: _ClassVar[PhaseKind]
    PHASE_KIND_GROUPS: _ClassVar[PhaseKind]

class RefusalCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_CODE_UNSPECIFIED: _ClassVar[RefusalCode]
    REFUSAL_CODE_OTHER_RUN: _ClassVar[RefusalCode]
    REFUSAL_CODE_NO_SUCH_ROLE: _ClassVar[RefusalCode]
    REFUSAL_CODE_NO_SUCH_STAGE: _ClassVar[RefusalCode]
    REFUSAL_CODE_INVALID: _ClassVar[RefusalCode]
    REFUSAL_CODE_NOT_ADMITTED: _ClassVar[RefusalCode]
    REFUSAL_CODE_BAD_CERTIFICATE: _ClassVar[RefusalCode]
    REFUSAL_CODE_CERTIFICATE_EXPIRED: _ClassVar[RefusalCode]
    REFUSAL_CODE_REVOKED: _ClassVar[RefusalCode]
    REFUSAL_CODE_WRONG_ROLE: _ClassVar[RefusalCode]
    REFUSAL_CODE_NOT_LEADER: _ClassVar[RefusalCode]
    REFUSAL_CODE_NOT_NEIGHBOUR: _ClassVar[RefusalCode]
    REFUSAL_CODE_UNKNOWN_PEER: _ClassVar[RefusalCode]
    REFUSAL_CODE_BANNED: _ClassVar[RefusalCode]
    REFUSAL_CODE_BAD_RECORD: _ClassVar[RefusalCode]
SIDE_UNSPECIFIED: Side
SIDE_IN: Side
SIDE_OUT: Side
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_APPROVED: Outcome
OUTCOME_COST_CHANGED: Outcome
OUTCOME_NO_CAPACITY: Outcome
OUTCOME_NO_SUCH_FLOW: Outcome
OUTCOME_NOT_IMPROVING: Outcome
OUTCOME_BUSY: Outcome
OUTCOME_NOT_LINKED: Outcome
DENY_REASON_UNSPECIFIED: DenyReason
DENY_REASON_NO_ROUTE: DenyReason
DENY_REASON_DISPLACED: DenyReason
PHASE_KIND_UNSPECIFIED: PhaseKind
PHASE_KIND_DONE: PhaseKind
PHASE_KIND_BEGIN: PhaseKind
PHASE_KIND_CAN_TAKE: PhaseKind
PHASE_KIND_GROUPS: PhaseKind
REFUSAL_CODE_UNSPECIFIED: RefusalCode
REFUSAL_CODE_OTHER_RUN: RefusalCode
REFUSAL_CODE_NO_SUCH_ROLE: RefusalCode
REFUSAL_CODE_NO_SUCH_STAGE: RefusalCode
REFUSAL_CODE_INVALID: RefusalCode
REFUSAL_CODE_NOT_ADMITTED: RefusalCode
REFUSAL_CODE_BAD_CERTIFICATE: RefusalCode
REFUSAL_CODE_CERTIFICATE_EXPIRED: RefusalCode
REFUSAL_CODE_REVOKED: RefusalCode
REFUSAL_CODE_WRONG_ROLE: RefusalCode
REFUSAL_CODE_NOT_LEADER: RefusalCode
REFUSAL_CODE_NOT_NEIGHBOUR: RefusalCode
REFUSAL_CODE_UNKNOWN_PEER: RefusalCode
REFUSAL_CODE_BANNED: RefusalCode
REFUSAL_CODE_BAD_RECORD: RefusalCode

class Label(_message.Message):
    __slots__ = ("commodity", "side", "cost", "path", "epoch", "formation")
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORMATION_FIELD_NUMBER: _ClassVar[int]
    commodity: str
    side: Side
    cost: float
    path: _containers.RepeatedScalarFieldContainer[str]
    epoch: int
    formation: bool
    def __init__(self, commodity: _Optional[str] = ..., side: _Optional[_Union[Side, str]] = ..., cost: _Optional[float] = ..., path: _Optional[_Iterable[str]] = ..., epoch: _Optional[int] = ..., formation: bool = ...) -> None: ...

class CostAnnounce(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class RequestFlow(_message.Message):
    __slots__ = ("req_id", "commodity", "expected_cost", "forced")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COST_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    req_id: int
    commodity: str
    expected_cost: float
    forced: bool
    def __init__(self, req_id: _Optional[int] = ..., commodity: _Optional[str] = ..., expected_cost: _Optional[float] = ..., forced: bool = ...) -> None: ...

class FlowReply(_message.Message):
    __slots__ = ("req_id", "commodity", "outcome", "current")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    req_id: int
    commodity: str
    outcome: Outcome
    current: Label
    def __init__(self, req_id: _Optional[int] = ..., commodity: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., current: _Optional[_Union[Label, _Mapping]] = ...) -> None: ...

class Deny(_message.Message):
    __slots__ = ("commodity", "reason")
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    commodity: str
    reason: DenyReason
    def __init__(self, commodity: _Optional[str] = ..., reason: _Optional[_Union[DenyReason, str]] = ...) -> None: ...

class Withdraw(_message.Message):
    __slots__ = ("req_id", "commodity")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    req_id: int
    commodity: str
    def __init__(self, req_id: _Optional[int] = ..., commodity: _Optional[str] = ...) -> None: ...

class Reroute(_message.Message):
    __slots__ = ("commodity", "to")
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    commodity: str
    to: str
    def __init__(self, commodity: _Optional[str] = ..., to: _Optional[str] = ...) -> None: ...

class BidFeed(_message.Message):
    __slots__ = ("data_node", "relay")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    relay: str
    def __init__(self, data_node: _Optional[str] = ..., relay: _Optional[str] = ...) -> None: ...

class LaunchBid(_message.Message):
    __slots__ = ("data_node", "seq", "cost", "feeds", "full")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    cost: float
    feeds: _containers.RepeatedCompositeFieldContainer[BidFeed]
    full: bool
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., cost: _Optional[float] = ..., feeds: _Optional[_Iterable[_Union[BidFeed, _Mapping]]] = ..., full: bool = ...) -> None: ...

class Relabel(_message.Message):
    __slots__ = ("from_commodity", "to_commodity")
    FROM_COMMODITY_FIELD_NUMBER: _ClassVar[int]
    TO_COMMODITY_FIELD_NUMBER: _ClassVar[int]
    from_commodity: str
    to_commodity: str
    def __init__(self, from_commodity: _Optional[str] = ..., to_commodity: _Optional[str] = ...) -> None: ...

class RelabelCost(_message.Message):
    __slots__ = ("from_commodity", "to_commodity", "cost", "more")
    FROM_COMMODITY_FIELD_NUMBER: _ClassVar[int]
    TO_COMMODITY_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    from_commodity: str
    to_commodity: str
    cost: float
    more: _containers.RepeatedCompositeFieldContainer[RelabelPair]
    def __init__(self, from_commodity: _Optional[str] = ..., to_commodity: _Optional[str] = ..., cost: _Optional[float] = ..., more: _Optional[_Iterable[_Union[RelabelPair, _Mapping]]] = ...) -> None: ...

class RelabelPair(_message.Message):
    __slots__ = ("from_commodity", "to_commodity", "cost")
    FROM_COMMODITY_FIELD_NUMBER: _ClassVar[int]
    TO_COMMODITY_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    from_commodity: str
    to_commodity: str
    cost: float
    def __init__(self, from_commodity: _Optional[str] = ..., to_commodity: _Optional[str] = ..., cost: _Optional[float] = ...) -> None: ...

class LabelLimit(_message.Message):
    __slots__ = ("commodity", "cost")
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    commodity: str
    cost: float
    def __init__(self, commodity: _Optional[str] = ..., cost: _Optional[float] = ...) -> None: ...

class HopFlow(_message.Message):
    __slots__ = ("commodity", "peer", "count", "cost")
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    commodity: str
    peer: str
    count: int
    cost: float
    def __init__(self, commodity: _Optional[str] = ..., peer: _Optional[str] = ..., count: _Optional[int] = ..., cost: _Optional[float] = ...) -> None: ...

class QueryFlows(_message.Message):
    __slots__ = ("query_id",)
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    query_id: int
    def __init__(self, query_id: _Optional[int] = ...) -> None: ...

class PeerCost(_message.Message):
    __slots__ = ("peer", "cost")
    PEER_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    peer: str
    cost: float
    def __init__(self, peer: _Optional[str] = ..., cost: _Optional[float] = ...) -> None: ...

class FlowReport(_message.Message):
    __slots__ = ("query_id", "capacity", "used", "inflows", "outflows", "next_costs")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    INFLOWS_FIELD_NUMBER: _ClassVar[int]
    OUTFLOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_COSTS_FIELD_NUMBER: _ClassVar[int]
    query_id: int
    capacity: int
    used: int
    inflows: _containers.RepeatedCompositeFieldContainer[HopFlow]
    outflows: _containers.RepeatedCompositeFieldContainer[HopFlow]
    next_costs: _containers.RepeatedCompositeFieldContainer[PeerCost]
    def __init__(self, query_id: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., inflows: _Optional[_Iterable[_Union[HopFlow, _Mapping]]] = ..., outflows: _Optional[_Iterable[_Union[HopFlow, _Mapping]]] = ..., next_costs: _Optional[_Iterable[_Union[PeerCost, _Mapping]]] = ...) -> None: ...

class RequestChange(_message.Message):
    __slots__ = ("move_id", "commodity", "requester_next", "receiver_next", "requester_delta", "temperature_accept")
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_NEXT_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_NEXT_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_DELTA_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_ACCEPT_FIELD_NUMBER: _ClassVar[int]
    move_id: int
    commodity: str
    requester_next: str
    receiver_next: str
    requester_delta: float
    temperature_accept: bool
    def __init__(self, move_id: _Optional[int] = ..., commodity: _Optional[str] = ..., requester_next: _Optional[str] = ..., receiver_next: _Optional[str] = ..., requester_delta: _Optional[float] = ..., temperature_accept: bool = ...) -> None: ...

class RequestRedirect(_message.Message):
    __slots__ = ("move_id", "commodity", "prev", "next", "via_requester_cost", "temperature_accept")
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    PREV_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    VIA_REQUESTER_COST_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_ACCEPT_FIELD_NUMBER: _ClassVar[int]
    move_id: int
    commodity: str
    prev: str
    next: str
    via_requester_cost: float
    temperature_accept: bool
    def __init__(self, move_id: _Optional[int] = ..., commodity: _Optional[str] = ..., prev: _Optional[str] = ..., next: _Optional[str] = ..., via_requester_cost: _Optional[float] = ..., temperature_accept: bool = ...) -> None: ...

class MoveReply(_message.Message):
    __slots__ = ("move_id", "outcome")
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    move_id: int
    outcome: Outcome
    def __init__(self, move_id: _Optional[int] = ..., outcome: _Optional[_Union[Outcome, str]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("run_id", "role", "stage", "name", "capacity", "addrs", "tensor_addr", "joining", "ready_from", "leaving", "leave_after", "steps", "incarnation", "certificate", "forgot_you")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ADDR_FIELD_NUMBER: _ClassVar[int]
    JOINING_FIELD_NUMBER: _ClassVar[int]
    READY_FROM_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    LEAVE_AFTER_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    FORGOT_YOU_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    role: str
    stage: int
    name: str
    capacity: int
    addrs: _containers.RepeatedScalarFieldContainer[str]
    tensor_addr: str
    joining: bool
    ready_from: int
    leaving: bool
    leave_after: int
    steps: int
    incarnation: int
    certificate: bytes
    forgot_you: bool
    def __init__(self, run_id: _Optional[str] = ..., role: _Optional[str] = ..., stage: _Optional[int] = ..., name: _Optional[str] = ..., capacity: _Optional[int] = ..., addrs: _Optional[_Iterable[str]] = ..., tensor_addr: _Optional[str] = ..., joining: bool = ..., ready_from: _Optional[int] = ..., leaving: bool = ..., leave_after: _Optional[int] = ..., steps: _Optional[int] = ..., incarnation: _Optional[int] = ..., certificate: _Optional[bytes] = ..., forgot_you: bool = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("after_iteration",)
    AFTER_ITERATION_FIELD_NUMBER: _ClassVar[int]
    after_iteration: int
    def __init__(self, after_iteration: _Optional[int] = ...) -> None: ...

class PeerList(_message.Message):
    __slots__ = ("addrs",)
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class Revocations(_message.Message):
    __slots__ = ("signed",)
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    signed: bytes
    def __init__(self, signed: _Optional[bytes] = ...) -> None: ...

class Forward(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "path", "tensor", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    path: _containers.RepeatedScalarFieldContainer[str]
    tensor: TensorHeader
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., path: _Optional[_Iterable[str]] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Backward(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "tensor", "attempt", "chain")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    tensor: TensorHeader
    attempt: int
    chain: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ..., attempt: _Optional[int] = ..., chain: _Optional[_Iterable[str]] = ...) -> None: ...

class Complete(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class IterationDone(_message.Message):
    __slots__ = ("iteration", "completed", "loss_sum", "deferred", "lost", "completed_seqs", "completed_attempts", "completed_holders")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_SEQS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    completed: int
    loss_sum: float
    deferred: int
    lost: int
    completed_seqs: _containers.RepeatedScalarFieldContainer[int]
    completed_attempts: _containers.RepeatedScalarFieldContainer[int]
    completed_holders: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, iteration: _Optional[int] = ..., completed: _Optional[int] = ..., loss_sum: _Optional[float] = ..., deferred: _Optional[int] = ..., lost: _Optional[int] = ..., completed_seqs: _Optional[_Iterable[int]] = ..., completed_attempts: _Optional[_Iterable[int]] = ..., completed_holders: _Optional[_Iterable[int]] = ...) -> None: ...

class BeginAggregation(_message.Message):
    __slots__ = ("iteration", "microbatches", "groups", "term", "completed")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    microbatches: int
    groups: _containers.RepeatedCompositeFieldContainer[StageMembers]
    term: int
    completed: _containers.RepeatedCompositeFieldContainer[CompletedSeqs]
    def __init__(self, iteration: _Optional[int] = ..., microbatches: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[StageMembers, _Mapping]]] = ..., term: _Optional[int] = ..., completed: _Optional[_Iterable[_Union[CompletedSeqs, _Mapping]]] = ...) -> None: ...

class CompletedSeqs(_message.Message):
    __slots__ = ("data_node", "seqs", "attempts", "holders")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seqs: _containers.RepeatedScalarFieldContainer[int]
    attempts: _containers.RepeatedScalarFieldContainer[int]
    holders: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, data_node: _Optional[str] = ..., seqs: _Optional[_Iterable[int]] = ..., attempts: _Optional[_Iterable[int]] = ..., holders: _Optional[_Iterable[int]] = ...) -> None: ...

class StageMembers(_message.Message):
    __slots__ = ("stage", "peers", "digest")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    stage: int
    peers: _containers.RepeatedScalarFieldContainer[str]
    digest: bytes
    def __init__(self, stage: _Optional[int] = ..., peers: _Optional[_Iterable[str]] = ..., digest: _Optional[bytes] = ...) -> None: ...

class CanTake(_message.Message):
    __slots__ = ("iteration", "stage")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    stage: int
    def __init__(self, iteration: _Optional[int] = ..., stage: _Optional[int] = ...) -> None: ...

class PhaseAck(_message.Message):
    __slots__ = ("kind", "iteration")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    kind: PhaseKind
    iteration: int
    def __init__(self, kind: _Optional[_Union[PhaseKind, str]] = ..., iteration: _Optional[int] = ...) -> None: ...

class AllReduceChunk(_message.Message):
    __slots__ = ("key", "part", "phase", "count", "tensor")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    key: str
    part: int
    phase: int
    count: float
    tensor: TensorHeader
    def __init__(self, key: _Optional[str] = ..., part: _Optional[int] = ..., phase: _Optional[int] = ..., count: _Optional[float] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ...) -> None: ...

class LinkCost(_message.Message):
    __slots__ = ("cost", "reform")
    COST_FIELD_NUMBER: _ClassVar[int]
    REFORM_FIELD_NUMBER: _ClassVar[int]
    cost: float
    reform: bool
    def __init__(self, cost: _Optional[float] = ..., reform: bool = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("nonce", "compute_ms", "busy_ms", "incarnation")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    BUSY_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    compute_ms: float
    busy_ms: float
    incarnation: int
    def __init__(self, nonce: _Optional[int] = ..., compute_ms: _Optional[float] = ..., busy_ms: _Optional[float] = ..., incarnation: _Optional[int] = ...) -> None: ...

class LinkProbe(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class StageStateRequest(_message.Message):
    __slots__ = ("stage", "after", "hash_only", "offset", "sha256")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    HASH_ONLY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    stage: int
    after: int
    hash_only: bool
    offset: int
    sha256: str
    def __init__(self, stage: _Optional[int] = ..., after: _Optional[int] = ..., hash_only: bool = ..., offset: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class StageState(_message.Message):
    __slots__ = ("stage", "iteration", "sha256", "tensor", "params_sha256", "run_steps", "stage_empty", "rounds", "offset", "total")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    PARAMS_SHA256_FIELD_NUMBER: _ClassVar[int]
    RUN_STEPS_FIELD_NUMBER: _ClassVar[int]
    STAGE_EMPTY_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    stage: int
    iteration: int
    sha256: str
    tensor: TensorHeader
    params_sha256: str
    run_steps: int
    stage_empty: bool
    rounds: _containers.RepeatedCompositeFieldContainer[RoundRecord]
    offset: int
    total: int
    def __init__(self, stage: _Optional[int] = ..., iteration: _Optional[int] = ..., sha256: _Optional[str] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ..., params_sha256: _Optional[str] = ..., run_steps: _Optional[int] = ..., stage_empty: bool = ..., rounds: _Optional[_Iterable[_Union[RoundRecord, _Mapping]]] = ..., offset: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class RoundRecord(_message.Message):
    __slots__ = ("steps", "count", "members")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    count: float
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, steps: _Optional[int] = ..., count: _Optional[float] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class MbDeny(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class Probe(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "path", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    path: _containers.RepeatedScalarFieldContainer[str]
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., path: _Optional[_Iterable[str]] = ..., attempt: _Optional[int] = ...) -> None: ...

class ProbeAck(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class Recover(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "path", "rest", "tensor", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REST_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    path: _containers.RepeatedScalarFieldContainer[str]
    rest: _containers.RepeatedScalarFieldContainer[str]
    tensor: TensorHeader
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., path: _Optional[_Iterable[str]] = ..., rest: _Optional[_Iterable[str]] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "path", "rest", "tensor", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REST_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    path: _containers.RepeatedScalarFieldContainer[str]
    rest: _containers.RepeatedScalarFieldContainer[str]
    tensor: TensorHeader
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., path: _Optional[_Iterable[str]] = ..., rest: _Optional[_Iterable[str]] = ..., tensor: _Optional[_Union[TensorHeader, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class BackwardStuck(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "stage", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    stage: int
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., stage: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class Room(_message.Message):
    __slots__ = ("free",)
    FREE_FIELD_NUMBER: _ClassVar[int]
    free: int
    def __init__(self, free: _Optional[int] = ...) -> None: ...

class Lend(_message.Message):
    __slots__ = ("iteration", "hop")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    HOP_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    hop: str
    def __init__(self, iteration: _Optional[int] = ..., hop: _Optional[str] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "attempt")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    attempt: int
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class MbState(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "attempt", "stage", "state")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    attempt: int
    stage: int
    state: str
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ..., stage: _Optional[int] = ..., state: _Optional[str] = ...) -> None: ...

class RepairOrder(_message.Message):
    __slots__ = ("data_node", "seq", "iteration", "attempt", "rest")
    DATA_NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REST_FIELD_NUMBER: _ClassVar[int]
    data_node: str
    seq: int
    iteration: int
    attempt: int
    rest: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, data_node: _Optional[str] = ..., seq: _Optional[int] = ..., iteration: _Optional[int] = ..., attempt: _Optional[int] = ..., rest: _Optional[_Iterable[str]] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("dtype", "shape", "nbytes", "sparse_kept")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SPARSE_KEPT_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    sparse_kept: int
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., sparse_kept: _Optional[int] = ...) -> None: ...

class RequestVote(_message.Message):
    __slots__ = ("term", "pre", "sent_at", "cfg_term", "cfg_version", "lease_s")
    TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    CFG_TERM_FIELD_NUMBER: _ClassVar[int]
    CFG_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    term: int
    pre: bool
    sent_at: float
    cfg_term: int
    cfg_version: int
    lease_s: float
    def __init__(self, term: _Optional[int] = ..., pre: bool = ..., sent_at: _Optional[float] = ..., cfg_term: _Optional[int] = ..., cfg_version: _Optional[int] = ..., lease_s: _Optional[float] = ...) -> None: ...

class Vote(_message.Message):
    __slots__ = ("term", "pre", "granted", "sent_at")
    TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    term: int
    pre: bool
    granted: bool
    sent_at: float
    def __init__(self, term: _Optional[int] = ..., pre: bool = ..., granted: bool = ..., sent_at: _Optional[float] = ...) -> None: ...

class LeaderHeartbeat(_message.Message):
    __slots__ = ("term", "sent_at", "data_nodes", "witnesses", "cfg_version", "lease_s")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    DATA_NODES_FIELD_NUMBER: _ClassVar[int]
    WITNESSES_FIELD_NUMBER: _ClassVar[int]
    CFG_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    term: int
    sent_at: float
    data_nodes: _containers.RepeatedScalarFieldContainer[str]
    witnesses: _containers.RepeatedScalarFieldContainer[str]
    cfg_version: int
    lease_s: float
    def __init__(self, term: _Optional[int] = ..., sent_at: _Optional[float] = ..., data_nodes: _Optional[_Iterable[str]] = ..., witnesses: _Optional[_Iterable[str]] = ..., cfg_version: _Optional[int] = ..., lease_s: _Optional[float] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("term", "sent_at", "ok")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    term: int
    sent_at: float
    ok: bool
    def __init__(self, term: _Optional[int] = ..., sent_at: _Optional[float] = ..., ok: bool = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("capacity", "stage_costs", "link_costs")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STAGE_COSTS_FIELD_NUMBER: _ClassVar[int]
    LINK_COSTS_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    stage_costs: _containers.RepeatedScalarFieldContainer[float]
    link_costs: _containers.RepeatedCompositeFieldContainer[PeerCost]
    def __init__(self, capacity: _Optional[int] = ..., stage_costs: _Optional[_Iterable[float]] = ..., link_costs: _Optional[_Iterable[_Union[PeerCost, _Mapping]]] = ...) -> None: ...

class UtilizationQuery(_message.Message):
    __slots__ = ("query_id", "term")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    query_id: int
    term: int
    def __init__(self, query_id: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class UtilizationReport(_message.Message):
    __slots__ = ("query_id", "stage", "flows", "capacity", "serving", "link_costs")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    LINK_COSTS_FIELD_NUMBER: _ClassVar[int]
    query_id: int
    stage: int
    flows: int
    capacity: int
    serving: bool
    link_costs: _containers.RepeatedCompositeFieldContainer[PeerCost]
    def __init__(self, query_id: _Optional[int] = ..., stage: _Optional[int] = ..., flows: _Optional[int] = ..., capacity: _Optional[int] = ..., serving: bool = ..., link_costs: _Optional[_Iterable[_Union[PeerCost, _Mapping]]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("term", "node", "stage", "download_from", "start_iteration")
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_FROM_FIELD_NUMBER: _ClassVar[int]
    START_ITERATION_FIELD_NUMBER: _ClassVar[int]
    term: int
    node: str
    stage: int
    download_from: str
    start_iteration: int
    def __init__(self, term: _Optional[int] = ..., node: _Optional[str] = ..., stage: _Optional[int] = ..., download_from: _Optional[str] = ..., start_iteration: _Optional[int] = ...) -> None: ...

class HomingStart(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class TraceUnit(_message.Message):
    __slots__ = ("round", "origin", "path", "end")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    round: int
    origin: str
    path: _containers.RepeatedScalarFieldContainer[str]
    end: str
    def __init__(self, round: _Optional[int] = ..., origin: _Optional[str] = ..., path: _Optional[_Iterable[str]] = ..., end: _Optional[str] = ...) -> None: ...

class CostQuery(_message.Message):
    __slots__ = ("round", "peers")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    round: int
    peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., peers: _Optional[_Iterable[str]] = ...) -> None: ...

class CostReply(_message.Message):
    __slots__ = ("round", "costs")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    COSTS_FIELD_NUMBER: _ClassVar[int]
    round: int
    costs: _containers.RepeatedCompositeFieldContainer[PeerCost]
    def __init__(self, round: _Optional[int] = ..., costs: _Optional[_Iterable[_Union[PeerCost, _Mapping]]] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("commodity", "prev", "next", "count")
    COMMODITY_FIELD_NUMBER: _ClassVar[int]
    PREV_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    commodity: str
    prev: str
    next: str
    count: int
    def __init__(self, commodity: _Optional[str] = ..., prev: _Optional[str] = ..., next: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class Install(_message.Message):
    __slots__ = ("round", "routes")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    round: int
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    def __init__(self, round: _Optional[int] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ...) -> None: ...

class PoolFrame(_message.Message):
    __slots__ = ("role", "sender_role", "frame")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SENDER_ROLE_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    sender_role: str
    frame: bytes
    def __init__(self, role: _Optional[str] = ..., sender_role: _Optional[str] = ..., frame: _Optional[bytes] = ...) -> None: ...

class ScalePhase(_message.Message):
    __slots__ = ("number", "eps", "credit", "alpha", "seq", "ack")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    number: int
    eps: int
    credit: str
    alpha: int
    seq: int
    ack: int
    def __init__(self, number: _Optional[int] = ..., eps: _Optional[int] = ..., credit: _Optional[str] = ..., alpha: _Optional[int] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ...) -> None: ...

class ScalePush(_message.Message):
    __slots__ = ("tail", "head", "amount", "price", "phase", "eps", "credit", "cost", "seq", "ack")
    TAIL_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    tail: str
    head: str
    amount: int
    price: int
    phase: int
    eps: int
    credit: str
    cost: int
    seq: int
    ack: int
    def __init__(self, tail: _Optional[str] = ..., head: _Optional[str] = ..., amount: _Optional[int] = ..., price: _Optional[int] = ..., phase: _Optional[int] = ..., eps: _Optional[int] = ..., credit: _Optional[str] = ..., cost: _Optional[int] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ...) -> None: ...

class ScaleRefuse(_message.Message):
    __slots__ = ("tail", "head", "amount", "price", "phase", "eps", "credit", "gone", "cost", "seq", "ack")
    TAIL_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    tail: str
    head: str
    amount: int
    price: int
    phase: int
    eps: int
    credit: str
    gone: bool
    cost: int
    seq: int
    ack: int
    def __init__(self, tail: _Optional[str] = ..., head: _Optional[str] = ..., amount: _Optional[int] = ..., price: _Optional[int] = ..., phase: _Optional[int] = ..., eps: _Optional[int] = ..., credit: _Optional[str] = ..., gone: bool = ..., cost: _Optional[int] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ...) -> None: ...

class ScaleCredit(_message.Message):
    __slots__ = ("credit", "seq", "ack")
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    credit: str
    seq: int
    ack: int
    def __init__(self, credit: _Optional[str] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ...) -> None: ...

class ScaleDone(_message.Message):
    __slots__ = ("phases", "seq", "ack")
    PHASES_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    phases: int
    seq: int
    ack: int
    def __init__(self, phases: _Optional[int] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ...) -> None: ...

class ScalePrice(_message.Message):
    __slots__ = ("side", "price")
    SIDE_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    side: str
    price: int
    def __init__(self, side: _Optional[str] = ..., price: _Optional[int] = ...) -> None: ...

class ScaleAbort(_message.Message):
    __slots__ = ("reason", "seq", "ack")
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    reason: str
    seq: int
    ack: int
    def __init__(self, reason: _Optional[str] = ..., seq: _Optional[int] = ..., ack: _Optional[int] = ...) -> None: ...

class ScaleNack(_message.Message):
    __slots__ = ("seqs", "ack")
    SEQS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    ack: int
    def __init__(self, seqs: _Optional[_Iterable[int]] = ..., ack: _Optional[int] = ...) -> None: ...

class ScaleProbe(_message.Message):
    __slots__ = ("phase", "last")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    phase: int
    last: int
    def __init__(self, phase: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("version", "sender", "cost_announce", "request_flow", "flow_reply", "deny", "withdraw", "query_flows", "flow_report", "request_change", "request_redirect", "move_reply", "reroute", "launch_bid", "relabel", "relabel_cost", "label_limit", "hello", "peer_list", "forward", "backward", "complete", "iteration_done", "begin_aggregation", "can_take", "phase_ack", "all_reduce_chunk", "ping", "pong", "stage_state_request", "stage_state", "goodbye", "revocations", "mb_deny", "probe", "probe_ack", "recover", "resume", "backward_stuck", "room", "release", "mb_state", "repair_order", "lend", "link_cost", "link_probe", "request_vote", "vote", "leader_heartbeat", "heartbeat_ack", "join_request", "utilization_query", "utilization_report", "assignment", "homing_start", "trace_unit", "cost_query", "cost_reply", "install", "pool_frame", "scale_phase", "scale_push", "scale_refuse", "scale_credit", "scale_done", "scale_price", "scale_abort", "scale_nack", "scale_probe", "refused")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    COST_ANNOUNCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FLOW_FIELD_NUMBER: _ClassVar[int]
    FLOW_REPLY_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    QUERY_FLOWS_FIELD_NUMBER: _ClassVar[int]
    FLOW_REPORT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CHANGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_REDIRECT_FIELD_NUMBER: _ClassVar[int]
    MOVE_REPLY_FIELD_NUMBER: _ClassVar[int]
    REROUTE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_BID_FIELD_NUMBER: _ClassVar[int]
    RELABEL_FIELD_NUMBER: _ClassVar[int]
    RELABEL_COST_FIELD_NUMBER: _ClassVar[int]
    LABEL_LIMIT_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    PEER_LIST_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_DONE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    CAN_TAKE_FIELD_NUMBER: _ClassVar[int]
    PHASE_ACK_FIELD_NUMBER: _ClassVar[int]
    ALL_REDUCE_CHUNK_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    STAGE_STATE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STAGE_STATE_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    MB_DENY_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    PROBE_ACK_FIELD_NUMBER: _ClassVar[int]
    RECOVER_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_STUCK_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    MB_STATE_FIELD_NUMBER: _ClassVar[int]
    REPAIR_ORDER_FIELD_NUMBER: _ClassVar[int]
    LEND_FIELD_NUMBER: _ClassVar[int]
    LINK_COST_FIELD_NUMBER: _ClassVar[int]
    LINK_PROBE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_VOTE_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    LEADER_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    JOIN_REQUEST_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_QUERY_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_REPORT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    HOMING_START_FIELD_NUMBER: _ClassVar[int]
    TRACE_UNIT_FIELD_NUMBER: _ClassVar[int]
    COST_QUERY_FIELD_NUMBER: _ClassVar[int]
    COST_REPLY_FIELD_NUMBER: _ClassVar[int]
    INSTALL_FIELD_NUMBER: _ClassVar[int]
    POOL_FRAME_FIELD_NUMBER: _ClassVar[int]
    SCALE_PHASE_FIELD_NUMBER: _ClassVar[int]
    SCALE_PUSH_FIELD_NUMBER: _ClassVar[int]
    SCALE_REFUSE_FIELD_NUMBER: _ClassVar[int]
    SCALE_CREDIT_FIELD_NUMBER: _ClassVar[int]
    SCALE_DONE_FIELD_NUMBER: _ClassVar[int]
    SCALE_PRICE_FIELD_NUMBER: _ClassVar[int]
    SCALE_ABORT_FIELD_NUMBER: _ClassVar[int]
    SCALE_NACK_FIELD_NUMBER: _ClassVar[int]
    SCALE_PROBE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    version: int
    sender: str
    cost_announce: CostAnnounce
    request_flow: RequestFlow
    flow_reply: FlowReply
    deny: Deny
    withdraw: Withdraw
    query_flows: QueryFlows
    flow_report: FlowReport
    request_change: RequestChange
    request_redirect: RequestRedirect
    move_reply: MoveReply
    reroute: Reroute
    launch_bid: LaunchBid
    relabel: Relabel
    relabel_cost: RelabelCost
    label_limit: LabelLimit
    hello: Hello
    peer_list: PeerList
    forward: Forward
    backward: Backward
    complete: Complete
    iteration_done: IterationDone
    begin_aggregation: BeginAggregation
    can_take: CanTake
    phase_ack: PhaseAck
    all_reduce_chunk: AllReduceChunk
    ping: Ping
    pong: Pong
    stage_state_request: StageStateRequest
    stage_state: StageState
    goodbye: Goodbye
    revocations: Revocations
    mb_deny: MbDeny
    probe: Probe
    probe_ack: ProbeAck
    recover: Recover
    resume: Resume
    backward_stuck: BackwardStuck
    room: Room
    release: Release
    mb_state: MbState
    repair_order: RepairOrder
    lend: Lend
    link_cost: LinkCost
    link_probe: LinkProbe
    request_vote: RequestVote
    vote: Vote
    leader_heartbeat: LeaderHeartbeat
    heartbeat_ack: HeartbeatAck
    join_request: JoinRequest
    utilization_query: UtilizationQuery
    utilization_report: UtilizationReport
    assignment: Assignment
    homing_start: HomingStart
    trace_unit: TraceUnit
    cost_query: CostQuery
    cost_reply: CostReply
    install: Install
    pool_frame: PoolFrame
    scale_phase: ScalePhase
    scale_push: ScalePush
    scale_refuse: ScaleRefuse
    scale_credit: ScaleCredit
    scale_done: ScaleDone
    scale_price: ScalePrice
    scale_abort: ScaleAbort
    scale_nack: ScaleNack
    scale_probe: ScaleProbe
    refused: Refused
    def __init__(self, version: _Optional[int] = ..., sender: _Optional[str] = ..., cost_announce: _Optional[_Union[CostAnnounce, _Mapping]] = ..., request_flow: _Optional[_Union[RequestFlow, _Mapping]] = ..., flow_reply: _Optional[_Union[FlowReply, _Mapping]] = ..., deny: _Optional[_Union[Deny, _Mapping]] = ..., withdraw: _Optional[_Union[Withdraw, _Mapping]] = ..., query_flows: _Optional[_Union[QueryFlows, _Mapping]] = ..., flow_report: _Optional[_Union[FlowReport, _Mapping]] = ..., request_change: _Optional[_Union[RequestChange, _Mapping]] = ..., request_redirect: _Optional[_Union[RequestRedirect, _Mapping]] = ..., move_reply: _Optional[_Union[MoveReply, _Mapping]] = ..., reroute: _Optional[_Union[Reroute, _Mapping]] = ..., launch_bid: _Optional[_Union[LaunchBid, _Mapping]] = ..., relabel: _Optional[_Union[Relabel, _Mapping]] = ..., relabel_cost: _Optional[_Union[RelabelCost, _Mapping]] = ..., label_limit: _Optional[_Union[LabelLimit, _Mapping]] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., peer_list: _Optional[_Union[PeerList, _Mapping]] = ..., forward: _Optional[_Union[Forward, _Mapping]] = ..., backward: _Optional[_Union[Backward, _Mapping]] = ..., complete: _Optional[_Union[Complete, _Mapping]] = ..., iteration_done: _Optional[_Union[IterationDone, _Mapping]] = ..., begin_aggregation: _Optional[_Union[BeginAggregation, _Mapping]] = ..., can_take: _Optional[_Union[CanTake, _Mapping]] = ..., phase_ack: _Optional[_Union[PhaseAck, _Mapping]] = ..., all_reduce_chunk: _Optional[_Union[AllReduceChunk, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., stage_state_request: _Optional[_Union[StageStateRequest, _Mapping]] = ..., stage_state: _Optional[_Union[StageState, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., revocations: _Optional[_Union[Revocations, _Mapping]] = ..., mb_deny: _Optional[_Union[MbDeny, _Mapping]] = ..., probe: _Optional[_Union[Probe, _Mapping]] = ..., probe_ack: _Optional[_Union[ProbeAck, _Mapping]] = ..., recover: _Optional[_Union[Recover, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., backward_stuck: _Optional[_Union[BackwardStuck, _Mapping]] = ..., room: _Optional[_Union[Room, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., mb_state: _Optional[_Union[MbState, _Mapping]] = ..., repair_order: _Optional[_Union[RepairOrder, _Mapping]] = ..., lend: _Optional[_Union[Lend, _Mapping]] = ..., link_cost: _Optional[_Union[LinkCost, _Mapping]] = ..., link_probe: _Optional[_Union[LinkProbe, _Mapping]] = ..., request_vote: _Optional[_Union[RequestVote, _Mapping]] = ..., vote: _Optional[_Union[Vote, _Mapping]] = ..., leader_heartbeat: _Optional[_Union[LeaderHeartbeat, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., join_request: _Optional[_Union[JoinRequest, _Mapping]] = ..., utilization_query: _Optional[_Union[UtilizationQuery, _Mapping]] = ..., utilization_report: _Optional[_Union[UtilizationReport, _Mapping]] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., homing_start: _Optional[_Union[HomingStart, _Mapping]] = ..., trace_unit: _Optional[_Union[TraceUnit, _Mapping]] = ..., cost_query: _Optional[_Union[CostQuery, _Mapping]] = ..., cost_reply: _Optional[_Union[CostReply, _Mapping]] = ..., install: _Optional[_Union[Install, _Mapping]] = ..., pool_frame: _Optional[_Union[PoolFrame, _Mapping]] = ..., scale_phase: _Optional[_Union[ScalePhase, _Mapping]] = ..., scale_push: _Optional[_Union[ScalePush, _Mapping]] = ..., scale_refuse: _Optional[_Union[ScaleRefuse, _Mapping]] = ..., scale_credit: _Optional[_Union[ScaleCredit, _Mapping]] = ..., scale_done: _Optional[_Union[ScaleDone, _Mapping]] = ..., scale_price: _Optional[_Union[ScalePrice, _Mapping]] = ..., scale_abort: _Optional[_Union[ScaleAbort, _Mapping]] = ..., scale_nack: _Optional[_Union[ScaleNack, _Mapping]] = ..., scale_probe: _Optional[_Union[ScaleProbe, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: RefusalCode
    reason: str
    def __init__(self, code: _Optional[_Union[RefusalCode, str]] = ..., reason: _Optional[str] = ...) -> None: ...

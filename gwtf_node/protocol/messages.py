"""Messages of the flow-formation protocol (section V-C of the GWTF paper).

These frozen dataclasses are what the protocol machines exchange.  On the
wire each one is the protobuf message of the same name in `protos/gwtf.proto`
(see `codec.py`); the simulator passes the dataclasses directly, which is what
lets it run a thousand nodes quickly, and a test round-trips every message
through protobuf so that both stay the same.

Vocabulary: a *commodity* is the data node a unit of flow belongs to (every
microbatch returns to its own data node).  A *label* is a node's announced
cost-to-sink for one commodity on one side: `IN` is what it costs to hand the
node a new unit, `OUT` what it costs the node to get rid of a unit it holds.
`path` lists the residual route behind a label (side-tagged node ids, see
`flow/`), which keeps the distance-vector announcements loop free.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .electmsgs import HeartbeatAck, LeaderHeartbeat, RequestVote, Vote  # noqa: F401 - re-exported (leader.py)
from .homingmsgs import CostQuery, CostReply, HomingStart, Install, PoolFrame, Route, TraceUnit  # noqa: F401 - re-exported
from .scalemsgs import (  # noqa: F401 - re-exported
    ScaleAbort, ScaleCredit, ScaleDone, ScaleNack, ScalePhase, ScalePrice, ScaleProbe, ScalePush, ScaleRefuse,
)
from .joinmsgs import Assignment, JoinRequest, UtilizationQuery, UtilizationReport  # noqa: F401 - re-exported
from .refusals import RefusalCode, Revocations  # noqa: F401 - re-exported: a Refused carries one; trust messages
from .replies import DenyReason, Reply, Side  # noqa: F401 - re-exported: flow messages carry them

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Label:
    commodity: str
    side: Side
    cost: float
    path: tuple[str, ...]
    epoch: int = 0  # the label wave it belongs to (see flow/launches.py, "Label waves"); 0 with free-running labels
    formation: bool = False  # a wave of a data node that lost no unit: units wait for still labels (flow/waves.py)


@dataclass(frozen=True, slots=True)
class CostAnnounce:
    """Cost-to-sink announcement: the sender's current labels."""

    labels: tuple[Label, ...]


@dataclass(frozen=True, slots=True)
class RequestFlow:
    """Hand one unit of `commodity` to the receiver, expecting its IN label to be `expected_cost`.

    `forced` requests come from an agreed Request Change / Request Redirect:
    the receiver takes the unit whatever its label, because a matching
    `Withdraw` (or `Reroute`) takes one away from it at the same time.
    """

    req_id: int
    commodity: str
    expected_cost: float
    forced: bool = False


@dataclass(frozen=True, slots=True)
class FlowReply:
    req_id: int
    commodity: str
    outcome: Reply
    current: Label | None = None


@dataclass(frozen=True, slots=True)
class Deny:
    """The receiver's unit of `commodity` sent to the sender is handed back."""

    commodity: str
    reason: DenyReason


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The sender asks to take back one unit of `commodity` it sends to the receiver.

    The receiver owns the count of units on the link: it applies the
    withdrawal and answers with a `FlowReply` (APPROVED, or NO_SUCH_FLOW when
    the unit was already handed back), and the sender updates its copy then.
    """

    req_id: int
    commodity: str


@dataclass(frozen=True, slots=True)
class Reroute:
    """The sender dropped one unit of `commodity` from the receiver; send it to `to` instead (Request Redirect)."""

    commodity: str
    to: str


@dataclass(frozen=True, slots=True)
class BidFeed:
    """The sender of a LaunchBid takes `data_node`'s bids from `relay` only (the other relays keep them)."""

    data_node: str
    relay: str


@dataclass(frozen=True, slots=True, repr=False)
class LaunchBid:
    """Data node `data_node`'s next launch would cost `cost` (its OUT label; INF: it will not launch).

    Sent by a data node to its first-stage relays, which pass it on, once per
    `seq`, to their other data-node neighbours: with several data nodes the
    cheapest launch goes first ("Ordered launches" in flow/bids.py).  `feeds`
    names, per other data node, the one relay that passes that data node's
    bids on to the sender (a data node not named: every relay does).  `full`:
    the data node has placed its whole demand (its cost is INF), so no relay
    relabels a unit into it ("Relabelling" in flow/relabel.py).
    """

    data_node: str
    seq: int
    cost: float
    feeds: tuple[BidFeed, ...] = ()
    full: bool = False

    def __repr__(self) -> str:  # without feeds and full as before they existed (traces hash the repr)
        text = f"LaunchBid(data_node={self.data_node!r}, seq={self.seq!r}, cost={self.cost!r}"
        if self.feeds:
            text += f", feeds={self.feeds!r}"
        if self.full:
            text += ", full=True"
        return text + ")"


@dataclass(frozen=True, slots=True)
class Relabel:
    """One unit on the link between sender and receiver changes commodity: `from_commodity` -> `to_commodity`.

    Several data nodes ("Relabelling" in flow/relabel.py): a first-stage relay turns
    a unit of data node A into one of data node B when B's hops to and from
    the unit's route are cheaper; the relabel travels down the route to the
    last-stage relay, which sends the unit back to B instead of A.
    """

    from_commodity: str
    to_commodity: str


@dataclass(frozen=True, slots=True)
class RelabelPair:
    """One more pair of a `RelabelCost`, with the same meaning."""

    from_commodity: str
    to_commodity: str
    cost: float


@dataclass(frozen=True, slots=True, repr=False)
class RelabelCost:
    """Relabelling one unit of `from_commodity` that the receiver sends to the sender changes the cost
    downstream of the sender by `cost` (only the hop back to a data node changes; INF: not possible).
    `more`: the other pairs that changed at the same time, in one message."""

    from_commodity: str
    to_commodity: str
    cost: float
    more: tuple[RelabelPair, ...] = ()

    def __repr__(self) -> str:  # without `more` when empty, as before it existed (traces hash the repr)
        text = f"RelabelCost(from_commodity={self.from_commodity!r}, to_commodity={self.to_commodity!r}, " \
               f"cost={self.cost!r}"
        return text + (f", more={self.more!r})" if self.more else ")")

    def pairs(self) -> tuple[RelabelCost | RelabelPair, ...]:
        """Every pair the message carries, itself first."""
        return (self, *self.more) if self.more else (self,)


@dataclass(frozen=True, slots=True)
class LabelLimit:
    """Label waves: the sender need not hear the receiver's IN labels of `commodity` that cost `cost` or more
    (they cannot change its choice); INF: every label, an unreachable one of a new wave too (flow/limits.py)."""

    commodity: str
    cost: float


@dataclass(frozen=True, slots=True)
class HopFlow:
    """One entry of a flow report: `count` units of `commodity` to/from `peer` at link cost `cost`."""

    commodity: str
    peer: str
    count: int
    cost: float


@dataclass(frozen=True, slots=True)
class QueryFlows:
    query_id: int


@dataclass(frozen=True, slots=True)
class FlowReport:
    query_id: int
    capacity: int
    used: int
    inflows: tuple[HopFlow, ...]
    outflows: tuple[HopFlow, ...]
    next_costs: tuple[tuple[str, float], ...]  # link cost to each next-stage neighbour


@dataclass(frozen=True, slots=True)
class RequestChange:
    """Swap next hops: the requester's unit to `requester_next` and the receiver's to `receiver_next`."""

    move_id: int
    commodity: str
    requester_next: str
    receiver_next: str
    requester_delta: float  # d(req, receiver_next) - d(req, requester_next)
    temperature_accept: bool  # the requester accepted a worse move by annealing


@dataclass(frozen=True, slots=True)
class RequestRedirect:
    """Route one unit of `commodity` prev -> receiver -> next through the requester instead."""

    move_id: int
    commodity: str
    prev: str
    next: str
    via_requester_cost: float  # d(prev, requester) + d(requester, next)
    temperature_accept: bool


@dataclass(frozen=True, slots=True)
class MoveReply:
    move_id: int
    outcome: Reply


# ---- runtime: membership, training and aggregation (the daemon) -----------


@dataclass(frozen=True, slots=True)
class TensorHeader:
    """Describes the raw tensor bytes that follow a message on the wire."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sparse_kept: int = 0  # 0: dense; k > 0: Top-K sparse, k indices then k values (model/compression.py)


@dataclass(frozen=True, slots=True)
class Hello:
    run_id: str
    role: str
    stage: int
    name: str
    capacity: int
    addrs: tuple[str, ...]
    tensor_addr: str = ""
    joining: bool = False
    ready_from: int = 0
    leaving: bool = False
    leave_after: int = 0
    steps: int = 0  # optimizer steps applied to its part (a data node: the run's step)
    incarnation: int = 0  # drawn at each start of the process: a new value is the same node restarted
    certificate: bytes = b""  # the run owner's admission certificate for this peer id and role; b"": none
    forgot_you: bool = False  # the sender presumed this peer dead and forgot it: forget the sender too, take it back


@dataclass(frozen=True, slots=True)
class Goodbye:
    after_iteration: int


@dataclass(frozen=True, slots=True)
class PeerList:
    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Forward:
    data_node: str
    seq: int
    iteration: int
    path: tuple[str, ...]
    tensor: TensorHeader | None
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class Backward:
    data_node: str
    seq: int
    iteration: int
    tensor: TensorHeader | None
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale
    chain: tuple[str, ...] = ()  # the relays that computed this backward, the sender first (stage order)


@dataclass(frozen=True, slots=True)
class Complete:
    data_node: str
    seq: int
    iteration: int
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class IterationDone:
    iteration: int
    completed: int
    loss_sum: float
    deferred: int = 0  # given up in this iteration (crash recovery), pushed again in the next
    lost: int = 0  # neither completed nor deferred when reported (the ledger's invariant: 0)
    completed_seqs: tuple[int, ...] = ()  # the completed microbatches: only their gradients count
    completed_attempts: tuple[int, ...] = ()  # the attempt that completed each of them (empty: any counts)
    completed_holders: tuple[int, ...] = ()  # per completed seq, per stage: its holder's tag (0: unknown)


@dataclass(frozen=True, slots=True)
class Lend:
    """Data node to data node: one unit of my flows through stage-0 relay `hop` is idle for the rest of
    `iteration` (I have nothing left to launch): launch on it (recovery/, "Lending")."""

    iteration: int
    hop: str


@dataclass(frozen=True, slots=True)
class StageMembers:
    stage: int
    peers: tuple[str, ...]
    digest: bytes = b""  # peers left out: the digest of the group the receiver holds (phasegroups.py)


@dataclass(frozen=True, slots=True)
class CompletedSeqs:
    data_node: str
    seqs: tuple[int, ...]
    attempts: tuple[int, ...] = ()  # the attempt that completed each seq (empty: any attempt counts)
    holders: tuple[int, ...] = ()  # per seq, per stage: the tag of the holder that counts it (0 / empty: any)


@dataclass(frozen=True, slots=True)
class BeginAggregation:
    iteration: int
    microbatches: int
    groups: tuple[StageMembers, ...] = ()
    term: int = 0  # the term of the leader that sent it (its driver stamps it); relays pass it on unchanged
    completed: tuple[CompletedSeqs, ...] = ()  # per data node (empty: count every contribution held)


@dataclass(frozen=True, slots=True)
class CanTake:
    iteration: int
    stage: int


class PhaseKind(enum.IntEnum):
    """Which aggregation-phase signal a `PhaseAck` acknowledges; mirrors the proto enum `PhaseKind`."""

    DONE = 1  # "I have your IterationDone of this iteration: stop resending it."
    BEGIN = 2  # "I have your BeginAggregation of this iteration: stop resending it."
    CAN_TAKE = 3  # "I have your CanTake of this iteration: stop resending it."
    GROUPS = 4  # "Your BEGIN of this iteration named groups by a digest I do not hold: send them."


@dataclass(frozen=True, slots=True)
class PhaseAck:
    """The receiver has the phase signal `kind` of `iteration` (sent for every copy: duplicates too)."""

    kind: PhaseKind
    iteration: int


@dataclass(frozen=True, slots=True)
class AllReduceChunk:
    key: str
    part: int
    phase: int
    count: float
    tensor: TensorHeader | None


@dataclass(frozen=True, slots=True)
class LinkCost:
    """The upstream end of a flow link to the downstream end: the cost d(i, j) I use for our link.

    Each end measures the link itself (its own round trip), so the two may
    disagree; the flow machines' residual edges assume one cost per link (a
    unit's forward edge and its backward edge cancel), and with two different
    values they can stall short of the demand.  The downstream end adopts the
    upstream end's value (`FlowNode.set_cost`).  When the upstream end's
    measurement moves past the re-costing threshold (`runtime/node/linkmeter.py`),
    `reform` is set and both ends re-form the flows over the link
    (`FlowNode.recost`)."""

    cost: float
    reform: bool = False


@dataclass(frozen=True, slots=True)
class Ping:
    nonce: int


@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int
    compute_ms: float = 0.0  # the responder's compute per microbatch (Equation 1's c_j; 0: not measured yet)
    busy_ms: float = 0.0  # the responder's longest work or event-loop lag (its liveness deadline's share; 0: none)
    incarnation: int = 0  # the responder's (its Hello's; 0: not told): another than its Hello said is a restart


@dataclass(frozen=True, slots=True)
class LinkProbe:
    """A timed transfer to a flow neighbour: its payload's transfer time measures the link's bandwidth."""

    nonce: int


@dataclass(frozen=True, slots=True)
class StageStateRequest:
    stage: int
    after: int = 0
    hash_only: bool = False  # the steps and parameter hash (a relay) or the stage's steps in the run (a data node)
    offset: int = 0  # bytes of the state `sha256` already held: the source sends the rest if it sends that state
    sha256: str = ""  # the state being resumed ("": none)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """How the step that brought a stage's state to `steps` was summed (protocol/roundcheck.py)."""

    steps: int
    count: float
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StageState:
    stage: int
    iteration: int
    sha256: str
    tensor: TensorHeader | None
    params_sha256: str = ""  # a relay's hash-only answer: StageModel.state_hash() at `iteration` steps
    run_steps: int = 0  # a data node's hash-only answer: the first iteration a state installed now takes part in
    stage_empty: bool = False  # a data node's hash-only answer: no relay of the stage is ready
    rounds: tuple[RoundRecord, ...] = ()  # a relay's answer: how its last steps were summed (roundcheck.py)
    offset: int = 0  # where the bytes that follow go in the state (it comes in chunks: runtime/node/statechunks.py)
    total: int = 0  # the state's bytes (0: the bytes that follow are the whole state)


# ---- crash recovery of microbatches (section V-D; protocol/recovery/) ----


@dataclass(frozen=True, slots=True)
class MbDeny:
    """The receiver's microbatch sent to the sender is handed back: the sender has no room / no route for it."""

    data_node: str
    seq: int
    iteration: int
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class Probe:
    """The data node's ping along a microbatch's path (backward pass); `path` = data node, then one relay per stage."""

    data_node: str
    seq: int
    iteration: int
    path: tuple[str, ...]
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class ProbeAck:
    data_node: str
    seq: int
    iteration: int
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class Recover:
    """A stored activation for a live node of a crashed stage: recompute the stage and go on to `rest`."""

    data_node: str
    seq: int
    iteration: int
    path: tuple[str, ...]  # the path up to the sender (data node first)
    rest: tuple[str, ...]  # the old path after the crashed node (ends with the data node)
    tensor: TensorHeader | None
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class Resume:
    """The sender replaced a crashed node before the receiver: resend your stored gradient to the sender."""

    data_node: str
    seq: int
    iteration: int
    path: tuple[str, ...]
    rest: tuple[str, ...]
    tensor: TensorHeader | None
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class BackwardStuck:
    """To the data node: the sender could not hand the backward of a microbatch to its upstream peer."""

    data_node: str
    seq: int
    iteration: int
    stage: int
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class Room:
    """The sender, which sent a DENY, has room again for `free` microbatches."""

    free: int


@dataclass(frozen=True, slots=True)
class Release:
    """The data node gave this attempt of the microbatch up: drop its stash and any gradient of it."""

    data_node: str
    seq: int
    iteration: int
    attempt: int = 0  # the data node's attempt number of the microbatch (recovery/): older ones are stale


@dataclass(frozen=True, slots=True)
class MbState:
    """To the data node: what the sender holds of a microbatch (a Probe answer, or "I took it at `stage`")."""

    data_node: str
    seq: int
    iteration: int
    attempt: int
    stage: int
    state: str  # none | fwd | sending | sent | bwd | grad | done (see recovery/)


@dataclass(frozen=True, slots=True)
class RepairOrder:
    """From the data node: send your stored output of this microbatch on to a live node of the next stage.

    `rest` covers the stages after the sender: "" = a replacement to choose (recompute), else the live node
    of the old path where the recovery chain resumes (the data node itself at the end)."""

    data_node: str
    seq: int
    iteration: int
    attempt: int
    rest: tuple[str, ...]


# ---- start-up: a refused Hello is answered (runtime/net/bootstrap.py) ----------


@dataclass(frozen=True, slots=True)
class Refused:
    """The answer to a refused Hello: the refused node stops if no peer has accepted it yet."""

    code: RefusalCode
    reason: str  # one line for a person: what differs, with both sides' values


Message = (
    CostAnnounce | RequestFlow | FlowReply | Deny | Withdraw | QueryFlows | FlowReport
    | RequestChange | RequestRedirect | MoveReply | Reroute | LaunchBid | Relabel | RelabelCost | LabelLimit
    | Hello | PeerList | Forward | Backward | Complete | IterationDone | BeginAggregation | CanTake | PhaseAck
    | AllReduceChunk | LinkCost | Ping | Pong | LinkProbe | StageStateRequest | StageState | Goodbye | Revocations
    | MbDeny | Probe | ProbeAck | Recover | Resume | BackwardStuck | Room | Release | MbState | RepairOrder | Lend
    | RequestVote | Vote | LeaderHeartbeat | HeartbeatAck
    | JoinRequest | UtilizationQuery | UtilizationReport | Assignment
    | HomingStart | TraceUnit | CostQuery | CostReply | Install | PoolFrame
    | ScalePhase | ScalePush | ScaleRefuse | ScaleCredit | ScaleDone | ScalePrice | ScaleAbort | ScaleNack | ScaleProbe
    | Refused
)

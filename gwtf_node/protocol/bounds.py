"""Value bounds of every wire message: what a well-formed frame from a member may still not say.

`codec.decode` checks the form of a frame (size, schema, known enum values, no
NaN).  A member of the run can send a frame of perfect form whose *values*
would still hurt: a negative cost that attracts every unit of flow, a label
epoch of 2^32 that freezes the label waves, a term far ahead that ends every
lease, a Request Flow for more units than the sender can carry, a tensor of
another shape or dtype, an iteration number a billion ahead.  This module
writes the range of every value down, once, as one check function per
message type (`CHECKS`), and `check(msg, ctx)` returns the first `Problem`
found, or None.  The daemon calls it for every decoded frame before the
frame reaches its component (runtime/node/node.py `_on_frame`), refuses a frame
with a problem, and counts refusals per `Violation` code in status.json
(`refused_values`).

What a check may compare with is handed in a small `Context`: this node's
current iteration and leader term, the label epoch it knows per commodity,
the capacity the sender announced in its Hello and the units of flow the
sender already hands this node, the shape and dtype of the stage's
activations and the length of its gradient vector.  A field left at None
means "not known here" and its relative checks are skipped, so the checks
hold for a node that is still starting; absolute bounds always apply.

Every bound is a named constant below, with its unit and its reason.  The
module is pure: no I/O, no clock, no torch; the magnitude of a tensor's
values is measured by the runtime and judged here (`check_magnitude`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import messages as m
from .phasegroups import DIGEST_BYTES
from .roundcheck import KEEP_ROUNDS
from .scalemsgs import SCALE_MESSAGES, SIDE_KINDS

# ---- bounds ---------------------------------------------------------------

# Costs are milliseconds (Equation 1: half the two compute times, the mean
# latency and the transfer time of one activation).  A route through every
# stage of a run across continents costs seconds; a cost beyond ~3 hours is
# no link a run can use: it is an attack or a bug.  +infinity ("no route")
# stays allowed where the protocol defines it.
MAX_COST_MS = 1e7
# Label waves (flow/waves.py) start one at a time at the data node, each once
# the one before settled or got stuck, so a neighbour is at most a few waves
# ahead of this node; 256 leaves room for a node that was busy for a while.
MAX_EPOCH_AHEAD = 256
# A node that has not yet seen a wave of a commodity (a newcomer, epoch 0 here)
# adopts the epoch it hears; only an epoch no run reaches is refused then
# (2^20 waves: one every 100 ms for more than a day).
MAX_EPOCH_UNSEEN = 1 << 20
# Terms grow by one per election, and pre-votes (leader.py) keep a partitioned
# node from inflating its term; a peer that is more than 64 elections ahead
# is not a peer that missed a few.
MAX_TERM_AHEAD = 64
# ... and a node that follows no election yet (term 0) accepts a term below this.
MAX_TERM_UNSEEN = 1 << 20
# A member is at most one iteration ahead of another (the next iteration opens
# only after CAN TAKE of this one went through every stage); a node that
# lagged a while (a relay waiting for its state) is further behind, never
# ahead.  Messages about iterations more than this far ahead are refused;
# messages about old iterations are stale and the machines ignore them.
MAX_ITERATIONS_AHEAD = 16
# Microbatches per iteration over all data nodes, counts in reports: a run of
# a million microbatches per iteration is beyond any run of this daemon.
MAX_MICROBATCHES = 1 << 20
# A node's capacity (microbatches held at a time): the same bound.
MAX_CAPACITY = MAX_MICROBATCHES
# Relay stages of a run (the manifest cuts layers into stages; no model has more layers).
MAX_STAGES = 1 << 12
# A microbatch's loss is a mean token cross-entropy: log(vocab) at the start
# (ln 2^20 ~ 14); a sum over MAX_MICROBATCHES of them stays below this.
MAX_LOSS_SUM = 1e8
# Prices, epsilons and cost factors of scaled formation (integers: link costs x alpha x the path length) and
# its phases (log2 of the first epsilon)
MAX_SCALE_VALUE, MAX_SCALE_PHASES = 1 << 62, 128
# Entries of a repeated field (paths, groups, labels, peer lists, flow reports).
MAX_ITEMS = 4096
# Seqs of completed microbatches one data node reports for one iteration (IterationDone, BeginAggregation):
# each one's gradient is computed and stored at every stage, so a node's iteration holds far fewer.
MAX_SEQS = 1 << 16
# Characters of a string field (peer ids are ~52, multiaddrs ~100, a refusal's reason one line).
MAX_STRING_CHARS = 2048
# A revocation list passed on between nodes (about 70 bytes per revoked peer id): a longer one is read from
# the DHT or a file only
MAX_REVOCATIONS_BYTES = 1 << 18
# Activations and their gradients travel as float tensors.  The hidden state of
# a pre-norm transformer stays within a few hundred, gradients far below; a
# finite value beyond 1e6 (float16 ends at 65504) is no training signal and
# would swamp a sum of gradients: refused like a NaN.
MAX_TENSOR_ABS = 1e6
# A stage's state (weights and optimizer state, runtime/node/statechunks.py): 16 GiB, a part of ~1.4B parameters
# with AdamW, is more than a volunteer's stage holds.
MAX_STATE_BYTES = 1 << 34
# Dtypes that may carry activations, gradients and all-reduce parts.
TENSOR_DTYPES = ("float32", "float16", "bfloat16", "float64")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "uint8": 1, "int64": 8, "int32": 4,
             "bool": 1}


class Violation(enum.Enum):
    """Why a frame's values are refused; counted per code in status.json (`refused_values`)."""

    NEGATIVE_COST = "negative_cost"  # "A cost below 0: Equation 1 is a sum of non-negative terms."
    COST_OUT_OF_RANGE = "cost_out_of_range"  # "A finite cost beyond MAX_COST_MS, or infinite where not allowed."
    EPOCH_JUMP = "epoch_jump"  # "A label epoch far ahead of the wave this node knows."
    TERM_JUMP = "term_jump"  # "A leader term far ahead of this node's."
    ITERATION_FAR = "iteration_far"  # "An iteration far ahead of this node's."
    OVER_CAPACITY = "over_capacity"  # "More units of flow than the sender's announced capacity."
    COUNT_OUT_OF_RANGE = "count_out_of_range"  # "A count, capacity or sum outside its range."
    STAGE_OUT_OF_RANGE = "stage_out_of_range"  # "A stage number the run does not have."
    TOO_MANY = "too_many"  # "A repeated field or a string longer than its bound."
    TENSOR_DTYPE = "tensor_dtype"  # "A tensor of a dtype this message does not carry."
    TENSOR_SHAPE = "tensor_shape"  # "A tensor of a shape this stage does not take."
    TENSOR_SIZE = "tensor_size"  # "A tensor header whose byte count does not fit its shape and dtype."
    TENSOR_MAGNITUDE = "tensor_magnitude"  # "A finite tensor value beyond MAX_TENSOR_ABS."
    GRADIENT_OUTLIER = "gradient_outlier"  # "An all-reduce contribution whose norm is an outlier (gradguard.py)."


@dataclass(frozen=True, slots=True)
class Problem:
    code: Violation
    why: str  # one line for the log, with the numbers

    def __str__(self) -> str:
        return f"{self.code.value}: {self.why}"


@dataclass(frozen=True)
class Context:
    """What this node knows that a message's values are compared with; None: not known here (skip)."""

    n_stages: int | None = None
    iteration: int | None = None  # this node's current iteration
    term: int | None = None  # this node's leader term
    epochs: Mapping[str, int] = field(default_factory=dict)  # commodity -> this node's label wave
    sender_capacity: int | None = None  # the capacity the sender announced (its Hello)
    units_from_sender: int = 0  # units of flow the sender hands this node now, all commodities
    hidden_shape: tuple[int, ...] | None = None  # shape of one microbatch's activation at this stage
    hidden_dtype: str | None = None  # its dtype name
    grad_len: int | None = None  # length of this node's flat gradient (the all-reduce vector)


# ---- helpers --------------------------------------------------------------


def _cost(value: float, what: str, *, infinite_ok: bool = True, negative_ok: bool = False) -> Problem | None:
    if math.isinf(value):
        if infinite_ok and value > 0:
            return None
        return Problem(Violation.COST_OUT_OF_RANGE, f"{what} is {value}")
    if value < 0 and not negative_ok:
        return Problem(Violation.NEGATIVE_COST, f"{what} is {value} ms, below 0")
    if abs(value) > MAX_COST_MS:
        return Problem(Violation.COST_OUT_OF_RANGE, f"{what} is {value} ms, beyond {MAX_COST_MS:g}")
    return None


def _count(value: int | float, what: str, hi: float) -> Problem | None:
    if not (0 <= value <= hi):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"{what} is {value}, outside [0, {hi:g}]")
    return None


def _state_bytes(value: int, what: str) -> Problem | None:
    return _count(value, what, MAX_STATE_BYTES)


def _items(values: tuple, what: str, hi: int = MAX_ITEMS) -> Problem | None:
    if len(values) > hi:
        return Problem(Violation.TOO_MANY, f"{what} has {len(values)} entries, at most {hi}")
    return None


def _strings(*values: str) -> Problem | None:
    for s in values:
        if len(s) > MAX_STRING_CHARS:
            return Problem(Violation.TOO_MANY, f"a string of {len(s)} characters, at most {MAX_STRING_CHARS}")
    return None


def _stage(stage: int, ctx: Context, what: str, *, data_ok: bool = True, lowest: int | None = None) -> Problem | None:
    hi = (ctx.n_stages if ctx.n_stages is not None else MAX_STAGES) - 1
    lo = lowest if lowest is not None else -1 if data_ok else 0
    if not lo <= stage <= hi:
        return Problem(Violation.STAGE_OUT_OF_RANGE, f"{what} is {stage}, the run's stages are {lo}..{hi}")
    return None


def _iteration(it: int, ctx: Context, what: str = "iteration") -> Problem | None:
    if ctx.iteration is not None and it > ctx.iteration + MAX_ITERATIONS_AHEAD:
        return Problem(Violation.ITERATION_FAR, f"{what} {it} is more than {MAX_ITERATIONS_AHEAD} ahead of "
                                                f"this node's {ctx.iteration}")
    return None


def _term(term: int, ctx: Context) -> Problem | None:
    known = ctx.term or 0
    ahead = MAX_TERM_AHEAD if known > 0 else MAX_TERM_UNSEEN
    if term > known + ahead:
        return Problem(Violation.TERM_JUMP, f"term {term} is more than {ahead} ahead of this node's {known}")
    return None


def _label(lab: m.Label, ctx: Context, what: str = "label") -> Problem | None:
    # A label is a cost-to-sink in the residual graph: a route that sends a unit back along a flow (a backward
    # arc costs minus its link) can cost less than 0, and the label then names that route.  A negative label
    # without its route is no residual cost: refused.
    if p := _cost(lab.cost, f"{what} cost of {lab.commodity[:16]}", negative_ok=bool(lab.path)):
        return p
    if p := _items(lab.path, f"{what} path") or _strings(lab.commodity, *lab.path):
        return p
    known = ctx.epochs.get(lab.commodity, 0)
    ahead = MAX_EPOCH_AHEAD if known > 0 else MAX_EPOCH_UNSEEN
    if lab.epoch > known + ahead:
        return Problem(Violation.EPOCH_JUMP, f"{what} epoch {lab.epoch} of {lab.commodity[:16]} is more than "
                                             f"{ahead} ahead of this node's {known}")
    return None


def _tensor(h: m.TensorHeader | None, what: str, *, dtypes: tuple[str, ...], shape: tuple[int, ...] | None,
            required: bool = True) -> Problem | None:
    """A tensor header: one of `dtypes`, `shape` if known, and a byte count that fits both."""
    if h is None:
        return Problem(Violation.TENSOR_SHAPE, f"{what} without a tensor header") if required else None
    if h.dtype not in dtypes:
        return Problem(Violation.TENSOR_DTYPE, f"{what} tensor dtype {h.dtype[:32]!r}, expected {' or '.join(dtypes)}")
    if len(h.shape) > 8 or any(s < 0 for s in h.shape):
        return Problem(Violation.TENSOR_SHAPE, f"{what} tensor shape {tuple(h.shape)[:9]} is malformed")
    if shape is not None and tuple(h.shape) != tuple(shape):
        return Problem(Violation.TENSOR_SHAPE, f"{what} tensor shape {tuple(h.shape)}, expected {tuple(shape)}")
    need = math.prod(h.shape) * _ITEMSIZE[h.dtype]
    if h.sparse_kept:  # Top-K (model/compression.py): k int32 indices, then k values
        if h.sparse_kept < 0 or h.sparse_kept > math.prod(h.shape):
            return Problem(Violation.TENSOR_SIZE, f"{what} header keeps {h.sparse_kept} elements of a tensor of "
                                                  f"shape {tuple(h.shape)}")
        need = h.sparse_kept * (4 + _ITEMSIZE[h.dtype])
    if h.nbytes != need:
        return Problem(Violation.TENSOR_SIZE, f"{what} header says {h.nbytes} bytes, shape {tuple(h.shape)} of "
                                              f"{h.dtype} needs {need}")
    return None


def _hidden(h: m.TensorHeader | None, ctx: Context, what: str) -> Problem | None:
    dtypes = (ctx.hidden_dtype,) if ctx.hidden_dtype is not None else TENSOR_DTYPES
    return _tensor(h, what, dtypes=dtypes, shape=ctx.hidden_shape)


def check_magnitude(max_abs: float, what: str) -> Problem | None:
    """A tensor whose largest absolute value is `max_abs` (measured by the runtime): within MAX_TENSOR_ABS?"""
    if max_abs > MAX_TENSOR_ABS:
        return Problem(Violation.TENSOR_MAGNITUDE, f"{what} holds a value of magnitude {max_abs:.3g}, beyond "
                                                   f"{MAX_TENSOR_ABS:g}")
    return None


def _first(*problems: Problem | None) -> Problem | None:
    return next((p for p in problems if p is not None), None)


# ---- one check per message type -------------------------------------------


def _nothing(msg: Any, ctx: Context) -> Problem | None:
    """Nonces and identifiers: every value the schema admits is fine."""
    return None


def _cost_announce(msg: m.CostAnnounce, ctx: Context) -> Problem | None:
    return _items(msg.labels, "CostAnnounce") or _first(*(_label(lab, ctx) for lab in msg.labels))


def _request_flow(msg: m.RequestFlow, ctx: Context) -> Problem | None:
    # the receiver's IN label as the requester knows it: residual, so either sign (see `_label`)
    if p := _cost(msg.expected_cost, "RequestFlow expected cost", negative_ok=True) or _strings(msg.commodity):
        return p
    cap = ctx.sender_capacity
    if cap is not None and ctx.units_from_sender + 1 > cap:
        return Problem(Violation.OVER_CAPACITY, f"RequestFlow for unit {ctx.units_from_sender + 1} from a sender "
                                                f"that announced a capacity of {cap}")
    return None


def _flow_reply(msg: m.FlowReply, ctx: Context) -> Problem | None:
    return _strings(msg.commodity) or (None if msg.current is None else _label(msg.current, ctx, "FlowReply label"))


def _launch_bid(msg: m.LaunchBid, ctx: Context) -> Problem | None:
    return _cost(msg.cost, "LaunchBid cost", negative_ok=True) \
        or _items(msg.feeds, "LaunchBid feeds") \
        or _first(*(_strings(f.data_node, f.relay) for f in msg.feeds))  # cost: the OUT label, residual, either sign


def _relabel_cost(msg: m.RelabelCost, ctx: Context) -> Problem | None:
    return _items(msg.more, "RelabelCost more") \
        or _first(*(_cost(x.cost, "RelabelCost delta", negative_ok=True)  # a change of cost: either sign
                    or _strings(x.from_commodity, x.to_commodity) for x in msg.pairs()))


def _label_limit(msg: m.LabelLimit, ctx: Context) -> Problem | None:
    # a label's cost less a link's, plus a slack: residual, so either sign; INF: every label
    return _cost(msg.cost, "LabelLimit cost", negative_ok=True) or _strings(msg.commodity)


def _hop(h: m.HopFlow, what: str) -> Problem | None:
    return _cost(h.cost, f"{what} cost") or _count(h.count, f"{what} count", MAX_CAPACITY)


def _flow_report(msg: m.FlowReport, ctx: Context) -> Problem | None:
    return _first(_count(msg.capacity, "FlowReport capacity", MAX_CAPACITY),
                  _count(msg.used, "FlowReport used", MAX_CAPACITY),
                  _items(msg.inflows, "FlowReport inflows"), _items(msg.outflows, "FlowReport outflows"),
                  _items(msg.next_costs, "FlowReport next costs"),
                  *(_hop(h, "FlowReport flow") for h in msg.inflows + msg.outflows),
                  *(_cost(c, "FlowReport next cost") for _p, c in msg.next_costs))


def _request_change(msg: m.RequestChange, ctx: Context) -> Problem | None:
    return _cost(msg.requester_delta, "RequestChange delta", infinite_ok=False, negative_ok=True)


def _request_redirect(msg: m.RequestRedirect, ctx: Context) -> Problem | None:
    return _cost(msg.via_requester_cost, "RequestRedirect cost", infinite_ok=False)


def _link_cost(msg: m.LinkCost, ctx: Context) -> Problem | None:
    return _cost(msg.cost, "LinkCost", infinite_ok=False)


def _pong(msg: m.Pong, ctx: Context) -> Problem | None:
    return (_cost(msg.compute_ms, "Pong compute time", infinite_ok=False)
            or _cost(msg.busy_ms, "Pong busy time", infinite_ok=False))


def _hello(msg: m.Hello, ctx: Context) -> Problem | None:
    return _first(_strings(msg.run_id, msg.role, msg.name, msg.tensor_addr, *msg.addrs),
                  _items(msg.addrs, "Hello addrs", 64), _count(msg.capacity, "Hello capacity", MAX_CAPACITY),
                  # only the absolute bound: a stage this run lacks is refused by discovery, with a Refused reply
                  # that stops the newcomer (bootstrap.py); -2 is a relay not placed yet (discovery.py)
                  _stage(msg.stage, Context(), "Hello stage", lowest=-2))


def _peer_list(msg: m.PeerList, ctx: Context) -> Problem | None:
    return _items(msg.addrs, "PeerList") or _strings(*msg.addrs)


def _revocations(msg: m.Revocations, ctx: Context) -> Problem | None:
    if not 0 < len(msg.signed) <= MAX_REVOCATIONS_BYTES:
        return Problem(Violation.TOO_MANY, f"a revocation list of {len(msg.signed)} bytes, 1 to "
                                           f"{MAX_REVOCATIONS_BYTES}")
    return None


def _path(path: tuple[str, ...], what: str) -> Problem | None:
    hi = 2 * MAX_STAGES + 2
    return _items(path, what, hi) or _strings(*path)


def _forward(msg: m.Forward, ctx: Context) -> Problem | None:
    return _iteration(msg.iteration, ctx) or _path(msg.path, "Forward path") or _hidden(msg.tensor, ctx, "Forward")


def _backward(msg: m.Backward, ctx: Context) -> Problem | None:
    stages = ctx.n_stages if ctx.n_stages is not None else MAX_STAGES
    return (_iteration(msg.iteration, ctx) or _hidden(msg.tensor, ctx, "Backward")
            or _items(msg.chain, "Backward chain", stages) or _strings(*msg.chain))


def _iteration_only(msg: Any, ctx: Context) -> Problem | None:
    """A message about one microbatch or one iteration: the iteration is near this node's."""
    return _iteration(msg.iteration, ctx)


def _iteration_done(msg: m.IterationDone, ctx: Context) -> Problem | None:
    if p := _iteration(msg.iteration, ctx):
        return p
    for name in ("completed", "deferred", "lost"):
        if p := _count(getattr(msg, name), f"IterationDone {name}", MAX_MICROBATCHES):
            return p
    if not (0 <= msg.loss_sum <= MAX_LOSS_SUM):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"IterationDone loss sum {msg.loss_sum} outside "
                                                     f"[0, {MAX_LOSS_SUM:g}]")
    if len(msg.completed_seqs) > msg.completed:
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"IterationDone names {len(msg.completed_seqs)} completed "
                                                     f"seqs for {msg.completed} completed microbatches")
    return _items(msg.completed_seqs, "IterationDone completed seqs", MAX_SEQS) or _completions(
        msg.completed_seqs, msg.completed_attempts, msg.completed_holders, ctx, "IterationDone")


def _completions(seqs: tuple, attempts: tuple, holders: tuple, ctx: Context, what: str) -> Problem | None:
    """The attempts and holders that completed `seqs` (protocol/completions.py): none (any counts), or one
    attempt per seq and one holder per seq and stage."""
    if attempts and len(attempts) != len(seqs):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"{what} names {len(attempts)} attempts for {len(seqs)} "
                                                     f"completed seqs (expected none or one per seq)")
    stages = ctx.n_stages if ctx.n_stages is not None else None
    if holders and (len(holders) % max(1, len(seqs)) or not seqs
                    or (stages is not None and len(holders) != stages * len(seqs))
                    or len(holders) > MAX_STAGES * len(seqs)):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"{what} names {len(holders)} holders for {len(seqs)} "
                                                     f"completed seqs (expected none or one per seq and stage)")
    return None


def _begin(msg: m.BeginAggregation, ctx: Context) -> Problem | None:
    return _first(_term(msg.term, ctx), _iteration(msg.iteration, ctx), _count(msg.microbatches, "BeginAggregation microbatches",
                                                         MAX_MICROBATCHES),
                  _items(msg.groups, "BeginAggregation groups", MAX_STAGES + 1),
                  *(_stage(g.stage, ctx, "BeginAggregation group stage") or _items(g.peers, "a group")
                    or _items(g.digest, "a group's digest (bytes)", DIGEST_BYTES)
                    for g in msg.groups),
                  _items(msg.completed, "BeginAggregation completed", MAX_ITEMS),
                  *(_strings(c.data_node) or _items(c.seqs, "a data node's completed seqs", MAX_SEQS)
                    or _completions(c.seqs, c.attempts, c.holders, ctx, "BeginAggregation completed")
                    for c in msg.completed))


def _can_take(msg: m.CanTake, ctx: Context) -> Problem | None:
    return _iteration(msg.iteration, ctx) or _stage(msg.stage, ctx, "CanTake stage")


def _all_reduce_chunk(msg: m.AllReduceChunk, ctx: Context) -> Problem | None:
    if msg.phase not in (1, 2):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"AllReduceChunk phase {msg.phase}, expected 1 or 2")
    if p := _strings(msg.key):
        return p
    if not (0 <= msg.count <= MAX_MICROBATCHES) or msg.count != int(msg.count):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"AllReduceChunk count {msg.count} is not a whole number in "
                                                     f"[0, {MAX_MICROBATCHES}]")
    # the run's wire dtype: its gradients cross the links in it too (runtime/node/allreduce.py)
    dtypes = (ctx.hidden_dtype,) if ctx.hidden_dtype is not None else ("float32", "bfloat16")
    if p := _tensor(msg.tensor, "AllReduceChunk", dtypes=dtypes, shape=None):
        return p
    if len(msg.tensor.shape) != 1:
        return Problem(Violation.TENSOR_SHAPE, f"AllReduceChunk tensor shape {tuple(msg.tensor.shape)}, expected 1-D")
    if ctx.grad_len is not None and msg.tensor.shape[0] > ctx.grad_len:
        return Problem(Violation.TENSOR_SHAPE, f"AllReduceChunk part of {msg.tensor.shape[0]} floats, this stage's "
                                               f"gradient has {ctx.grad_len}")
    return None


def _stage_state_request(msg: m.StageStateRequest, ctx: Context) -> Problem | None:
    """A relay asks for its stage's state; a restarted data node for the data nodes' part (stage -1, data_resume.py)."""
    return _first(_stage(msg.stage, ctx, "StageStateRequest stage"), _iteration(msg.after, ctx, "after"),
                  _strings(msg.sha256), _state_bytes(msg.offset, "StageStateRequest offset"))


def _stage_state(msg: m.StageState, ctx: Context) -> Problem | None:
    return _first(_stage(msg.stage, ctx, "StageState stage"), _iteration(msg.iteration, ctx, "steps"),
                  _iteration(msg.run_steps, ctx, "run steps"), _strings(msg.sha256, msg.params_sha256),
                  _tensor(msg.tensor, "StageState", dtypes=("uint8",), shape=None, required=False),
                  _items(msg.rounds, "StageState rounds", KEEP_ROUNDS), _state_bytes(msg.offset, "StageState offset"),
                  _state_bytes(msg.total, "StageState total"),
                  *(_iteration(r.steps, ctx, "a round's steps") or _count(r.count, "a round's count", MAX_MICROBATCHES)
                    or _items(r.members, "a round's members") or _strings(*r.members) for r in msg.rounds))


def _goodbye(msg: m.Goodbye, ctx: Context) -> Problem | None:
    return _iteration(msg.after_iteration, ctx, "Goodbye after iteration")


def _recover(msg: m.Recover, ctx: Context) -> Problem | None:
    """A stored activation, sent on: the stage's activation shape and dtype."""
    return _first(_iteration(msg.iteration, ctx), _path(msg.path, "Recover path"), _path(msg.rest, "Recover rest"),
                  _hidden(msg.tensor, ctx, "Recover"))


def _resume(msg: m.Resume, ctx: Context) -> Problem | None:
    """A request to resend a stored gradient: it carries no tensor itself."""
    if msg.tensor is not None:
        return Problem(Violation.TENSOR_SHAPE, "Resume with a tensor: it asks for one, it carries none")
    return _first(_iteration(msg.iteration, ctx), _path(msg.path, "Resume path"), _path(msg.rest, "Resume rest"))


def _probe(msg: m.Probe, ctx: Context) -> Problem | None:
    return _iteration(msg.iteration, ctx) or _path(msg.path, "Probe path")


def _backward_stuck(msg: m.BackwardStuck, ctx: Context) -> Problem | None:
    return _iteration(msg.iteration, ctx) or _stage(msg.stage, ctx, "BackwardStuck stage")


def _room(msg: m.Room, ctx: Context) -> Problem | None:
    return _count(msg.free, "Room free", MAX_CAPACITY)


def _mb_state(msg: m.MbState, ctx: Context) -> Problem | None:
    return _iteration(msg.iteration, ctx) or _stage(msg.stage, ctx, "MbState stage") or _strings(msg.state)


def _repair_order(msg: m.RepairOrder, ctx: Context) -> Problem | None:
    return _iteration(msg.iteration, ctx) or _path(msg.rest, "RepairOrder rest")


def _term_only(msg: Any, ctx: Context) -> Problem | None:
    """A message of the election: its term is not far ahead of this node's."""
    return _term(msg.term, ctx)


def _heartbeat(msg: m.LeaderHeartbeat, ctx: Context) -> Problem | None:
    return _term(msg.term, ctx) or _items(msg.data_nodes, "LeaderHeartbeat data nodes") or _strings(*msg.data_nodes)


def _join_request(msg: m.JoinRequest, ctx: Context) -> Problem | None:
    return _first(_count(msg.capacity, "JoinRequest capacity", MAX_CAPACITY),
                  _items(msg.stage_costs, "JoinRequest stage costs", MAX_STAGES),
                  *(_cost(c, "JoinRequest stage cost") for c in msg.stage_costs),
                  _items(msg.link_costs, "JoinRequest link costs"),
                  *(_strings(p) or _cost(c, "JoinRequest link cost", infinite_ok=False) for p, c in msg.link_costs))


def _utilization_report(msg: m.UtilizationReport, ctx: Context) -> Problem | None:
    return _first(_stage(msg.stage, ctx, "UtilizationReport stage"),
                  _count(msg.flows, "UtilizationReport flows", MAX_CAPACITY),
                  _count(msg.capacity, "UtilizationReport capacity", MAX_CAPACITY),
                  _items(msg.link_costs, "UtilizationReport link costs"),
                  *(_strings(p) or _cost(c, "UtilizationReport link cost", infinite_ok=False) for p, c in msg.link_costs))


def _assignment(msg: m.Assignment, ctx: Context) -> Problem | None:
    return _first(_term(msg.term, ctx), _stage(msg.stage, ctx, "Assignment stage", data_ok=False),
                  _iteration(msg.start_iteration, ctx, "start iteration"), _strings(msg.node, msg.download_from))


def _refused(msg: m.Refused, ctx: Context) -> Problem | None:
    return _strings(msg.reason)


def _homing(msg: Any, ctx: Context) -> Problem | None:
    """A message of pooled formation (flow/pool.py): its lists and strings bounded, its costs and counts in range."""
    t = type(msg)
    if t is m.TraceUnit:
        return _first(_items(msg.path, "path"), _strings(msg.origin, msg.end, *msg.path))
    if t is m.CostQuery:
        return _first(_items(msg.peers, "peers"), _strings(*msg.peers))
    if t is m.CostReply:
        costs = (_cost(c, "a link's cost", infinite_ok=False) for _, c in msg.costs)
        return _first(_items(msg.costs, "costs"), *costs)
    if t is m.Install:
        counts = (_count(r.count, "a route's units", MAX_CAPACITY) for r in msg.routes)
        return _first(_items(msg.routes, "routes"), *counts)
    return _strings(msg.role, msg.sender_role)  # PoolFrame (its frame is checked as it is read: runtime pooling.py)


def _scaling(msg: Any, ctx: Context) -> Problem | None:
    """A message of scaled formation (flow/scaling.py): the kinds of its sides, units, prices, epsilons, phases and
    the numbers asked for again in range, and a credit that is a fraction in [0, 1]."""
    for f in ("tail", "head", "side"):
        if getattr(msg, f, "in") not in SIDE_KINDS:
            return Problem(Violation.COUNT_OUT_OF_RANGE, f"a side's kind is {getattr(msg, f)[:20]!r}, not one of "
                                                         f"{SIDE_KINDS}")
    seqs = getattr(msg, "seqs", ())  # (ScaleNack's; numbers fit uint32 on the wire)
    big = (_count(abs(getattr(msg, f, 0)), f, MAX_SCALE_VALUE) for f in ("price", "eps", "alpha", "cost"))
    credit = getattr(msg, "credit", "0")
    num, _, den = credit.partition("/")
    if not (len(credit) <= 512 and credit.isascii() and num.isdigit() and (den.isdigit() or not _)
            and int(num) <= int(den or 1) != 0):
        return Problem(Violation.COUNT_OUT_OF_RANGE, f"credit {credit[:40]!r} is no fraction n/d in [0, 1]")
    return _first(_items(seqs, "seqs"), _strings(getattr(msg, "reason", "")), *big,
                  _count(getattr(msg, "amount", 0), "a push's units", MAX_CAPACITY),
                  _count(getattr(msg, "number", getattr(msg, "phase", 0)), "a phase", MAX_SCALE_PHASES))


# (Deny: a commodity and an enum, which the codec checks)
CHECKS: dict[type, Callable[[Any, Context], Problem | None]] = {
    m.CostAnnounce: _cost_announce, m.RequestFlow: _request_flow, m.FlowReply: _flow_reply, m.Deny: _nothing,
    m.Withdraw: _nothing, m.QueryFlows: _nothing, m.FlowReport: _flow_report, m.RequestChange: _request_change,
    m.RequestRedirect: _request_redirect, m.MoveReply: _nothing, m.Reroute: _nothing, m.LaunchBid: _launch_bid,
    m.Relabel: _nothing, m.RelabelCost: _relabel_cost, m.LabelLimit: _label_limit, m.Hello: _hello,
    m.PeerList: _peer_list, m.Revocations: _revocations, m.Forward: _forward, m.Backward: _backward,
    m.Complete: _iteration_only, m.IterationDone: _iteration_done, m.BeginAggregation: _begin, m.CanTake: _can_take,
    m.PhaseAck: _iteration_only, m.AllReduceChunk: _all_reduce_chunk, m.LinkCost: _link_cost, m.Ping: _nothing,
    m.Pong: _pong, m.LinkProbe: _nothing, m.StageStateRequest: _stage_state_request, m.StageState: _stage_state,
    m.Goodbye: _goodbye, m.MbDeny: _iteration_only, m.Probe: _probe, m.ProbeAck: _iteration_only, m.Recover: _recover,
    m.Resume: _resume, m.BackwardStuck: _backward_stuck, m.Room: _room, m.Release: _iteration_only,
    m.MbState: _mb_state, m.RepairOrder: _repair_order, m.Lend: _iteration_only, m.RequestVote: _term_only,
    m.Vote: _term_only, m.LeaderHeartbeat: _heartbeat, m.HeartbeatAck: _term_only, m.JoinRequest: _join_request,
    m.UtilizationQuery: _nothing, m.UtilizationReport: _utilization_report, m.Assignment: _assignment,
    m.Refused: _refused, m.HomingStart: _nothing, m.TraceUnit: _homing, m.CostQuery: _homing, m.CostReply: _homing,
    m.Install: _homing, m.PoolFrame: _homing, **dict.fromkeys(SCALE_MESSAGES, _scaling),
}


def check(msg: Any, ctx: Context) -> Problem | None:
    """The first value of `msg` out of its range given `ctx`, or None; never raises for a decoded message."""
    fn = CHECKS.get(type(msg))
    if fn is None:  # not a wire message: our own bug
        raise TypeError(f"no value bounds for {type(msg).__name__}: add a check to bounds.CHECKS")
    return fn(msg, ctx)


def units_from(inn: Mapping[str, Mapping[str, int]], sender: str) -> int:
    """Units of flow `sender` hands a flow machine now, over every commodity (`FlowNode.inn`): a context value."""
    return sum(per_peer.get(sender, 0) for per_peer in inn.values())

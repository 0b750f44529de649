"""The recovery machine's records, configuration, effects and constants (see the package docstring).

Every phase and kind the machine knows is an `enum.StrEnum`: its value is the
word that crosses the wire (`MbState.state`), a command line (`policy`) or a
log, so what leaves the machine is the same text as ever, and inside the
machine nobody compares free strings.  A microbatch is named by `Key` (data
node, seq, iteration: a `NamedTuple`, so a plain tuple of the same fields is
the same key) and a timer by `MbTimer` (its kind and the microbatch's key).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

from ..effects import CancelTimer, Send, SetTimer
from ..messages import (
    Backward, BackwardStuck, Complete, Forward, Lend, MbDeny, MbState, Probe, Recover, Release, RepairOrder, Resume,
    Room,
)
from ..phases import OpenIteration

K_DEADLINE = 3.0  # hop deadline = K x expected + margin (relay.py, "Forward pass")
K_E2E = K_DEADLINE  # watchdog = K_E2E x expected end-to-end time + margin
MARGIN_S = 2.0
EWMA_ALPHA = 0.3
MAX_ROUNDS = 6  # per microbatch and iteration: GWTF probe rounds / SWARM restarts, then defer
MAX_WAITS = 24  # per microbatch and iteration: GWTF rounds that found it computing or queued (rounds.py)


class Policy(enum.StrEnum):
    """How a node routes and recovers its microbatches."""

    GWTF = "gwtf"  # flows and repair rounds
    SWARM = "swarm"  # greedy nearest next hop with room, pipeline restarts (the baseline)
    RANDOM = "random"  # SWARM's recovery with the next hop drawn at random among the live peers with room


POLICIES = tuple(p.value for p in Policy)


class RelayPhase(enum.StrEnum):
    """Where a relay is with a microbatch: a `RelayRecord`'s phase, and what it reports (`MbState.state`).

    A record is in one of FWD .. DONE; NONE (holds nothing of that attempt)
    and REC (took a `Recover`: recomputing a stage after a crash) are only
    reported."""

    NONE = "none"
    REC = "rec"
    FWD = "fwd"  # computing the stage forward
    SENDING = "sending"  # output handed to a next hop, its Complete awaited
    SENT = "sent"  # the next hop acknowledged: the stash is kept for the backward
    BWD = "bwd"  # computing the stage backward
    GRAD = "grad"  # gradient sent upstream, its Complete awaited
    DONE = "done"  # the upstream acknowledged the gradient

    @classmethod
    def parse(cls, word: str) -> RelayPhase | None:
        """The phase a wire word names, None for a word no phase has."""
        try:
            return cls(word)
        except ValueError:
            return None


class Source(enum.StrEnum):
    """A data node's embedding side of a microbatch (`DataRecord.src`)."""

    EMB = "emb"  # computing the embedding forward
    SENDING = "sending"  # handed to a stage-0 relay, its Complete awaited
    SENT = "sent"  # the stage-0 relay acknowledged
    PARKED = "parked"  # no first hop had room: kept, launched again when a slot frees


class Sink(enum.StrEnum):
    """A data node's sink side of a microbatch (`DataRecord.sink`; None: the forward is not back yet)."""

    LOSS = "loss"  # computing head + loss + their backward
    GRAD = "grad"  # loss gradient sent to the last stage, its Complete awaited
    WAIT = "wait"  # the last stage acknowledged: waiting for the backward to come back
    FINAL = "final"  # computing the embedding-side backward


class ComputeKind(enum.StrEnum):
    """What a `Compute` runs."""

    FORWARD = "forward"  # a relay's stage forward; at a data node the embedding side
    RECOMPUTE = "recompute"  # a relay's stage forward redone from a stored activation after a crash
    BACKWARD = "backward"  # a relay's stage backward
    LOSS = "loss"  # data node, at the sink: head + loss + their backward
    FINAL = "final"  # data node: the embedding-side backward


class TimerKind(enum.StrEnum):
    """The machine's timers, one of each kind per microbatch at most."""

    FW = "fw"  # a hand-off's deadline (relay or data node), or a parked microbatch's retry
    BK = "bk"  # a gradient hand-off's deadline
    WD = "wd"  # the data node's watchdog
    PR = "pr"  # the data node's wait for probe answers


class Key(NamedTuple):
    """A microbatch: its data node, its seq and the iteration it runs in."""

    data_node: str
    seq: int
    iteration: int


@dataclass(frozen=True, slots=True, order=True)
class MbTimer:
    """A timer of the recovery machine: `SetTimer`/`CancelTimer` key, handed back to `on_timer` (ordered by kind,
    then microbatch, so a driver may sort the timers it holds)."""

    kind: TimerKind
    key: Key


SLOT_PHASES = frozenset({RelayPhase.FWD, RelayPhase.SENDING, RelayPhase.SENT, RelayPhase.BWD})  # holds activations
FWD_STATES = frozenset({RelayPhase.FWD, RelayPhase.SENDING, RelayPhase.SENT})
BWD_STATES = frozenset({RelayPhase.BWD, RelayPhase.GRAD, RelayPhase.DONE})
TIMERS = tuple(TimerKind)
MB_MESSAGES = (Forward, Backward, Complete, MbDeny, Probe, Recover, Resume, BackwardStuck, Room, Release, MbState,
               RepairOrder, Lend)


@dataclass(frozen=True, slots=True)
class Compute:
    """Run a computation (`ComputeKind`), then call `on_compute_done(now, key, kind)` (`on_compute_failed` where
    its inputs are gone)."""

    kind: ComputeKind
    key: Key


@dataclass(frozen=True, slots=True)
class IterationSettled:
    """A data node's microbatches of `iteration` are all completed or deferred: report it to the leader."""

    iteration: int
    completed: int
    deferred: int
    completed_seqs: tuple[int, ...] = ()  # the seqs of the completed ones: only their gradients count
    completed_attempts: tuple[int, ...] = ()  # the attempt that completed each (a relay counts only that one)
    completed_holders: tuple[int, ...] = ()  # per completed seq, per stage: its holder's tag (completions.py)


RecoveryEffect = Send | SetTimer | CancelTimer | Compute | OpenIteration | IterationSettled
"""Every effect `RecoveryNode` returns (`SetTimer`/`CancelTimer` keys: `MbTimer`)."""


@dataclass(frozen=True)
class RecoveryConfig:
    node_id: str
    stage: int  # -1: a data node
    last_stage: int
    capacity: int  # microbatches held at once (relays); a data node: its microbatches per iteration
    data_nodes: tuple[str, ...]
    next_peers: Mapping[str, float]  # link cost to each next-stage peer (last stage: the data nodes)
    prev_peers: Mapping[str, float]  # previous stage (stage 0: the data nodes; data node: the last stage)
    peer_capacity: Mapping[str, int] = field(default_factory=dict)
    prior_s: Mapping[str, float] = field(default_factory=dict)  # expected hand-off -> Complete time per peer
    default_prior_s: float = 10.0
    e2e_prior_s: float = 60.0  # data node: expected launch -> final backward time
    probe_wait_s: float = 3.0  # data node: how long probe answers are awaited (control messages: latency only)
    policy: Policy | str = Policy.GWTF  # (a str is read as a `Policy`; an unknown one is refused)
    swarm_assumed_capacity: int = 4  # SWARM: the memory it assumes every peer has
    act_on_gone: bool = True  # data node: `peer_gone` of a holder in the backward pass starts a round / restart
    lend: bool = False  # GWTF: a finished data node's idle units serve the others (data.py, "Lending")
    fastest_unit: bool = False  # GWTF data node: launch on the free unit that brought microbatches back first
    one_wave: bool = False  # an iteration is one wave: what finds no route is deferred (data.py, "One wave")
    # a relay: the most microbatches it holds at once, in flight or their gradients held to the step (what fits its
    # memory, model/memory.py: each microbatch its activations or its held gradients); 0: `capacity` alone, on those
    # in flight
    hold_limit: int = 0
    k: float = K_DEADLINE
    margin_s: float = MARGIN_S
    max_rounds: int = MAX_ROUNDS
    max_waits: int = MAX_WAITS


@dataclass
class RecoveryStats:
    reroutes: int = 0
    denies_sent: int = 0
    deferred: int = 0
    probes: int = 0  # GWTF probe rounds
    recovers: int = 0  # stage forwards recomputed from a stash (Recover sent)
    resends: int = 0  # gradients resent (Resume)
    restarts: int = 0  # SWARM: whole-pipeline restarts
    gave_up: int = 0  # attempts given up after MAX_ROUNDS (deferred)
    lent: int = 0  # data node: units lent to other data nodes (Lend)
    borrowed: int = 0  # data node: units lent to me
    presumed_dead: int = 0
    stale: int = 0  # messages of an older attempt, ignored
    uncounted: int = 0  # relay: gradients held at BEGIN whose microbatch its data node did not complete

    def bump(self, **counts: int) -> None:
        """Add to the named counters (the machine's modules count through this)."""
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)


def cancel_timers(key: Key, eff: list[RecoveryEffect]) -> None:
    """Cancel every timer of microbatch `key`."""
    for t in TIMERS:
        eff.append(CancelTimer(MbTimer(t, key)))


def ewma(table: dict[str, float], k: str, sample: float) -> None:
    e = table.get(k)
    table[k] = sample if e is None else (1 - EWMA_ALPHA) * e + EWMA_ALPHA * sample

"""The recovery machine's records, configuration, effects and constants (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..messages import (
    Backward, BackwardStuck, Complete, Forward, Lend, MbDeny, MbState, Probe, Recover, Release, RepairOrder, Resume,
    Room,
)

K_DEADLINE = 3.0  # hop deadline = K x expected + margin (relay.py, "Forward pass")
K_E2E = K_DEADLINE  # watchdog = K_E2E x expected end-to-end time + margin
MARGIN_S = 2.0
EWMA_ALPHA = 0.3
# gwtf: flows and repair rounds; swarm: greedy nearest next hop with room, pipeline restarts (the baseline);
# random: SWARM's recovery with the next hop drawn at random among the live peers with room (blind routing)
POLICIES = ("gwtf", "swarm", "random")
MAX_ROUNDS = 6  # per microbatch and iteration: GWTF probe rounds / SWARM restarts, then defer

Key = tuple  # (data_node, seq, iteration)
SLOT_PHASES = ("fwd", "sending", "sent", "bwd")  # a relay holds activations: it uses a slot
FWD_STATES = ("fwd", "sending", "sent")
BWD_STATES = ("bwd", "grad", "done")
TIMERS = ("fw", "bk", "wd", "pr")
MB_MESSAGES = (Forward, Backward, Complete, MbDeny, Probe, Recover, Resume, BackwardStuck, Room, Release, MbState,
               RepairOrder, Lend)


@dataclass(frozen=True, slots=True)
class Compute:
    """Run a computation, then call `on_compute_done(now, key, kind)`.

    kind: "forward" (a relay's stage forward; at a data node the embedding
    side), "recompute" (a relay's stage forward redone from a stored
    activation after a crash), "backward" (a relay's stage backward), "loss"
    (data node, at the sink: head + loss + their backward), "final" (data
    node: the embedding-side backward).
    """

    kind: str
    key: tuple


@dataclass(frozen=True, slots=True)
class IterationSettled:
    """A data node's microbatches of `iteration` are all completed or deferred: report it to the leader."""

    iteration: int
    completed: int
    deferred: int
    completed_seqs: tuple[int, ...] = ()  # the seqs of the completed ones: only their gradients count


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
    policy: str = "gwtf"
    swarm_assumed_capacity: int = 4  # SWARM: the memory it assumes every peer has
    act_on_gone: bool = True  # data node: `peer_gone` of a holder in the backward pass starts a round / restart
    lend: bool = False  # GWTF: a finished data node's idle units serve the others (data.py, "Lending")
    fastest_unit: bool = False  # GWTF data node: launch on the free unit that brought microbatches back first
    one_wave: bool = False  # an iteration is one wave: what finds no route is deferred (data.py, "One wave")
    k: float = K_DEADLINE
    margin_s: float = MARGIN_S
    max_rounds: int = MAX_ROUNDS


@dataclass
class RelayRecord:
    """A relay's record of one microbatch (one attempt)."""

    key: Key
    attempt: int
    prev: str
    path: tuple[str, ...]  # the path up to me, me included
    phase: str = "fwd"  # fwd | sending | sent | bwd | grad | done
    next: str | None = None
    rest: tuple[str, ...] = ()  # recovery chain: the stages after me ("" = replace, else resume there)
    tried: set = field(default_factory=set)
    sent_at: float = 0.0
    ordered: bool = False  # executing a RepairOrder: my stash is the original forward's, keep it on failure
    parked: bool = False  # no next hop with room: output (and any repair order) kept, retried (relay.py)


@dataclass
class DataRecord:
    """A data node's record of one of its microbatches in flight."""

    key: Key
    attempt: int = 0
    src: str = "emb"  # the embedding side: emb (computing) | sending | sent
    next: str | None = None  # the stage-0 relay my stash went to
    rest: tuple[str, ...] = ()
    tried: set = field(default_factory=set)
    sent_at: float = 0.0
    sink: str | None = None  # None (forward not back yet) | loss | grad | wait | final
    path: list = field(default_factory=list)  # stage -> holder (None: unknown)
    holders: set = field(default_factory=set)  # every node that reported taking this attempt
    launched_at: float = 0.0
    rounds: int = 0
    collecting: bool = False
    snapshot: dict = field(default_factory=dict)
    final_from: str | None = None  # the stage-0 relay the last backward came from
    parked: bool = False  # a recovery found every live stage-0 relay full: retried when a slot frees
    bwd_done: set = field(default_factory=set)  # stages whose holder reported its backward computed (MbState grad)


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


def ewma(table: dict, k: str, sample: float) -> None:
    e = table.get(k)
    table[k] = sample if e is None else (1 - EWMA_ALPHA) * e + EWMA_ALPHA * sample


def timer_suffix(key: Key) -> str:
    """The part of a timer key that names the microbatch: `fw:<timer_suffix>` etc."""
    return f"{key[0]}|{key[1]}|{key[2]}"


def parse_timer_suffix(s: str) -> Key:
    """The microbatch key a timer key names (the inverse of `timer_suffix`)."""
    d, seq, it = s.rsplit("|", 2)
    return (d, int(seq), int(it))

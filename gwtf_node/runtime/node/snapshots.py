"""What each component of the node shows the status of itself: plain data, built fresh on each call.

Theory of operation: the status (status.py) reads no component's fields.
Each component it reports on hands out a snapshot of itself through one
method, `status()`, which returns one of the frozen dataclasses below,
built from copies (a dict of the component's is copied, a record is
reduced to the numbers the status shows), so the status never holds, and
cannot change, what a component owns, and a component may reorganize its
fields as long as its snapshot keeps its meaning.  Time-dependent figures
(a lease's remaining seconds, the seconds a relay has waited) are left to
the status: a snapshot carries the instants they are measured from.
tests/runtime/test_status_reads.py checks, on status.py's source, that the
status reads these components through `status()` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageStatus:
    """This node's part of the model (stage.py): the compute and steps it did."""

    device: str
    compute_s: float  # inside stage forward/backward/embed/head
    compute_calls: int
    compute_ms: float  # per microbatch (`LocalStage.compute_ms`)
    applied_steps: int
    work_s: dict[str, float]  # piece of work -> the seconds it took last
    compute_cpu_s: float = 0.0  # the worker thread's CPU time inside the compute
    work_cpu_s: dict[str, float] = field(default_factory=dict)  # piece of work -> its CPU time, all calls
    aggregation_cpu_s: float = 0.0  # the process's CPU time in its aggregations (all threads)
    hold_limit: int = 0  # a relay: the microbatches that fit its device, in flight or held (0: not built yet)


@dataclass(frozen=True)
class LinkReading:
    """The smoothed measurement of one link (linkmeter.py `LinkSample`)."""

    rtt_ms: float
    bandwidth_mbps: float | None  # None: the probe was not answered
    peer_compute_ms: float


@dataclass(frozen=True)
class FlowsStatus:
    """The flows through this node and its links (flows.py)."""

    out: dict[str, dict[str, int]]  # data node -> next hop -> units
    units_in: dict[str, dict[str, int]]  # data node -> previous hop -> units
    units_through: int
    prev_costs: dict[str, float]  # the links of the flows now, per side
    next_costs: dict[str, float]
    link_costs: dict[str, dict[str, float]]  # the last cost of every link, per side (peers gone stay)
    links_recosted: int
    link_measurements: dict[str, dict]  # status.json's form (linkmeter.py)
    samples: dict[str, LinkReading]  # the measured (next-stage) links
    links: dict[tuple[str, str], tuple[float, float]]  # emulated links (--links): (name, name) -> (ms, Mbit/s)
    machine: dict = field(default_factory=dict)  # what the flow machine waits for (`FlowNode.progress`), per data node


@dataclass(frozen=True)
class LivenessStatus:
    """Who this node hears and who it presumes dead (liveness.py)."""

    presumed_dead: frozenset[str]
    recently_heard: frozenset[str]
    deadlines_s: dict[str, float]  # each watched peer's deadline of silence
    waiting_for_data_since: float | None  # a relay with no live data node: since then (trio clock)
    event_loop: dict  # how late the event loop ran (looplag.py)


@dataclass(frozen=True)
class AggregationStatus:
    """The aggregation phase and the last step (aggregation.py)."""

    aggregating: bool
    last_iteration: int | None  # the last iteration whose step this node applied
    parts: dict[str, float]  # the last step's pieces, seconds
    last_all_reduce: dict | None  # its time, tensor work, MB sent (allreduce.py)
    lost_contributions: dict[int, int]  # iteration -> contributions that did not reach the step


@dataclass(frozen=True)
class MicrobatchesStatus:
    """The microbatches of this node (microbatches.py): a data node's iteration in flight and what they came to."""

    started: bool
    in_flight: int | None  # a data node's iteration in flight
    in_flight_s: float | None  # since it opened
    ledger: dict[str, int] | None  # its ledger's counts
    settled: bool  # its microbatches are all settled (reported)
    paused: dict | None  # a data node holding its next iteration back while a stage is empty
    counters: dict  # status.json's counters (`Microbatches.status_counters`)
    recovery: dict  # the recovery machine's counters
    holding: dict[str, int]  # what a relay holds, by phase
    tally: dict  # what they came to since start (tally.py), for the dashboard
    last_loss: float | None
    last_loss_iteration: int | None
    losses: dict[int, float]  # recent mean losses by iteration


@dataclass(frozen=True)
class ElectionStatus:
    """A data node's (or witness's) election machine, as the dashboard shows it."""

    role: str
    voter: bool
    witness: bool
    voted_for: str | None
    quorum: int
    voters: tuple[str, ...]  # sorted
    leads: bool  # it holds the lease now
    lease_end: float  # its lease (when it leads)
    promised_to: str | None
    promise_until: float  # its promise to the leader it follows


@dataclass(frozen=True)
class LeadershipStatus:
    """Who leads and this node's part in it (leadership.py)."""

    leader: str | None
    term: int | None
    is_leader: bool
    voters: dict  # status.json's voter set (`Leadership.voters`)
    known_at: float | None  # a relay: when it last heard who leads
    election: ElectionStatus | None  # None: a relay, or a data node before its election starts
    placing: bool  # this node places joiners (the acting leader)
    reports: dict[str, tuple[int, int]]  # the placement's last reports: member -> (flows, capacity)
    members: frozenset[str]  # the members they are of

"""Messages of joining at the bottleneck (membership.py, section V-B), re-exported by messages.py.

On the wire each one is the protobuf message of the same name in
`protos/gwtf.proto` (codec.py finds them through messages.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """A candidate asks the leader for a stage."""

    capacity: int  # microbatches it can hold at a time
    stage_costs: tuple[float, ...]  # measured cost to each relay stage, +inf: cannot serve it
    link_costs: tuple[tuple[str, float], ...] = ()  # Eq. 1 cost of its link to each peer it measured


@dataclass(frozen=True, slots=True)
class UtilizationQuery:
    """The leader's periodic utilization flood (one round)."""

    query_id: int
    term: int = 0  # the sender's leader term: a relay learns who leads, and in which term


@dataclass(frozen=True, slots=True)
class UtilizationReport:
    query_id: int
    stage: int
    flows: int  # units of flow through the reporter
    capacity: int
    serving: bool  # False while the reporter is still joining (downloading its stage's state)
    link_costs: tuple[tuple[str, float], ...] = ()  # Eq. 1 cost of its links to its flow neighbours


@dataclass(frozen=True, slots=True)
class Assignment:
    """The leader of `term` places `node` in `stage`; sent to the node and to its state source."""

    term: int
    node: str
    stage: int
    download_from: str  # a live stage member that is not joining itself
    start_iteration: int  # the newcomer serves from this iteration on

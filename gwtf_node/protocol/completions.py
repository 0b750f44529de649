"""Which gradients count in an aggregation: the completed microbatches BEGIN AGGREGATION names, and by whom.

A data node reports each iteration's completed seqs (`IterationDone`) and,
for each, the attempt that completed it and the holder of every stage on the
path that completed it (`holder_tag` of its peer id, 0 where the data node
does not know it).  The leader passes them on in BEGIN (`completed_seqs`),
and a relay counts a gradient it holds only if BEGIN names its microbatch,
that attempt, and this relay as its stage's holder (`counts`).

Why both.  A gradient can outlive the route it was computed on: the data
node restarts or parks a microbatch (a new attempt) through other holders,
or repairs its path (the same attempt) around a holder it presumed dead,
and the `Release` that would void the old holder's gradient is lost (a
connection reset under load), or the old holder was alive all along.  Named
by seq alone, the stage would sum that microbatch twice.  A tag is the
first 4 bytes of the sha256 of the peer id (0 is kept for "unknown"): two
relays of one stage holding the same microbatch and sharing a tag is a 2^-32
accident.  What a report does not name (no attempts, no tags: an older data
node; a stage whose holder it never heard of) counts whoever holds it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Collection, Mapping

from .messages import BeginAggregation, CompletedSeqs, IterationDone


def holder_tag(peer: str | None) -> int:
    """The 32-bit tag of a holder's peer id (0: unknown)."""
    if not peer:
        return 0
    return int.from_bytes(hashlib.sha256(peer.encode()).digest()[:4], "big") or 1


@dataclass(frozen=True, slots=True)
class Completion:
    """How one completed microbatch counts: the attempt that completed it (None: any) and its holder's tag per
    stage (empty, or 0 at a stage: any holder there)."""

    attempt: int | None = None
    holders: tuple[int, ...] = ()


def _per_seq(values: tuple, seqs: tuple) -> list[tuple] | None:
    """`values` cut into one equal run per seq (None: empty, or not a whole number of runs)."""
    if not values or not seqs or len(values) % len(seqs):
        return None
    n = len(values) // len(seqs)
    return [tuple(values[i * n:(i + 1) * n]) for i in range(len(seqs))]


def completed_seqs(data_node: str, report: IterationDone) -> CompletedSeqs:
    """A data node's report as BEGIN names it: its completed seqs in order, with the attempts and holders its
    report names."""
    seqs = report.completed_seqs
    attempts = report.completed_attempts if len(report.completed_attempts) == len(seqs) else None
    holders = _per_seq(report.completed_holders, seqs)
    order = sorted({s: i for i, s in enumerate(seqs)}.items())  # (a seq named twice: its last entry)
    return CompletedSeqs(data_node, tuple(s for s, _ in order),
                         tuple(attempts[i] for _, i in order) if attempts is not None else (),
                         tuple(h for _, i in order for h in holders[i]) if holders is not None else ())


def completed_named(begin: BeginAggregation) -> dict[str, dict[int, Completion]] | None:
    """The contributions BEGIN names: per data node, seq -> its `Completion`; None when BEGIN names none (count
    every contribution held)."""
    if not begin.completed:
        return None
    out: dict[str, dict[int, Completion]] = {}
    for c in begin.completed:
        attempts = c.attempts if len(c.attempts) == len(c.seqs) else (None,) * len(c.seqs)
        holders = _per_seq(c.holders, c.seqs) or [()] * len(c.seqs)
        out[c.data_node] = {s: Completion(a, h) for s, a, h in zip(c.seqs, attempts, holders)}
    return out


def counts(completed: Mapping[str, Collection[int]], data_node: str, seq: int, stage: int, me: str,
           attempt: int | None) -> bool:
    """A gradient of `data_node`'s `seq` held at `stage` by `me`, computed in `attempt`, counts: BEGIN names the
    microbatch (`completed`: per data node its seqs, or seq -> `Completion`), and where it names the attempt and
    this stage's holder, they are this gradient's."""
    seqs = completed.get(data_node, ())
    if seq not in seqs:
        return False
    c = seqs.get(seq) if isinstance(seqs, Mapping) else None
    if c is None:
        return True
    if c.attempt is not None and c.attempt != attempt:
        return False
    tag = c.holders[stage] if 0 <= stage < len(c.holders) else 0
    return tag == 0 or tag == holder_tag(me)

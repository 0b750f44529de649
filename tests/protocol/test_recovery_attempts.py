"""A microbatch restarted through other holders counts once at every stage (protocol/recovery/, phases.py).

One data node `d`, one stage of two relays `a0`, `a1` (SWARM's restarts).
The gradient `a0` sends back to `d` is lost, and so is the `Release` of that
attempt: `d` restarts the microbatch as attempt 1, `a0` is no longer among
its neighbours (it looked gone), and `a1` completes it.  Both relays now hold
a gradient of the microbatch.  `d`'s report names the seq and the attempt
that completed it, and BEGIN AGGREGATION passes both on: only `a1` counts it.
Named by seq alone, the stage would sum the microbatch twice.
"""

from __future__ import annotations

import random

from gwtf_node.protocol.effects import CancelTimer, Send, SetTimer
from gwtf_node.protocol.messages import Backward, BeginAggregation, CompletedSeqs, IterationDone, Release
from gwtf_node.protocol.phases import completed_named
from gwtf_node.protocol.recovery import Compute, IterationSettled, RecoveryConfig, RecoveryNode

PEERS = {"a0": 1.0, "a1": 2.0}


def _config(nid: str) -> RecoveryConfig:
    common = dict(default_prior_s=1.0, e2e_prior_s=2.0, probe_wait_s=1.0, policy="swarm", swarm_assumed_capacity=1,
                  max_rounds=3, data_nodes=("d",), last_stage=0, capacity=1)
    if nid == "d":
        return RecoveryConfig(node_id="d", stage=-1, next_peers=PEERS, prev_peers=PEERS,
                              peer_capacity={"a0": 1, "a1": 1}, **common)
    return RecoveryConfig(node_id=nid, stage=0, next_peers={"d": 1.0}, prev_peers={"d": 1.0}, peer_capacity={},
                          **common)


def _restarted_elsewhere() -> tuple[dict[str, RecoveryNode], IterationSettled]:
    """Run iteration 0 of one microbatch until `d` settles it, losing a0's gradient and the Release to a0."""
    nodes = {n: RecoveryNode(_config(n), random.Random(0)) for n in ("d", "a0", "a1")}
    nodes["d"].set_flows({"d": {"a0": 1}})
    queue: list = []
    timers: dict = {}
    settled: list[IterationSettled] = []
    now = 0.0

    def apply(nid: str, effects: list) -> None:
        for e in effects:
            if isinstance(e, Send):
                msg = e.msg
                if (nid, e.to, type(msg)) == ("a0", "d", Backward) and msg.attempt == 0:
                    # lost; and d no longer counts a0 among its neighbours (it looked gone)
                    apply("d", nodes["d"].set_neighbours(now, {"a1": 2.0}, {"a1": 2.0}, {"a1": 1}, prior_s=1.0))
                elif not ((e.to, type(msg)) == ("a0", Release) and msg.attempt == 0):
                    queue.append((nid, e.to, msg))
            elif isinstance(e, SetTimer):
                timers[(nid, e.key)] = e.deadline
            elif isinstance(e, CancelTimer):
                timers.pop((nid, e.key), None)
            elif isinstance(e, Compute):
                queue.append((nid, nid, e))
            elif isinstance(e, IterationSettled):
                settled.append(e)

    apply("d", nodes["d"].start(0.0))
    for _ in range(1000):
        if settled:
            break
        if queue:
            src, to, msg = queue.pop(0)
            now += 0.01
            apply(to, nodes[to].on_compute_done(now, msg.key, msg.kind) if isinstance(msg, Compute)
                  else nodes[to].on_message(now, src, msg))
        elif timers:
            (nid, key), deadline = min(timers.items(), key=lambda kv: kv[1])
            del timers[(nid, key)]
            now = max(now, deadline)
            apply(nid, nodes[nid].on_timer(now, key))
    assert settled, "the iteration never settled"
    return nodes, settled[0]


def test_a_restarted_microbatch_counts_once_at_its_stage() -> None:
    nodes, done = _restarted_elsewhere()
    assert (done.completed_seqs, done.completed_attempts) == ((0,), (1,))
    key = ("d", 0, 0)
    assert nodes["a0"].relay.attempt_of[key] == 0 and nodes["a1"].relay.attempt_of[key] == 1  # both hold one
    begin = BeginAggregation(0, 1, completed=(CompletedSeqs("d", done.completed_seqs, done.completed_attempts),))
    counted = {r: nodes[r].begin_aggregation(1.0e3, 0, completed_named(begin))[1] for r in ("a0", "a1")}
    assert counted == {"a0": frozenset(), "a1": frozenset({key})}


def test_named_by_seq_alone_both_holders_would_count_it() -> None:
    """The same run with a BEGIN that names seqs only (a leader whose data nodes report no attempts): both
    relays count the microbatch (why BEGIN names the attempt)."""
    nodes, done = _restarted_elsewhere()
    report = IterationDone(0, 1, 0.0, completed_seqs=done.completed_seqs)
    begin = BeginAggregation(0, 1, completed=(CompletedSeqs("d", report.completed_seqs),))
    counted = [nodes[r].begin_aggregation(1.0e3, 0, completed_named(begin))[1] for r in ("a0", "a1")]
    assert counted == [frozenset({("d", 0, 0)})] * 2

"""Microbatches queued at a live relay are waited for, not given up (protocol/recovery/rounds.py, "Bounded rounds").

One data node `d` and one stage of one relay `a0` (GWTF), `n` microbatches
in the iteration, all handed to `a0` at once; `a0` computes one at a time,
`compute_s` each, forward and backward, as a relay with hundreds of
microbatches queued does.  The hop deadlines grow with the hand-offs still
waiting (relay.py), but the data node's watchdog (3 x its end-to-end
estimate + 2 s) fires many times for the microbatches at the back of the
queue, and each round's probe finds them at `a0` (FWD): such a round
repairs nothing and is a wait, not one of `max_rounds`.  A relay that holds
a microbatch's backward and never computes it is given up after `max_waits`
waits; one whose backward cannot run (its stash gone: a stage state loaded
over it) forgets the microbatch, and the data node's next round repairs it;
a data node whose own computation of a microbatch cannot run defers it.  A
relay whose capacity counts the gradients it holds to the step carries no
more than its capacity in an iteration.
"""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from gwtf_node.protocol.effects import CancelTimer, Send, SetTimer
from gwtf_node.protocol.recovery import Compute, IterationSettled, Key, RecoveryConfig, RecoveryNode


def _config(nid: str, n: int, relays: tuple[str, ...] = ("a0",), cap: int | None = None,
            hold_limit: int = 0) -> RecoveryConfig:
    common = dict(default_prior_s=1.0, e2e_prior_s=2.0, probe_wait_s=1.0, policy="gwtf", max_rounds=3,
                  data_nodes=("d",), last_stage=0)
    if nid == "d":
        return RecoveryConfig(node_id="d", stage=-1, next_peers=dict.fromkeys(relays, 1.0), capacity=n,
                              prev_peers=dict.fromkeys(relays, 1.0), peer_capacity=dict.fromkeys(relays, cap or n),
                              **common)
    return RecoveryConfig(node_id=nid, stage=0, next_peers={"d": 1.0}, prev_peers={"d": 1.0}, peer_capacity={},
                          capacity=cap or n, hold_limit=hold_limit, **common)


def _run(n: int, compute_s: float, never: int | None = None, fail: tuple[str, str, int] | None = None,
         relays: tuple[str, ...] = ("a0",), cap: int | None = None,
         hold_limit: int = 0) -> tuple[RecoveryNode, IterationSettled, float]:
    """Iteration 0 of `n` microbatches through the relays (a second one, a1, computes at once), a0 computing
    one at a time (`compute_s` each); a0 never computes the backward of seq `never`, and `fail` = (node, kind,
    seq): that node cannot run the first computation of that kind for that seq (the driver's
    `on_compute_failed`); each relay's capacity `cap` (default `n`) and `hold_limit`; (d, its settlement, the time
    it settled)."""
    nodes = {nid: RecoveryNode(_config(nid, n, relays, cap, hold_limit), random.Random(0))
             for nid in ("d", *relays)}
    nodes["d"].set_flows({"d": {r: min(cap or n, n // len(relays)) for r in relays}})
    events: list = []  # (time, order, kind, payload)
    order = itertools.count()
    timers: dict = {}
    settled: list = []
    busy_until = 0.0  # a0's computations, one after the other
    failed = set()

    def apply(nid: str, now: float, effects: list) -> None:
        nonlocal busy_until
        for e in effects:
            if isinstance(e, Send):
                heapq.heappush(events, (now + 0.01, next(order), "msg", (nid, e.to, e.msg)))
            elif isinstance(e, SetTimer):
                timers[(nid, e.key)] = e.deadline
                heapq.heappush(events, (e.deadline, next(order), "timer", (nid, e.key, e.deadline)))
            elif isinstance(e, CancelTimer):
                timers.pop((nid, e.key), None)
            elif isinstance(e, Compute):
                if nid == "a0":
                    if e.key.seq == never and e.kind.name == "BACKWARD":
                        continue
                    busy_until = max(busy_until, now) + compute_s
                    heapq.heappush(events, (busy_until, next(order), "compute", (nid, e)))
                else:
                    heapq.heappush(events, (now + 0.01, next(order), "compute", (nid, e)))
            elif isinstance(e, IterationSettled):
                settled.append(e)

    apply("d", 0.0, nodes["d"].start(0.0))
    while events and not settled:
        now, _, kind, payload = heapq.heappop(events)
        if now > 1e6:
            break
        if kind == "msg":
            src, to, msg = payload
            apply(to, now, nodes[to].on_message(now, src, msg))
        elif kind == "compute":
            nid, c = payload
            if fail is not None and (nid, c.kind.name, c.key.seq) == fail and fail not in failed:
                failed.add(fail)
                apply(nid, now, nodes[nid].on_compute_failed(now, c.key, c.kind))
            else:
                apply(nid, now, nodes[nid].on_compute_done(now, c.key, c.kind))
        elif timers.get(payload[:2]) == payload[2]:  # a timer still armed with this deadline
            nid, key, _ = payload
            del timers[(nid, key)]
            apply(nid, now, nodes[nid].on_timer(now, key))
    assert settled, "the iteration never settled"
    return nodes["d"], settled[0], now


@pytest.mark.parametrize("n", [4, 40])
def test_microbatches_queued_at_a_live_relay_all_complete(n: int) -> None:
    d, done, _ = _run(n, compute_s=1.0)
    assert done.completed_seqs == tuple(range(n)) and done.deferred == 0
    assert d.stats.gave_up == 0 and d.stats.reroutes == 0 and d.stats.recovers == 0
    if n == 40:  # the back of the queue waited ~80 s against a watchdog of a few seconds: probed, waited for
        assert d.stats.probes > 3 * 3


def test_a_relay_that_never_computes_one_is_given_up_after_the_waits() -> None:
    d, done, _ = _run(4, compute_s=1.0, never=2)
    assert done.completed_seqs == (0, 1, 3) and done.deferred == 1
    assert d.stats.gave_up == 1 and d.stats.probes == d.cfg.max_waits + 1  # 24 waits, the 25th round gives up


def test_a_backward_that_cannot_run_is_repaired_at_the_next_round() -> None:
    relays = ("a0", "a1")
    d, done, at = _run(4, compute_s=1.0, fail=("a0", "BACKWARD", 0), relays=relays)
    assert done.completed_seqs == (0, 1, 2, 3) and done.deferred == 0
    # one round found it gone at a0 (NONE): recomputed through the other relay
    assert d.stats.gave_up == 0 and d.stats.probes == 1 and d.stats.recovers == 1, d.stats
    _, ref, ref_at = _run(4, compute_s=1.0, relays=relays)
    assert ref.deferred == 0 and at < ref_at + 3 * 2.0 + 2.0 + 4.0, (at, ref_at)  # a watchdog later, not minutes


@pytest.mark.parametrize("kind", ["FORWARD", "LOSS", "FINAL"])
def test_a_data_nodes_computation_that_cannot_run_defers_the_microbatch(kind: str) -> None:
    d, done, _ = _run(4, compute_s=1.0, fail=("d", kind, 1), relays=("a0", "a1"))
    assert done.completed_seqs == (0, 2, 3) and done.deferred == 1
    assert d.stats.gave_up == 1 and d.stats.probes == 0, d.stats


@pytest.mark.parametrize("hold_limit", [0, 1])
def test_held_gradients_take_a_relays_room_where_its_capacity_is_its_memorys(hold_limit: int) -> None:
    """A relay of capacity 1 holds the gradients of every microbatch it carried to the step: with a `hold_limit`
    of 1 (its capacity is what fits its memory, each microbatch its activations or its gradients) it carries 1
    an iteration and the rest are deferred; without, a unit freed is filled again."""
    d, done, _ = _run(6, compute_s=0.1, relays=("a0", "a1"), cap=1, hold_limit=hold_limit)
    if hold_limit:
        assert len(done.completed_seqs) == 2 and done.deferred == 4, done
    else:
        assert done.completed_seqs == tuple(range(6)) and done.deferred == 0, done


@pytest.mark.parametrize("hold_limit, carried", [(0, 12), (3, 3), (5, 5), (20, 12)])
def test_a_hold_limit_bounds_what_a_relay_carries_in_an_iteration_beside_its_capacity_in_flight(
        hold_limit: int, carried: int) -> None:
    """A relay given `--capacity 2` and memory for `hold_limit` microbatches: at most 2 in flight at once, and
    no more than `hold_limit` carried in the iteration (in flight, or their gradients held to the step); what it
    cannot take goes through the other relay or is deferred."""
    d, done, _ = _run(12, compute_s=0.1, relays=("a0",), cap=2, hold_limit=hold_limit)
    assert len(done.completed_seqs) == carried and done.deferred == 12 - carried, done


def test_held_gradients_of_an_iteration_never_aggregated_leave_with_a_later_step() -> None:
    """A relay that held gradients of iteration 3 and took a downloaded state instead of aggregating it: its
    step of iteration 5 drops them, as the part's step drops its held gradients, and their room is free again."""
    a0 = RecoveryNode(_config("a0", 2, cap=2, hold_limit=2), random.Random(0))
    a0.relay.contribute(Key("d", 6, 3), 0)
    a0.relay.contribute(Key("d", 10, 5), 0)
    assert a0.routing.held(a0) == 2 and a0.routing.room_left(a0) == 0
    a0.aggregation_done(0.0, 5)
    assert a0.contrib == {} and a0.routing.held(a0) == 0 and a0.routing.room_left(a0) == 2

"""Recovery machines over a faulty wire: the ledger invariant under any schedule (a Hypothesis state machine).

Several `RecoveryNode`s (one or two data nodes, two stages of two relays) are
driven the way the daemon drives them: a data node's settled iteration is
reported by an `IterationSettled` effect, and the aggregation phase is run by
the driver
(`begin_aggregation` on the relays, `aggregation_done` everywhere, then
`open_iteration` of the next iteration on the data nodes).  Every `Send` goes
through the real wire codec (`codec.encode` at the sender, `codec.decode` at
the receiver; the machines send no tensors).

Hypothesis chooses the schedule: deliver the oldest frame, lose one, duplicate
one, swap two (reordering), fire the earliest timer (virtual time jumps to its
deadline), let time pass, finish a pending computation, run a calm spell
(frames and computations in order, no timer) or a calm period until the
iteration settles (timers too), crash a relay (every
other node hears `peer_gone` after `DETECT_S`), and run the aggregation phase
when every data node reported its iteration.

After every step the ledger invariant holds at every data node: each of its
microbatches is COMPLETED, DEFERRED (and pushed again when the next iteration
opens), or still counted (PENDING while waiting, INFLIGHT with a record at its
data node); no microbatch is completed twice, none is lost.  At teardown the
wire stops failing: every frame is delivered, computations finish and timers
fire until nothing is left to happen (bounded: timers that keep re-arming
fail it), and then every microbatch of the open iteration is COMPLETED or
DEFERRED.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gwtf_node.protocol import codec
from gwtf_node.protocol.completions import completed_named, completed_seqs
from gwtf_node.protocol.effects import CancelTimer, Send, SetTimer
from gwtf_node.protocol.messages import BeginAggregation, CanTake, IterationDone
from gwtf_node.protocol.pipeline import MbStatus, OpenIteration
from gwtf_node.protocol.recovery import Compute, IterationSettled, RecoveryConfig, RecoveryNode

STAGES = (("a0", "a1"), ("b0", "b1"))  # relays of stage 0 and stage 1
RELAYS = tuple(r for stage in STAGES for r in stage)
ALL_DATA_NODES = ("d0", "d1")
RELAY_CAPACITY = 2
MICROBATCHES_PER_ITERATION = 3  # more than the units of flow of one data node: it pushes in waves
ITERATIONS = 3  # the driver opens no iteration after this many
MAX_CRASHES = 2
MAX_ROUNDS = 2  # rounds / restarts before a data node gives an attempt up: low, so that giving up happens often
DETECT_S = 7.0  # crash -> `peer_gone` at every other node (the daemon's membership detection time)
CALM_AFTER_STEPS = 15  # an iteration sees this many steps of faults before a calm period may settle it
DRAIN_STEPS = 20_000  # teardown: events at most until the open iteration settles
PHASE_SIGNALS = (IterationDone, BeginAggregation, CanTake)  # the driver's business (pipeline.Phases in the daemon)


def _cost(a: str, b: str) -> float:
    """A fixed, asymmetric link cost, so that routing choices are not all ties."""
    return 1.0 + (sum(map(ord, a + b)) % 5) / 2


def _flows(data_nodes: tuple[str, ...]) -> dict[str, dict[str, dict[str, int]]]:
    """Units of flow per node: data node -> next hop -> units (what the flow machines would form)."""
    a0, a1 = STAGES[0]
    b0, b1 = STAGES[1]
    out: dict[str, dict[str, dict[str, int]]] = {d: {d: {a0: 1, a1: 1}} for d in data_nodes}
    crossed = {a0: (b0, b1), a1: (b1, b0)}  # data node i goes a0 -> b_i and a1 -> b_(1-i)
    for a, hops in crossed.items():
        out[a] = {d: {hops[i]: 1} for i, d in enumerate(data_nodes)}
    for b in STAGES[1]:
        out[b] = {d: {d: 1} for d in data_nodes}
    return out


def _config(nid: str, data_nodes: tuple[str, ...], policy: str, lend: bool, one_wave: bool,
            act_on_gone: bool) -> RecoveryConfig:
    last = len(STAGES) - 1
    if nid in data_nodes:
        stage, nxt, prv, cap = -1, STAGES[0], STAGES[last], MICROBATCHES_PER_ITERATION
    else:
        stage = next(s for s, names in enumerate(STAGES) if nid in names)
        nxt = data_nodes if stage == last else STAGES[stage + 1]
        prv = data_nodes if stage == 0 else STAGES[stage - 1]
        cap = RELAY_CAPACITY
    return RecoveryConfig(
        node_id=nid, stage=stage, last_stage=last, capacity=cap, data_nodes=data_nodes,
        next_peers={j: _cost(nid, j) for j in nxt}, prev_peers={j: _cost(nid, j) for j in prv},
        peer_capacity={j: RELAY_CAPACITY for j in RELAYS}, default_prior_s=1.0, e2e_prior_s=2.0,
        probe_wait_s=1.0, policy=policy, swarm_assumed_capacity=RELAY_CAPACITY, act_on_gone=act_on_gone,
        lend=lend and policy == "gwtf", fastest_unit=True, one_wave=one_wave, max_rounds=MAX_ROUNDS)


class RecoveryWire(RuleBasedStateMachine):
    """Recovery machines, a wire that loses, duplicates and reorders frames, timers, computations, crashes."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.nodes: dict[str, RecoveryNode] = {}
        self.data_nodes: tuple[str, ...] = ()
        self.dead: set[str] = set()
        self.wire: list[tuple[str, str, bytes]] = []  # (from, to, frame), oldest first
        self.timers: dict[tuple[str, str], float] = {}  # (node, key) -> deadline
        self.gone_at: dict[str, float] = {}  # crashed relay -> when the others hear of it
        self.computing: list[tuple[str, Compute]] = []
        self.reported: dict[str, set[int]] = {}  # data node -> iterations it reported settled
        # (data node, iteration) -> its report's seqs, each with the attempt and holders that completed it, as
        # BEGIN names them (protocol/completions.py: a relay counts only that attempt's gradient, at its holder)
        self.completed_seqs: dict[tuple[str, int], dict] = {}
        self.iteration = 0  # the iteration the driver opened last
        self.aggregating = False  # BEGIN AGGREGATION of `iteration` reached the relays, the steps are not applied
        self.finished = False  # the last iteration is aggregated: nothing more to open
        self.issued: dict[str, set[int]] = {}  # data node -> every seq its ledger ever held
        self.clean = True  # no step raised: the teardown drain is meaningful
        self.steps_in_iteration = 0  # steps since the open iteration opened

    # ---- the driver --------------------------------------------------------------------------------------------
    @contextmanager
    def _step(self):
        self.clean = False
        self.steps_in_iteration += 1
        yield
        self.clean = True

    def _apply(self, nid: str, effects: list) -> None:
        for e in effects:
            if type(e) is Send:
                if type(e.msg) in PHASE_SIGNALS:
                    raise AssertionError(f"{nid} sends a phase signal of its own: {e!r}")
                else:
                    assert e.to in self.nodes, f"{nid} sends {e.msg!r} to unknown peer {e.to!r}"
                    self.wire.append((nid, e.to, codec.encode(nid, e.msg)))
            elif type(e) is SetTimer:
                self.timers[(nid, e.key)] = e.deadline
            elif type(e) is CancelTimer:
                self.timers.pop((nid, e.key), None)
            elif type(e) is IterationSettled:  # the driver reports it to the leader (phases.Phases)
                assert nid in self.data_nodes, (nid, e)
                self.reported[nid].add(e.iteration)
                assert len(e.completed_attempts) == len(e.completed_seqs), e
                report = IterationDone(e.iteration, e.completed, 0.0, e.deferred, 0, e.completed_seqs,
                                       e.completed_attempts, e.completed_holders)
                begin = BeginAggregation(e.iteration, e.completed, completed=(completed_seqs(nid, report),))
                self.completed_seqs[(nid, e.iteration)] = completed_named(begin)[nid]
            elif type(e) is Compute:
                self.computing.append((nid, e))
            elif type(e) is OpenIteration:
                assert nid in self.data_nodes and e.iteration == self.iteration, (nid, e)
            else:
                raise AssertionError(f"unknown effect {e!r} from {nid}")

    def _deliver(self, i: int) -> None:
        src, to, frame = self.wire.pop(i)
        if to in self.dead:
            return
        sender, msg = codec.decode(frame)
        assert sender == src
        self._apply(to, self.nodes[to].on_message(self.now, sender, msg))

    def _fire_earliest(self) -> None:
        due = min([(t, "", n) for n, t in self.gone_at.items()] + [(t, n, k) for (n, k), t in self.timers.items()])
        t, nid, key = due
        self.now = max(self.now, t)
        if nid == "":  # the membership layer's report: `key` is gone
            del self.gone_at[key]
            for other in sorted(self.nodes):
                if other not in self.dead:
                    self._apply(other, self.nodes[other].peer_gone(self.now, key))
            return
        del self.timers[(nid, key)]
        self._apply(nid, self.nodes[nid].on_timer(self.now, key))

    def _finish(self, i: int) -> None:
        nid, c = self.computing.pop(i)
        self._apply(nid, self.nodes[nid].on_compute_done(self.now, c.key, c.kind))

    def _open(self, it: int) -> None:
        self.iteration, self.steps_in_iteration = it, 0
        for d in self.data_nodes:
            self._apply(d, self.nodes[d].open_iteration(self.now, it))
            self.issued[d].update(self.nodes[d].ledger.entries[it])

    def _all_reported(self) -> bool:
        return all(self.iteration in self.reported[d] for d in self.data_nodes)

    # ---- setup -------------------------------------------------------------------------------------------------
    @initialize(n_data=st.sampled_from([1, 2]), policy=st.sampled_from(["gwtf", "swarm"]), lend=st.booleans(),
                one_wave=st.booleans(), act_on_gone=st.booleans())
    def setup(self, n_data: int, policy: str, lend: bool, one_wave: bool, act_on_gone: bool) -> None:
        self.data_nodes = ALL_DATA_NODES[:n_data]
        flows = _flows(self.data_nodes)
        for i, nid in enumerate(self.data_nodes + RELAYS):
            cfg = _config(nid, self.data_nodes, policy, lend, one_wave, act_on_gone)
            m = RecoveryNode(cfg, random.Random(i), first_seq=1000 * i)
            if policy == "gwtf":
                m.set_flows(flows[nid])
            self.nodes[nid] = m
        for d in self.data_nodes:
            self.reported[d], self.issued[d] = set(), set()
        self._open(0)

    # ---- the schedule ------------------------------------------------------------------------------------------
    @precondition(lambda self: self.wire)
    @rule()
    def deliver(self) -> None:
        with self._step():
            self._deliver(0)

    @precondition(lambda self: self.wire or self.computing)
    @rule(n=st.integers(1, 40))
    def run_calm(self, n: int) -> None:
        """Up to n events of a calm spell: the oldest frame delivered, else the oldest computation finished."""
        with self._step():
            for _ in range(n):
                if self.wire:
                    self._deliver(0)
                elif self.computing:
                    self._finish(0)
                else:
                    break

    @precondition(lambda self: self.wire)
    @rule(i=st.integers(0, 63))
    def lose(self, i: int) -> None:
        with self._step():
            self.wire.pop(i % len(self.wire))

    @precondition(lambda self: self.wire)
    @rule(i=st.integers(0, 63))
    def duplicate(self, i: int) -> None:
        with self._step():
            self.wire.append(self.wire[i % len(self.wire)])

    @precondition(lambda self: len(self.wire) > 1)
    @rule(i=st.integers(0, 63), j=st.integers(0, 63))
    def reorder(self, i: int, j: int) -> None:
        with self._step():
            i, j = i % len(self.wire), j % len(self.wire)
            self.wire[i], self.wire[j] = self.wire[j], self.wire[i]

    @precondition(lambda self: self.timers or self.gone_at)
    @rule()
    def fire_timer(self) -> None:
        with self._step():
            self._fire_earliest()

    @rule(dt=st.floats(0.0, 5.0))
    def wait(self, dt: float) -> None:
        with self._step():
            self.now += dt  # (an overdue timer fires at `now`, late)

    @precondition(lambda self: self.computing)
    @rule(i=st.integers(0, 63))
    def finish_compute(self, i: int) -> None:
        with self._step():
            self._finish(i % len(self.computing))

    @precondition(lambda self: len(self.dead) < MAX_CRASHES)
    @rule(victim=st.sampled_from(RELAYS))
    def crash(self, victim: str) -> None:
        with self._step():
            if victim in self.dead:
                return
            self.dead.add(victim)
            self.computing = [(n, c) for n, c in self.computing if n != victim]
            self.timers = {(n, k): t for (n, k), t in self.timers.items() if n != victim}
            self.gone_at[victim] = self.now + DETECT_S

    @precondition(lambda self: not self.finished and not self.aggregating and self._all_reported())
    @rule()
    def begin_aggregation(self) -> None:
        """BEGIN AGGREGATION reached every live relay: they drop what is left of the iteration.  Each counts
        only gradients of microbatches completed at their data node, and a stage counts each one once."""
        with self._step():
            self.aggregating = True
            it = self.iteration
            completed = {d: self.completed_seqs[(d, it)] for d in self.data_nodes}
            counted: dict[int, set] = {}
            for r in RELAYS:
                if r not in self.dead:
                    eff, contributions = self.nodes[r].begin_aggregation(self.now, it, completed)
                    self._apply(r, eff)
                    for key in contributions:
                        d, seq, _ = key
                        status = self.nodes[d].ledger.entries[it].get(seq)
                        assert status is MbStatus.COMPLETED, f"{r} counts the gradient of {key}, held {status} at {d}"
                        stage = self.nodes[r].cfg.stage
                        assert key not in counted.setdefault(stage, set()), f"stage {stage} counts {key} twice"
                        counted[stage].add(key)
            for stage, names in enumerate(STAGES):  # with no relay of the stage crashed: each counted once
                if not set(names) & self.dead:
                    for d in self.data_nodes:
                        for seq in completed[d]:
                            assert (d, seq, it) in counted.get(stage, set()), f"stage {stage} misses {(d, seq, it)}"

    @precondition(lambda self: self.aggregating)
    @rule()
    def finish_aggregation(self) -> None:
        """Every step of the iteration is applied; CAN TAKE reached the data nodes: they open the next one."""
        with self._step():
            it = self.iteration
            self.aggregating = False
            for nid in self.data_nodes + RELAYS:
                if nid not in self.dead:
                    self._apply(nid, self.nodes[nid].aggregation_done(self.now, it))
            if it + 1 == ITERATIONS:
                self.finished = True
            else:
                self._open(it + 1)
                for d in self.data_nodes:
                    row, nxt = self.nodes[d].ledger.entries[it], self.nodes[d].ledger.entries[it + 1]
                    for seq, status in row.items():
                        assert status is not MbStatus.DEFERRED or seq in nxt, (
                            f"{d}: microbatch {seq} deferred in iteration {it} is not pushed in {it + 1}")

    # ---- the invariant -----------------------------------------------------------------------------------------
    @invariant()
    def ledger_accounts_for_every_microbatch(self) -> None:
        for d in self.data_nodes:
            m = self.nodes[d]
            led = m.ledger
            done = led.completed_everywhere()
            twice = sorted({s for s in done if done.count(s) > 1})
            assert not twice, f"{d}: microbatches completed twice: {twice}"
            latest: dict[int, tuple[int, MbStatus]] = {}
            for it in sorted(led.entries):
                for seq, status in led.entries[it].items():
                    latest[seq] = (it, status)
            assert set(latest) == self.issued[d], f"{d}: the ledger dropped {sorted(self.issued[d] - set(latest))}"
            records = {k for k in m.mbs if k[0] == d}
            for seq, (it, status) in sorted(latest.items()):
                if it < self.iteration:  # a closed iteration: settled, and a deferred one came back
                    assert status is MbStatus.COMPLETED, f"{d}: microbatch {seq} lost in iteration {it} ({status})"
                elif status is MbStatus.INFLIGHT:
                    assert (d, seq, it) in records, f"{d}: microbatch {seq} in flight with no record: lost"
                elif status is MbStatus.PENDING:
                    assert seq in m.waiting, f"{d}: microbatch {seq} pending but not waiting to launch: lost"
            for key in records:
                assert led.status(key[2], key[1]) is MbStatus.INFLIGHT, f"{d}: record {key} not counted in flight"
            if self.iteration in self.reported[d]:
                c = led.counts(self.iteration)
                assert c["pending"] == c["inflight"] == 0, f"{d} reported iteration {self.iteration} settled: {c}"

    # ---- the end: a wire that no longer fails ------------------------------------------------------------------
    def _drain(self, *, until_quiet: bool = False) -> None:
        """Deliver every frame, finish every computation and fire timers until the open iteration settles.

        `until_quiet`: go on until nothing is left to happen (no frame, computation or timer)."""
        for _ in range(DRAIN_STEPS):
            if self._all_reported() and not until_quiet:
                return
            if self.wire:
                self._deliver(0)
            elif self.computing:
                self._finish(0)
            elif self.timers or self.gone_at:
                self._fire_earliest()
            else:
                return
            self.ledger_accounts_for_every_microbatch()

    def _check_settled(self) -> None:
        for d in self.data_nodes:
            row = self.nodes[d].ledger.entries[self.iteration]
            unsettled = {s: st.value for s, st in row.items() if st not in (MbStatus.COMPLETED, MbStatus.DEFERRED)}
            assert not unsettled, (f"{d}: iteration {self.iteration} never settled (t={self.now:.1f} s, "
                                   f"{len(self.wire)} frames, {len(self.timers)} timers): {unsettled}")
            assert self.iteration in self.reported[d], f"{d} settled iteration {self.iteration} but never reported it"

    @precondition(lambda self: self.steps_in_iteration >= CALM_AFTER_STEPS and not self._all_reported())
    @rule()
    def calm_until_settled(self) -> None:
        """The wire stops failing until the open iteration settles (later steps may fail it again)."""
        with self._step():
            self._drain()
            self._check_settled()

    def teardown(self) -> None:
        if not self.clean or not self.nodes:
            return  # a step failed: its error is the report
        self._drain(until_quiet=True)
        assert not (self.wire or self.computing or self.timers or self.gone_at), (
            f"not quiet after {DRAIN_STEPS} events: {len(self.wire)} frames, {len(self.computing)} computations, "
            f"timers {sorted(self.timers)[:5]}")
        self._check_settled()


RecoveryWire.TestCase.settings = settings(
    settings(),  # the profile of tests/conftest.py (derandomized in CI)
    max_examples=100, stateful_step_count=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,  # one failure, shrunk fast, is the report
)
TestRecoveryWire = RecoveryWire.TestCase

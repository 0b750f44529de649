"""`gwtf-node sim train`: training iterations with churn in virtual time (Table II of the GWTF paper).

One `protocol.recovery.RecoveryNode` per node; this module only executes
their effects: messages over virtual links, timers, and computations on a
per-node FIFO compute queue.  The same machine is meant for the daemon.

The Table II setting, as modelled here (our choices where the paper is vague)
---------------------------------------------------------------------------
* 18 nodes = 2 persistent data nodes + 16 relays.  The paper's "6 stages" are
  the data nodes' stage (embedding, 1 block, data, loss) plus 5 relay stages of
  3 blocks; relays per stage 4, 3, 3, 3, 3.
* Each data node pushes 4 microbatches per iteration.  Relay capacity
  (microbatches held at once) 4 (homogeneous) or uniform 1-3 (heterogeneous).
* Links: every node gets a location drawn from the 12 of
  `gwtf_node/data/geo12-links.json` (a copy of ../shared/data/geo12-links.json; latency, bandwidth as published; one
  location: 1 ms and 17 Gbit/s; the NL-London 2 Mbit/s entry, flagged there
  as a typo, is read as 2 Gbit/s).  A transfer on a directed link takes
  latency + size/bandwidth and links are FIFO (one transfer at a time).
* Sizes: activation of a microbatch (4 x 512 x 1024, fp32) = 8 MiB, times 32
  as the paper does to mimic larger models: 256 MiB; gradients the same.
* Compute: profiled from the real stages (`scripts/profile_stages.py`: the
  paper's LLaMA-like, d=1024, vocab 32000, microbatch 4 x 512, run with our
  `DataPart` / `RelayPart` on this machine's CPU; `gwtf_node/data/
  stage_profile.json`), with one absolute anchor since this CPU is not the
  paper's RTX A4000: a relay stage's forward (3 blocks on 2048 tokens, ~0.17
  TFLOP; an A4000 at ~7 TFLOP/s effective shared by ~3.6 logical nodes, 18
  nodes on 5 GPUs) FORWARD_S = 0.35 s; every other time is FORWARD_S times
  its measured ratio to the relay forward: the relay backward (~2.1 x), the
  data node's embedding + block forward (~0.33 x), its norm + head + loss
  with their backward at the sink (~3.3 x: the 32000-word head is the
  biggest matmul of the model) and its block + embedding backward (~0.7 x).
  (Before the profile these were FLOP guesses: backward 2 x, data node
  0.15 / 0.3 / 0.25 s.)  Communication dominates anyway (a 256 MiB hop at
  ~100 Mbit/s is ~20 s).
* Aggregation: all-reduce + optimizer step AGG_S per node (+AGG_PEER_TIMEOUT_S
  when a peer of the stage dies during it).
* Churn P: at the start of every iteration each live relay crashes with
  probability P at a uniform random time within the length of the previous
  iteration (so in the forward pass, the backward pass or the aggregation).
  A crashed relay comes back REJOIN_S later as a new joiner (new id, same
  stage and capacity) after downloading its stage's state from a live stage
  peer (stage state size / bandwidth).  It is announced to its neighbours as
  soon as its download finished if the iteration is in training (its
  parameters are the iteration's: no step is applied before the
  aggregation), else when the next iteration opens (both policies).
* Membership (both policies): every live node learns of a crash DETECT_S
  after it (the daemon's liveness check: pings every 1 s, dead after 6 s of
  silence; `RecoveryNode.peer_gone`, `Phases.forget`; `detect_s=60`,
  heartbeats or DHT entries expiring, is a bench row): no more work goes to
  the dead node and nobody waits for it in an aggregation.  With
  `detect=False` only the aggregation phase hears the report (the all-reduce
  needs its live group); the microbatch and flow machines find the crash by
  their own timeouts.  Like the daemon's liveness check, a node that presumed
  a peer dead on a hop deadline and still hears it (the peer is alive, or
  crashed less than SILENCE_S ago) un-presumes it (`RecoveryNode.peer_alive`;
  `unpresume`, default on).  A data node then acts at once on a microbatch
  in its backward pass whose stage held by the dead node has not reported
  its backward yet: SWARM restarts it (`swarm_reacts_to="membership"`, the
  default and the generous reading of SWARM; "timeouts": it waits for its own
  backward timeout, the paper's description of its baseline), GWTF runs a
  repair round (`gwtf_acts_on_gone`, default on as in the daemon; off, it
  waits for its relays' BackwardStuck).

Flow routing (GWTF, `routing="machines"`, the default): every node runs its
flow machine (`protocol/flow.py`'s `FlowNode`) inside this virtual time, next
to its microbatch machine, as the daemon does (`runtime/node.py`,
`runtime/training.py`).  Each machine knows only what discovery gives it: its
links to the live adjacent stages (cost d(i, j) of Equation 1, as
`_scenario`'s links), its live same-stage relays and the data nodes.  Flow
messages are control messages (one-way link latency, no tensor queue); timers
are the machine's own (round_s 1 s).  The relays' microbatch machines get
their flow machine's `out` whenever it changed (`RecoveryNode.set_flows`,
as the daemon's `_sync_rec`); a data node opens iteration 0 once its demand
is placed or its flows were still FLOWS_FORMED_QUIET_S (the daemon's
`_wait_flows`).  A crash: the membership report (DETECT_S after it) makes
every live machine linked to the dead node call `remove_neighbour` (the
daemon's `_forget_peer`); a joiner starts a machine with `FlowConfig.joined`
and its neighbours `add_neighbour` it when it is announced.  Nothing is
recomputed globally: the flows after a change are the machines' own work.
Until the machines moved a unit, a relay repairs locally (recovery.py: a
presumed-dead next hop's units move to live peers with room).  The
machines run with flow.py's defaults, as the daemon's do (FLOW_OPTIONS).  What this costs GWTF against the oracle below: the machines'
flows after iteration 0 cost 1.037 / 1.014 x the optimum for the same units per data node in the
homogeneous / heterogeneous setting (seeds 0-9, no churn; worst 1.20 / 1.05; with label waves 1.022 /
1.010, worst 1.12 / 1.05), they re-form only
after the membership report, and the units are split between the two data
nodes first come first served (e.g. 1 and 3 units of a maximum flow of 4),
so the iteration would last as many waves as the smaller share needs: with
`lend` (default on) a data node with nothing left to launch lends each unit
as it frees (`Lend`), and one done with the iteration all its idle units
(recovery.py, "Lending"; protocol messages, no global knowledge).
`routing="oracle"` (the model before the machines ran, for comparison): the
optimal multi-commodity routing of `baselines.optimal_routing`
(`initial_flows`), the relays' capacity shared fairly among the data nodes
with microbatches left, installed on every node at the start and
FLOW_CONVERGE_S after every change (a crash, joiners, a data node done: its
units lent to the others); `reflow=False`: its initial flows and local
repairs only.
SWARM: no flows, greedy next hop (the cheapest link), assuming every relay has
the homogeneous capacity (4): SWARM assumes equal memory (paper, section I),
so in the heterogeneous setting a relay with less room answers DENY after the
transfer and the sender tries the next cheapest; with none left it keeps its
output until one has room (parks, as GWTF's relays do: SWARM's peers queue
requests rather than drop them).  Detection of a failed backward is by the
data node's own timeouts (its hop, its end-to-end watchdog) or the
membership layer (above), then the whole pipeline is recomputed
(recovery.py).  This is SWARM as the GWTF paper and issue 4 define it.  Checked
against SWARM as published (Ryabinin et al. 2023 and its code,
yandex-research/swarm: `moe/client/balancer.py`, `balanced_expert.py`), the
differences all favour published SWARM, so none was added to this baseline:
its trainers pick the next server by interleaved weighted round-robin over
measured throughput (load balancing, not the closest link); servers queue
requests (no memory refusal: they keep no activations, the trainer does);
and a backward is sent with the saved input to any live server of the stage
(recomputed there, retried on another one on error or timeout), i.e. a
per-stage retry, not a pipeline restart.  Why the paper's SWARM loses
throughput at 0% churn in the heterogeneous setting (2.96 vs 3.6 microbatches
per iteration in Table II; both far below 8): there an iteration is one wave
and a microbatch that finds no relay with memory is deferred, and SWARM,
assuming equal memory, sends to full relays; in this model (both policies) a
data node keeps a denied microbatch with its output (parks) and relaunches it
when a slot frees, so every iteration completes its 8 microbatches in several
waves, and SWARM's misdirected sends cost it only the refused transfers.
That is a choice made for both policies (no recomputed embedding, nothing
deferred), not a SWARM behaviour, so it stays.  `one_wave=True` (`sim train
--one-wave`) runs the paper's reading instead, for both policies (recovery.py,
"One wave"): there GWTF completes its maximum flow per iteration (~4.3 of 8 in
the heterogeneous setting) while SWARM, whose refused microbatches are retried
hop by hop until slots free, completes ~7.3, so the paper's throughput gap does
not appear in this model either (docs/bench_churn.md).

Metrics per iteration (means over iterations are reported)
----------------------------------------------------------
* time per microbatch: the longest iteration over the data nodes (open to
  next open, aggregation included) / microbatches completed in it (an
  iteration that completes none is left out of the mean);
* throughput: microbatches completed end to end in the iteration;
* communication time: seconds of tensor transfers (forward, backward,
  recovery; resends included) of the iteration's microbatches, per completed
  microbatch;
* wasted compute: compute seconds spent on the iteration's microbatches minus
  the compute of the completed ones along their final path (stage forward +
  backward per stage, data node work): so it counts dead attempts, SWARM's
  recomputed pipelines, GWTF's recomputed stage forwards (one per crashed
  stage), work done for microbatches that were deferred and duplicate
  branches.  Not in it: the backward of a completed microbatch whose
  gradient then died with its relay before the all-reduce (the same for both
  policies, a matter of when the crash falls, not of recovery): reported
  apart as `lost_contribution_compute_s`;
* lost microbatches: ledger entries neither completed nor deferred once an
  iteration closed, plus microbatches completed twice (must be 0);
* lost contributions: gradients of completed microbatches that died with a
  relay before its stage's all-reduce (see the rule in recovery.py).

`TrainSim.trace`: set it to a list before `run` to record every computation,
tensor transfer, control message, crash, iteration open and completed path
(tuples, see `_apply`, `_trace_compute`): docs/bench_churn.md's analyses.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol.cost import link_cost
from ..protocol.effects import CancelTimer, Send, SetTimer
from ..protocol.flow import FlowConfig, FlowNode
from ..protocol.leader import LeaderConfig, LeaderMachine
from ..protocol.messages import (
    Backward, BeginAggregation, CanTake, Forward, HeartbeatAck, IterationDone, LeaderHeartbeat, PhaseAck, Recover,
    RequestVote, Vote,
)
from ..protocol.phases import CanTakeRule, LeftOut, OpenIteration, OutOfStep, Phases, StartStep
from ..protocol.pipeline import MbStatus
from ..protocol.recovery import Compute, IterationSettled, RecoveryConfig, RecoveryNode
from ..protocol.scenario import parse_scenario

SETTINGS = ("table2-homogeneous", "table2-heterogeneous")
STAGE_SIZES = (4, 3, 3, 3, 3)
DATA_NODES = ("d0", "d1")
MICROBATCHES = 4
ACTIVATION_MB = 8.0 * 1.048576 * 32  # 8 MiB x 32, in MB
STAGE_STATE_MB = 38e6 * 4 * 3 / 1e6  # weights + Adam moments of 3 blocks, fp32
PROFILE_FILE = Path(__file__).resolve().parents[1] / "data" / "stage_profile.json"  # scripts/profile_stages.py
_RATIO = json.loads(PROFILE_FILE.read_text())["ratio_to_relay_forward"]
FORWARD_S = 0.35  # the anchor: a relay stage's forward on the paper's GPU (module docstring)
BACKWARD_S = FORWARD_S * _RATIO["relay_backward"]
DATA_FWD_S = FORWARD_S * _RATIO["data_forward"]
DATA_LOSS_S = FORWARD_S * _RATIO["data_loss"]
DATA_FINAL_S = FORWARD_S * _RATIO["data_final"]
AGG_S = 10.0
AGG_PEER_TIMEOUT_S = 30.0
REJOIN_S = 60.0
# membership: every node learns of a crash this long after it: the daemon's own liveness check (runtime/training.py:
# pings every PING_EVERY_S = 1 s, dead after DEAD_AFTER_S = 6 s of silence; a test keeps them equal).  60 s
# (heartbeats / DHT entries expiring) is a bench row.
DAEMON_DETECT_S = 7.0
DETECT_S = DAEMON_DETECT_S
FLOW_CONVERGE_S = 60.0  # the flow machines settle this long after a change (paper: ~120 rounds, "roughly a minute")
MAX_SIM_S_PER_ITERATION = 4 * 3600.0
LINKS_FILE = Path(__file__).resolve().parents[1] / "data" / "geo12-links.json"  # shipped with the package

_MSG, _TIMER, _DONE, _CRASH, _REFLOW, _GONE, _JOIN, _FMSG, _FTIMER, _RESYNC = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
PHASE_MSGS = (IterationDone, BeginAggregation, CanTake, PhaseAck)
LEADER_MSGS = (RequestVote, Vote, LeaderHeartbeat, HeartbeatAck)
SILENCE_S = DAEMON_DETECT_S - 1.0  # the daemon's DEAD_AFTER_S: a peer silent this long is no longer heard
ROUTINGS = ("machines", "oracle")
SWARM_REACTIONS = ("membership", "timeouts")  # what makes a SWARM data node restart a microbatch (module docstring)
FLOWS_FORMED_QUIET_S = 3.0  # a data node opens iteration 0 once its demand is placed or its flows were still this long
# The flow machines run with flow.py's defaults, as in the daemon: with two data nodes free-running labels with
# ordered launches, relabelling and cross displacement.  (Before ordered launches coalesced free-running labels, they
# fell into a CostAnnounce storm after some crash sequences, e.g. seed 1, homogeneous, 20% churn: 800k messages
# within 3 s of virtual time, and the simulator ran them with label waves; the same run now takes 1.4 s of CPU.
# Waves stay a sensitivity row of scripts/bench_churn.py.)
FLOW_OPTIONS: dict = {}
FLOWS_FORMED_MAX_S = 60.0  # ... or this long after the start (as the daemon's `_wait_flows`)
TENSOR_MSGS = (Forward, Backward, Recover)


def _load_links() -> dict:
    if LINKS_FILE.exists():
        return json.loads(LINKS_FILE.read_text())
    raise FileNotFoundError(f"{LINKS_FILE} is missing")


@dataclass
class Net:
    loc: dict[str, str]
    lat: dict[tuple[str, str], float]
    bw: dict[tuple[str, str], float]
    intra: tuple[float, float]

    def link(self, a: str, b: str) -> tuple[float, float]:
        la, lb = self.loc[a], self.loc[b]
        if la == lb:
            return self.intra
        return self.lat[(la, lb)], self.bw[(la, lb)]

    def transfer_s(self, a: str, b: str, mb: float) -> float:
        lat_ms, bw = self.link(a, b)
        return lat_ms / 1000.0 + mb * 8.0 / bw


def make_net(nodes: list[str], rng: random.Random) -> Net:
    raw = _load_links()
    locs = raw["locations"]
    lat: dict = {}
    bw: dict = {}
    for e in raw["links"]:
        b = e["bandwidth_mbps"]
        if b < 10:
            b *= 1000.0  # the NL-London typo (see the links file's note)
        for x, y in ((e["a"], e["b"]), (e["b"], e["a"])):
            lat[(x, y)] = e["latency_ms"]
            bw[(x, y)] = b
    intra = (raw["intra_location"]["latency_ms"], raw["intra_location"]["bandwidth_mbps"])
    return Net({n: rng.choice(locs) for n in nodes}, lat, bw, intra)


@dataclass
class Setting:
    name: str
    relays: dict[str, tuple[int, int]]  # id -> (stage, capacity)
    net: Net
    data: tuple[str, ...] = DATA_NODES


def make_setting(name: str, seed: int, data_nodes: int = len(DATA_NODES)) -> Setting:
    """Table II's relays and links; `data_nodes` data nodes (2 in the paper; a third one draws its location
    after the relays, so the relays' locations do not depend on it)."""
    if name not in SETTINGS:
        raise ValueError(f"unknown setting {name!r}")
    if data_nodes < 1:
        raise ValueError(f"data_nodes is {data_nodes}: a run needs at least one data node")
    rng = random.Random(f"setting:{name}:{seed}")
    relays = {}
    for s, n in enumerate(STAGE_SIZES):
        for i in range(n):
            cap = MICROBATCHES if name == "table2-homogeneous" else rng.randint(1, 3)
            relays[f"s{s}r{i}"] = (s, cap)
    data = tuple(f"d{i}" for i in range(data_nodes))
    net = make_net(list(data[:2]) + list(relays) + list(data[2:]), rng)
    return Setting(name, relays, net, data)


def compute_s(node_stage: int, kind: str) -> float:
    if kind == "aggregate":
        return AGG_S
    if node_stage < 0:
        return {"forward": DATA_FWD_S, "loss": DATA_LOSS_S, "final": DATA_FINAL_S}[kind]
    return BACKWARD_S if kind == "backward" else FORWARD_S  # forward, recompute


IDEAL_MB_S = DATA_FWD_S + DATA_LOSS_S + DATA_FINAL_S + len(STAGE_SIZES) * (FORWARD_S + BACKWARD_S)


def _scenario(setting: Setting, data_capacity: int | dict = MICROBATCHES):
    caps = data_capacity if isinstance(data_capacity, dict) else {d: data_capacity for d in setting.data}
    nodes = [{"id": d, "role": "data", "capacity": caps.get(d, 0)} for d in setting.data]
    nodes += [{"id": r, "role": "relay", "stage": s, "capacity": c} for r, (s, c) in setting.relays.items()]
    links = []
    S = len(STAGE_SIZES)

    def add(a: str, b: str) -> None:
        la, ba = setting.net.link(a, b)
        lb, bb = setting.net.link(b, a)
        links.append({"a": a, "b": b, "latency_ms": [la, lb], "bandwidth_mbps": [ba, bb]})

    for r, (s, _) in setting.relays.items():
        if s == 0 or s == S - 1:
            for d in setting.data:
                add(d, r)
        for r2, (s2, _) in setting.relays.items():
            if s2 == s + 1:
                add(r, r2)
    return parse_scenario({"name": setting.name, "stages": S, "nodes": nodes, "links": links},
                          activation_mb=ACTIVATION_MB)


def initial_flows(setting: Setting, active: tuple[str, ...] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """node -> data node -> next hop -> units, from the optimal routing.

    The relays' capacity is shared fairly among the `active` data nodes (those
    with microbatches left to push): each may place at most ceil(max flow /
    active data nodes) units (the iteration lasts as long as the slowest data
    node), then the cheapest routing of that is taken.
    """
    from .baselines import max_flow_value, optimal_routing
    if active is None:
        active = setting.data
    if not active:
        return {}
    total = max_flow_value(_scenario(setting, {d: MICROBATCHES for d in active}))
    share = max(1, min(MICROBATCHES, -(-total // len(active))))
    res = optimal_routing(_scenario(setting, {d: share for d in active}))
    out: dict[str, dict[str, dict[str, int]]] = {}
    for f in res.flows:
        hops = (f.data_node, *f.path, f.data_node)
        for a, b in zip(hops, hops[1:-1] + (f.data_node,)):
            if a == b:
                continue
            o = out.setdefault(a, {}).setdefault(f.data_node, {})
            o[b] = o.get(b, 0) + 1
    return out


@dataclass
class IterStats:
    opened: dict[str, float] = field(default_factory=dict)
    closed: dict[str, float] = field(default_factory=dict)
    compute_s: float = 0.0
    transfer_s: float = 0.0
    lost_contrib: int = 0
    lost_contrib_s: float = 0.0


class TrainSim:
    """One Table II run in virtual time (module docstring).  Model switches, defaults in parentheses:
    `routing` ("machines": GWTF's flows by the flow machines; "oracle": the LP optimum installed globally),
    `reflow` (True; oracle only: re-install the optimum FLOW_CONVERGE_S after a change), `lend` (True; machines
    only: recovery.py's lending), `fastest_unit` (True; GWTF: recovery.py's "Fastest unit first"), `flow_options` (FLOW_OPTIONS: FlowConfig fields of every flow machine),
    `detect` (True: the membership layer), `join_mid_iteration` (True), `swarm_reacts_to` ("membership"),
    `gwtf_acts_on_gone` (True), `unpresume` (True: a presumed-dead peer still heard is alive again),
    `can_take` ("all": phases.CanTakeRule), `one_wave` (False: recovery.py's "One wave", the paper's one-wave iteration
    with deferral, for both policies), `detect_s` (DETECT_S: how long after a crash the membership layer reports
    it); `crash_plan` / `rejoin` (True) for scripted crashes; `flows`: fixed flows
    (oracle-style, no machines)."""

    def __init__(self, setting: Setting, policy: str, churn: float, seed: int,
                 crash_plan: list[tuple[float, str]] | None = None, rejoin: bool = True,
                 flows: dict | None = None, reflow: bool = True, detect: bool = True,
                 join_mid_iteration: bool = True, swarm_reacts_to: str = "membership",
                 gwtf_acts_on_gone: bool = True, routing: str = "machines", flow_options: dict | None = None,
                 lend: bool = True, one_wave: bool = False, detect_s: float = DETECT_S, fastest_unit: bool = True,
                 unpresume: bool = True, can_take: str = CanTakeRule.ALL.value) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, not {routing!r}")
        self.setting, self.policy, self.churn, self.seed = setting, policy, churn, seed
        self.data: tuple[str, ...] = setting.data
        self.rng = random.Random(f"train:{seed}:{policy}:{churn}")
        self.crash_rng = random.Random(f"churn:{seed}:{churn}")  # same crash draws for both policies
        self.net = setting.net
        self.nodes: dict[str, RecoveryNode] = {}  # every node's microbatch machine
        self.phases: dict[str, Phases] = {}  # every node's aggregation phase
        self.leaders: dict[str, LeaderMachine] = {}  # every data node's election
        self._leader_seen: dict[str, str | None] = {}  # data node -> the leader its Phases was last told of
        self.reported_gone: set[str] = set()  # nodes the membership layer reported gone (everyone learns at once)
        self.crashed_at: dict[str, float] = {}
        self.unpresume = unpresume
        self.can_take = CanTakeRule(can_take)
        self.resyncs = 0
        self.elections = 0
        self.dropped = 0
        self.observer = None  # tests: called as observer(node, "msg", (sender, msg)) / (node, "done", (key, kind))
        self.drop = None  # tests: drop(sender, to, msg) -> True loses that control message on the wire
        self.stage: dict[str, int] = {d: -1 for d in self.data}
        self.cap: dict[str, int] = {}
        self.dead: set[str] = set()
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self._tv: dict = {}
        self._busy: dict[str, float] = {}
        self._link_free: dict[tuple[str, str], float] = {}
        self._agg_pending: dict[str, tuple[float, int, tuple]] = {}
        self._token = 0
        self.iters: dict[int, IterStats] = {}
        self.pending_joins: list[tuple[float, str, int, int]] = []
        self.joins = 0
        self.crashes: list[tuple[float, str]] = []
        self.crash_plan = sorted(crash_plan or [])
        self.data_crashed: dict[str, int] = {}  # a data node that crashed -> the iteration it was in
        self.rejoin = rejoin
        self.last_iter_s = 600.0
        self.events = 0
        self.trace: list | None = None  # set to a list to record (kind, ...) tuples (module docstring)
        self._opened_once: set[int] = set()
        self.reflow = reflow
        self.detect = detect
        self.detect_s = detect_s
        self.join_mid_iteration = join_mid_iteration
        if swarm_reacts_to not in SWARM_REACTIONS:
            raise ValueError(f"swarm_reacts_to must be one of {SWARM_REACTIONS}, not {swarm_reacts_to!r}")
        self.acts_on_gone = {"swarm": swarm_reacts_to == "membership", "gwtf": gwtf_acts_on_gone}[policy]
        self.reflows = 0
        self._lent = False
        self._flow_members = dict(setting.relays)
        self._done_at: dict[tuple[str, int], float] = {}
        S = len(STAGE_SIZES)
        self.S = S
        for r, (s, c) in setting.relays.items():
            self.stage[r], self.cap[r] = s, c
        # GWTF's flows: the flow machines (`flow.py`), run in this virtual time (module docstring), or the
        # optimum of the routing LP installed by an oracle (`routing="oracle"`, the model before the machines ran)
        self.machines = policy == "gwtf" and routing == "machines" and flows is None
        self.routing = routing if policy == "gwtf" else "greedy"
        if self.machines:
            self.reflow = False
            self.flows = {}
        else:
            self.flows = flows if flows is not None else (initial_flows(setting) if policy == "gwtf" else {})
        self.one_wave = one_wave
        self.lend = lend and self.machines  # (the oracle lends by recomputing the flows without the finished one)
        self.fastest_unit = fastest_unit
        self.fnodes: dict[str, FlowNode] = {}
        self.flow_options = dict(FLOW_OPTIONS if flow_options is None else flow_options)  # FlowConfig fields
        self._ftv: dict = {}
        self._fstamp: dict[str, float] = {}
        self._started: set[str] = set()
        self.flow_messages = 0
        for nid in list(self.data) + list(setting.relays):
            self._make(nid, self.stage[nid], self.cap.get(nid, MICROBATCHES))
        for d in self.data:
            self.leaders[d] = LeaderMachine(LeaderConfig(d, self.data), random.Random(f"{seed}:{d}:leader"))
            self._leader_seen[d] = None
        for t, nid in self.crash_plan:
            self._push(t, _CRASH, nid, None, None)

    # ---- construction ------------------------------------------------------
    def _peers(self, stage: int, nid: str, live_only: bool = True) -> list[str]:
        return [r for r, s in self.stage.items() if s == stage and r != nid and r not in self.dead
                and r not in self.data]

    def _prior(self, a: str, b: str, back: bool) -> float:
        sb = self.stage[b]
        c = compute_s(sb, ("final" if back else "loss") if sb < 0 else ("backward" if back else "forward"))
        return self.net.transfer_s(a, b, ACTIVATION_MB) + c * max(1, self.cap.get(b, MICROBATCHES))

    def _make(self, nid: str, stage: int, cap: int) -> RecoveryNode:
        S = self.S
        if stage < 0:
            nxt, prv = self._peers(0, nid), self._peers(S - 1, nid)
        else:
            nxt = list(self._live_data()) if stage == S - 1 else self._peers(stage + 1, nid)
            prv = list(self._live_data()) if stage == 0 else self._peers(stage - 1, nid)
        cost = lambda a, b: self.net.transfer_s(a, b, ACTIVATION_MB) + self.net.transfer_s(b, a, ACTIVATION_MB)  # noqa: E731
        prior = {j: self._prior(nid, j, False) for j in nxt}
        prior.update({j: self._prior(nid, j, True) for j in prv})
        if not hasattr(self, "_e2e"):
            hop = statistics.mean(self.net.transfer_s(a, b, ACTIVATION_MB) for a in self.data
                                  for b in self._peers(0, ""))
            self._e2e = 2 * (S + 1) * hop + IDEAL_MB_S  # launch -> final backward, no queueing
        e2e = self._e2e
        cfg = RecoveryConfig(
            node_id=nid, stage=stage, last_stage=S - 1, capacity=cap, data_nodes=self._live_data(),
            next_peers={j: cost(nid, j) for j in nxt}, prev_peers={j: cost(nid, j) for j in prv},
            peer_capacity={j: self.cap.get(j, MICROBATCHES) for j in nxt + prv}, prior_s=prior,
            e2e_prior_s=e2e, policy=self.policy,
            swarm_assumed_capacity=MICROBATCHES, act_on_gone=self.acts_on_gone, lend=self.lend,
            one_wave=self.one_wave, fastest_unit=self.fastest_unit)  # (SWARM: greedy, ignores it)
        m = RecoveryNode(cfg, random.Random(f"{self.seed}:{nid}"),
                         first_seq=(self.data.index(nid) * 10**6 if nid in self.data else 0))
        if self.policy == "gwtf" and nid in self.flows:
            m.set_flows(self.flows[nid])
        self.nodes[nid] = m
        self.phases[nid] = Phases(nid, stage, S - 1, applied=self._iteration_now(), can_take=self.can_take)
        return m

    # ---- the flow machines (GWTF) --------------------------------------------
    def _flow_cost(self, a: str, b: str) -> float:
        """d(a, b) of Equation 1 (ms), as `parse_scenario` computes it for `_scenario`'s links."""
        (la, ba), (lb, bb) = self.net.link(a, b), self.net.link(b, a)
        return link_cost(0.0, 0.0, la, lb, ba, bb, ACTIVATION_MB)

    def _make_flow(self, nid: str, joined: bool) -> FlowNode:
        """A flow machine with what discovery gives `nid` now: its links to the live adjacent stages (data nodes
        for the first / last stage), its live same-stage relays, the data nodes (as `flowsim.flow_configs`)."""
        S, st = self.S, self.stage[nid]
        data = self._live_data()
        if st < 0:
            nxt, prv, peers = self._peers(0, nid), self._peers(S - 1, nid), ()
        else:
            nxt = list(data) if st == S - 1 else self._peers(st + 1, nid)
            prv = list(data) if st == 0 else self._peers(st - 1, nid)
            peers = tuple(sorted(self._peers(st, nid)))
        cfg = FlowConfig(nid, st < 0, self.cap.get(nid, MICROBATCHES), tuple(self.data),
                         {j: self._flow_cost(nid, j) for j in sorted(nxt)},
                         {j: self._flow_cost(j, nid) for j in sorted(prv)}, peers, joined=joined,
                         **self.flow_options)
        fm = FlowNode(cfg, random.Random(f"{self.seed}:{nid}"))
        self.fnodes[nid] = fm
        self._fstamp[nid] = fm.stats.last_change
        return fm

    def _apply_flow(self, nid: str, effects: list) -> None:
        """A flow machine's effects: control messages (the link's latency) and its own timers."""
        for e in effects:
            t = type(e)
            if t is Send:
                self.flow_messages += 1
                self._push(self.now + self.net.link(nid, e.to)[0] / 1000.0, _FMSG, e.to, nid, e.msg)
            elif t is SetTimer or t is CancelTimer:
                self._timer(self._ftv, _FTIMER, nid, e)
            else:
                raise TypeError(f"unknown flow effect {e!r} from {nid}")

    def _sync_flows(self, nid: str) -> None:
        """Hand the node's microbatch machine its flow machine's flows when they changed (as the daemon's
        `_sync_rec`); a data node opens iteration 0 once its flows formed (as the daemon's `_wait_flows`)."""
        fm = self.fnodes[nid]
        changed = fm.stats.last_change != self._fstamp.get(nid)
        if changed:
            self._fstamp[nid] = fm.stats.last_change
        if nid in self._started:
            if changed:
                self._apply(nid, self.nodes[nid].set_flows(fm.out, now=self.now))
            return
        placed = sum(fm.out.get(nid, {}).values())
        quiet = self.now - fm.stats.last_change
        if placed >= fm.cfg.capacity or (placed > 0 and quiet > FLOWS_FORMED_QUIET_S) \
                or self.now >= FLOWS_FORMED_MAX_S:
            self._started.add(nid)
            self.nodes[nid].set_flows(fm.out)
            self._apply(nid, self.nodes[nid].start(self.now))

    def _flow_gone(self, gone: str) -> None:
        """The membership layer reports `gone`: every live flow machine linked to it removes it (the daemon's
        `_forget_peer`); the machines re-form the flows through it with their own messages."""
        for nid in sorted(self.fnodes):
            if nid in self.dead or nid == gone:
                continue
            fm = self.fnodes[nid]
            c = fm.cfg
            if gone in c.next_costs or gone in c.prev_costs or gone in c.peers:
                self._apply_flow(nid, fm.remove_neighbour(self.now, gone))
                self._sync_flows(nid)

    def _flow_joined(self, nid: str) -> None:
        """A joiner starts its flow machine (`FlowConfig.joined`); its neighbours add it (the daemon's
        `_add_flow_neighbour`)."""
        fm = self._make_flow(nid, joined=True)
        self._apply_flow(nid, fm.start(self.now))
        for j in sorted(set(fm.cfg.prev_costs) | set(fm.cfg.next_costs) | set(fm.cfg.peers)):
            other = self.fnodes.get(j)
            if other is None or j in self.dead:
                continue
            if j in fm.cfg.prev_costs:
                side, cost = "next", fm.cfg.prev_costs[j]
            elif j in fm.cfg.next_costs:
                side, cost = "prev", fm.cfg.next_costs[j]
            else:
                side, cost = "peer", 0.0
            self._apply_flow(j, other.add_neighbour(self.now, nid, cost, side))
            self._sync_flows(j)
        self._sync_flows(nid)

    # ---- the event loop ----------------------------------------------------
    def _timer(self, versions: dict, kind: int, nid: str, e, component: str | None = None) -> None:
        """SetTimer / CancelTimer of `nid` (of one of its machines, `component`): a new version of its key (a
        pending firing of an older version is stale); SetTimer also schedules the firing."""
        key = e.key if component is None else (component, e.key)
        k = (nid, key)
        v = versions[k] = versions.get(k, 0) + 1
        if type(e) is SetTimer:
            self._push(max(e.deadline, self.now), kind, nid, key, v)

    def _push(self, t: float, kind: int, node: str, a, b) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, node, a, b))

    def _it(self, it: int) -> IterStats:
        return self.iters.setdefault(it, IterStats())

    def _send(self, nid: str, e: Send) -> None:
        """A message on the wire: a tensor waits for its link (FIFO) and takes latency + size / bandwidth; a
        control message takes the latency (or is lost, if the `drop` hook says so)."""
        if type(e.msg) in TENSOR_MSGS:
            dur = self.net.transfer_s(nid, e.to, ACTIVATION_MB)
            lat = self.net.link(nid, e.to)[0] / 1000.0
            link = (nid, e.to)
            start = max(self.now, self._link_free.get(link, 0.0))
            self._link_free[link] = start + dur - lat
            self._it(e.msg.iteration).transfer_s += dur
            arrive = start + dur
            if self.trace is not None:
                self.trace.append(("xfer", start, arrive, nid, e.to, type(e.msg).__name__,
                                   (e.msg.data_node, e.msg.seq, e.msg.iteration), e.msg.attempt))
        else:
            if self.drop is not None and self.drop(nid, e.to, e.msg):
                self.dropped += 1
                return
            arrive = self.now + self.net.link(nid, e.to)[0] / 1000.0
            if self.trace is not None:
                m = e.msg
                self.trace.append(("ctl", self.now, arrive, nid, e.to, type(m).__name__,
                                   (getattr(m, "data_node", None), getattr(m, "seq", None),
                                    getattr(m, "iteration", None)), getattr(m, "attempt", None)))
        self._push(arrive, _MSG, e.to, nid, e.msg)

    def _apply(self, nid: str, effects: list) -> None:
        """The microbatch machine's effects."""
        for e in effects:
            t = type(e)
            if t is Send:
                self._send(nid, e)
            elif t is SetTimer or t is CancelTimer:
                self._timer(self._tv, _TIMER, nid, e, "rec")
            elif t is Compute:
                dur = compute_s(self.stage[nid], e.kind)
                start = max(self.now, self._busy.get(nid, 0.0))
                end = start + dur
                self._busy[nid] = end
                self._token += 1
                self._push(end, _DONE, nid, (e.kind, e.key, dur, start), self._token)
            elif t is OpenIteration:
                self._on_open(nid, e.iteration)
            elif t is IterationSettled:
                self._report_settled(nid, e)
            else:
                raise TypeError(f"unknown effect {e!r} from {nid}'s microbatch machine")

    # ---- the aggregation phase (phases.Phases) and the election (leader.LeaderMachine) ----------------
    def _known(self, stage: int) -> list[str]:
        """The nodes of `stage` (-1: the data nodes) the membership layer has not reported gone: what every
        node knows (crashed ones until their report, joiners once announced)."""
        if stage < 0:
            return [d for d in self.data if d not in self.reported_gone]
        return sorted(r for r, s in self.stage.items() if s == stage and r not in self.reported_gone
                      and r in self.nodes and r not in self.data)

    def _next_prev(self, nid: str) -> tuple[list[str], list[str]]:
        st, last = self.stage[nid], self.S - 1
        if st < 0:
            return self._known(0), self._known(last)
        return (self._known(-1) if st == last else self._known(st + 1),
                self._known(-1) if st == 0 else self._known(st - 1))

    def _groups(self) -> dict[int, list[str]]:
        return {k: self._known(k) for k in range(-1, self.S)}

    def _iteration_now(self) -> int:
        """The iteration the live data nodes are in (the newest one opened): a joiner's parameters are its."""
        live = [self.phases[d].iteration for d in self.data if d in self.phases and d not in self.dead]
        return max(live, default=0)

    def _leading(self, nid: str) -> bool:
        lm = self.leaders.get(nid)
        return lm is not None and lm.is_leader(self.now)

    def _maybe_begin(self, nid: str) -> list:
        """The acting leader opens the aggregation of every iteration whose reports it holds."""
        ph = self.phases[nid]
        eff: list = []
        for it in ph.pending_iterations():
            eff += ph.maybe_begin(self.now, it, leading=self._leading(nid), data_nodes=self._known(-1),
                                  stage0=self._known(0), groups=self._groups())
        return eff

    def _report_settled(self, nid: str, e: IterationSettled) -> None:
        """A data node's iteration is settled: its report goes to the leader (at the leader: maybe BEGIN)."""
        ph = self.phases[nid]
        eff = ph.report_done(self.now, IterationDone(e.iteration, e.completed, 0.0, e.deferred))
        if self._leading(nid):
            eff += self._maybe_begin(nid)
        self._apply_phase(nid, eff)

    def _apply_phase(self, nid: str, effects: list) -> None:
        """The aggregation phase's effects: control messages, its retransmission timers, the step."""
        for e in effects:
            t = type(e)
            if t is Send:
                self._send(nid, e)
            elif t is SetTimer or t is CancelTimer:
                self._timer(self._tv, _TIMER, nid, e, "phase")
            elif t is StartStep or t is LeftOut or t is OutOfStep:
                rec = self.nodes[nid]
                if e.iteration not in rec.begun:  # BEGIN reached this node: a relay drops what is left
                    self._apply(nid, rec.begin_aggregation(self.now, e.iteration)[0])
                if t is StartStep:
                    self._start_step(nid, e.iteration)
                else:  # the stage state of the iteration after the step, from a stage peer
                    self.resyncs += 1
                    peers = self._peers(self.stage[nid], nid)
                    dl = STAGE_STATE_MB * 8.0 / min(self.net.link(p, nid)[1] for p in peers) if peers else 0.0
                    self._push(self.now + AGG_S + dl, _RESYNC, nid, e.iteration, None)
            elif t is OpenIteration:
                self._apply(nid, self.nodes[nid].open_iteration(self.now, e.iteration))
            else:
                raise TypeError(f"unknown effect {e!r} from {nid}'s aggregation phase")

    def _start_step(self, nid: str, it: int) -> None:
        """All-reduce + optimizer step: AGG_S on the node's compute queue (longer if a stage peer dies)."""
        start = max(self.now, self._busy.get(nid, 0.0))
        end = start + AGG_S
        self._busy[nid] = end
        self._token += 1
        self._agg_pending[nid] = (end, self._token, ("agg", it))
        self._push(end, _DONE, nid, ("aggregate", ("agg", it), AGG_S, start), self._token)

    def _step_done(self, nid: str, it: int) -> None:
        self._apply(nid, self.nodes[nid].aggregation_done(self.now, it))
        nxt, prv = self._next_prev(nid)
        self._apply_phase(nid, self.phases[nid].on_step_done(self.now, it, nxt, prv))

    def _phase_message(self, nid: str, sender: str, msg) -> None:
        ph = self.phases[nid]
        nxt, prv = self._next_prev(nid)
        t = type(msg)
        if t is PhaseAck:
            eff = ph.on_ack(self.now, sender, msg)
        elif t is IterationDone:
            eff = ph.on_iteration_done(self.now, sender, msg, leading=self._leading(nid), data_nodes=self._known(-1),
                                       stage0=self._known(0), groups=self._groups())
        elif t is BeginAggregation:
            eff = ph.on_begin(self.now, sender, msg, nxt)
        else:
            eff = ph.on_can_take(self.now, sender, msg, nxt, prv)
        self._apply_phase(nid, eff)

    def _leader_event(self, nid: str, effects: list) -> None:
        """The election's effects; a change of the leader this data node knows goes to its Phases."""
        for e in effects:
            t = type(e)
            if t is Send:
                self._send(nid, e)
            elif t is SetTimer or t is CancelTimer:
                self._timer(self._tv, _TIMER, nid, e, "leader")
            else:
                raise TypeError(f"unknown effect {e!r} from {nid}'s election")
        lead = self.leaders[nid].leader(self.now)
        if lead == self._leader_seen[nid]:
            return
        self._leader_seen[nid] = lead
        if lead == nid:
            self.elections += 1
        front = self._known(-1) + self._known(0)
        eff = self.phases[nid].set_leader(self.now, lead, front=front)
        if lead == nid:
            eff += self._maybe_begin(nid)
        self._apply_phase(nid, eff)

    def _unpresume(self, nid: str) -> None:
        """The daemon's liveness check: a peer the machine presumed dead that is still heard (alive, or
        crashed less than SILENCE_S ago) is alive again for it."""
        rec = self.nodes[nid]
        if not self.unpresume or not rec.dead:
            return
        for p in sorted(rec.dead - rec.gone):
            c = self.crashed_at.get(p)
            if c is None or self.now - c < SILENCE_S:
                self._apply(nid, rec.peer_alive(self.now, p))

    def _aggregating(self) -> bool:
        """An aggregation is under way: a live data node began its iteration's (until it opens the next)."""
        return any(self.phases[d].iteration in self.phases[d].begun for d in self._live_data())

    def _on_open(self, nid: str, it: int) -> None:
        self._it(it).opened[nid] = self.now
        if self.trace is not None:
            self.trace.append(("open", self.now, nid, it))
        if it > 0:
            self._it(it - 1).closed[nid] = self.now
        if it in self._opened_once:
            return
        self._opened_once.add(it)  # the first data node to open `it`: membership changes take effect now
        if it > 0:
            prev = self.iters[it - 1].opened.get(nid)
            if prev is not None:
                self.last_iter_s = max(60.0, self.now - prev)
        # joiners whose download finished come in now
        ready = [j for j in self.pending_joins if j[0] <= self.now]
        self.pending_joins = [j for j in self.pending_joins if j[0] > self.now]
        for _, old, stage, cap in ready:
            self._join(old, stage, cap)
        if self.policy == "gwtf" and self.reflow:
            # joiners ran the flow machines since their download finished: settled FLOW_CONVERGE_S after that
            settle = max((t for t, *_ in ready), default=-math.inf) + FLOW_CONVERGE_S
            if settle <= self.now:
                self._install(self._live_members(), self._live_data())
            else:
                if self._lent:  # every data node has microbatches again: the flows shared by all of them
                    self._install(self._flow_members, self._live_data())
                self._push(settle, _REFLOW, "", self._live_members(), None)
        if self.churn > 0:
            for r in sorted(self.stage):
                if r in self.data or r in self.dead:
                    continue
                if self.crash_rng.random() < self.churn:
                    self._push(self.now + self.crash_rng.random() * self.last_iter_s, _CRASH, r, None, None)

    # ---- flows during training (GWTF) -----------------------------------------
    def _live_members(self) -> dict[str, tuple[int, int]]:
        return {r: (self.stage[r], self.cap[r]) for r in self.stage if r not in self.data and r not in self.dead}

    def _schedule_reflow(self) -> None:
        """A change the flow machines see now (a crash, joiners, a data node done): they settle FLOW_CONVERGE_S
        later on what they saw now."""
        if self.policy != "gwtf" or not self.reflow:
            return
        self._push(self.now + FLOW_CONVERGE_S, _REFLOW, "", self._live_members(), None)

    def _live_data(self) -> tuple[str, ...]:
        return tuple(d for d in self.data if d not in self.dead)

    def _active(self) -> tuple[str, ...]:
        """Data nodes with microbatches of their current iteration left (or already in the next one)."""
        top = max(self.nodes[d].iteration for d in self._live_data())
        return tuple(d for d in self._live_data()
                     if self.nodes[d].iteration < top or self.nodes[d].iteration not in self.nodes[d].reported)

    def _on_reflow(self, members: dict) -> None:
        active = self._active()
        done_at = [self._done_at.get((d, self.nodes[d].iteration)) for d in self._live_data() if d not in active]
        if any(t is None or t > self.now - FLOW_CONVERGE_S + 1e-9 for t in done_at):
            active = self._live_data() if done_at else active  # a data node's demand went to 0 too recently to be seen
        self._install(members, active)

    def _install(self, members: dict, active: tuple[str, ...]) -> None:
        """The flows the flow machines converge to for `members` and the `active` data nodes, on every live node."""
        if any(not any(s == k for s, _ in members.values()) for k in range(self.S)):
            return  # a stage with no relay: no flow at all; the nodes keep their local repairs
        flows = initial_flows(Setting(self.setting.name, members, self.net), active)
        self.reflows += 1
        self._flow_members = members
        self._lent = tuple(active) != self._live_data()
        for nid in sorted(self.nodes):
            if nid not in self.dead:
                self._apply(nid, self.nodes[nid].set_flows(flows.get(nid, {}), now=self.now))

    def _join_now(self, old: str) -> None:
        """A joiner whose download finished joins at once while its stage's parameters are the iteration's:
        not while an aggregation is under way (then: at the next open, with the new parameters)."""
        if not self.join_mid_iteration:
            return
        if self._aggregating():
            return
        for j in [j for j in self.pending_joins if j[1] == old]:
            self.pending_joins.remove(j)
            self._join(old, j[2], j[3])
            if self.policy == "gwtf" and self.reflow:
                self._push(self.now + FLOW_CONVERGE_S, _REFLOW, "", self._live_members(), None)

    def _join(self, old: str, stage: int, cap: int) -> None:
        self.joins += 1
        nid = f"{old.split('~')[0]}~{self.joins}"
        self.stage[nid], self.cap[nid] = stage, cap
        self.net.loc[nid] = self.net.loc[old]  # the same machine, restarted
        self._make(nid, stage, cap)
        if self.machines:
            self._started.add(nid)
            self._flow_joined(nid)
        cost = lambda a, b: self.net.transfer_s(a, b, ACTIVATION_MB) + self.net.transfer_s(b, a, ACTIVATION_MB)  # noqa: E731
        S = self.S
        prv = list(self._live_data()) if stage == 0 else self._peers(stage - 1, nid)
        nxt = list(self._live_data()) if stage == S - 1 else self._peers(stage + 1, nid)
        for p in prv:  # (discovery: the joiner is a next-stage peer of these, as the daemon's `_sync_rec`)
            rec = self.nodes[p]
            self._unpresume(p)
            self._apply(p, rec.set_neighbours(self.now, {**rec.next_peers, nid: cost(p, nid)}, rec.prev_peers,
                                              {nid: cap}, self._prior(p, nid, False)))
        for p in nxt:
            if p in self.data and stage != S - 1:
                continue
            rec = self.nodes[p]
            self._unpresume(p)
            self._apply(p, rec.set_neighbours(self.now, rec.next_peers, {**rec.prev_peers, nid: cost(p, nid)},
                                              {}, self._prior(p, nid, True)))

    def _crash(self, nid: str) -> None:
        if nid in self.dead or nid not in self.nodes:
            return
        self.dead.add(nid)
        self.crashed_at[nid] = self.now
        self.crashes.append((self.now, nid))
        if self.trace is not None:
            self.trace.append(("crash", self.now, nid))
        m = self.nodes[nid]
        for it, keys in m.contrib.items():  # gradients held here die with the node
            st = self._it(it)
            st.lost_contrib += len(keys)
            st.lost_contrib_s += len(keys) * (FORWARD_S + BACKWARD_S)
        stage = self.stage[nid]
        for p, (end, tok, key) in list(self._agg_pending.items()):  # peers all-reducing with it wait
            if p != nid and p not in self.dead and self.stage[p] == stage and end > self.now:
                self._token += 1
                self._agg_pending[p] = (end + AGG_PEER_TIMEOUT_S, self._token, key)
                self._busy[p] = max(self._busy.get(p, 0.0), end + AGG_PEER_TIMEOUT_S)
                self._push(end + AGG_PEER_TIMEOUT_S, _DONE, p, ("aggregate", key, AGG_S, end - AGG_S), self._token)
        self._schedule_reflow()
        self._push(self.now + self.detect_s, _GONE, nid, None, None)
        if nid in self.data:
            self.data_crashed[nid] = self.nodes[nid].iteration
        elif self.rejoin:
            peers = self._peers(stage, nid)
            dl = STAGE_STATE_MB * 8.0 / min(self.net.link(p, nid)[1] for p in peers) if peers else 0.0
            self.pending_joins.append((self.now + REJOIN_S + dl, nid, stage, self.cap[nid]))
            self._push(self.now + REJOIN_S + dl, _JOIN, nid, None, None)

    def run(self, iterations: int) -> None:
        if self.machines:  # the flows form first; each data node opens iteration 0 once its own formed
            for nid in sorted(self.nodes):
                if nid not in self.dead:
                    self._apply_flow(nid, self._make_flow(nid, joined=False).start(self.now))
            for nid in sorted(self.nodes):
                if nid not in self.data:
                    self._started.add(nid)
                    self._apply(nid, self.nodes[nid].start(self.now))
        else:
            for nid in sorted(self.nodes):
                self._apply(nid, self.nodes[nid].start(self.now))
        for d in self.data:
            self._leader_event(d, self.leaders[d].start(self.now))
        limit = MAX_SIM_S_PER_ITERATION * (iterations + 1)
        heap = self._heap
        while heap:
            if all(self.nodes[d].iteration >= iterations for d in self._live_data()):
                break
            t, _, kind, node, a, b = heapq.heappop(heap)
            if t > limit:
                break
            self.now = t
            if kind == _CRASH:
                self._crash(node)
                continue
            if kind == _REFLOW:
                self._on_reflow(a)
                continue
            if kind == _JOIN:  # a joiner's download finished: it serves the iteration in training now
                self._join_now(node)
                continue
            if kind == _FMSG or kind == _FTIMER:
                if node in self.dead:
                    continue
                fm = self.fnodes[node]
                if kind == _FMSG:
                    self._apply_flow(node, fm.on_message(t, a, b))
                elif self._ftv.get((node, a)) == b:
                    self._apply_flow(node, fm.on_timer(t, a))
                else:
                    continue
                self._sync_flows(node)
                continue
            if kind == _GONE:
                self._on_gone(node)
                continue
            if node in self.dead:  # (a computation cut short by the crash is not counted)
                continue
            m = self.nodes[node]
            self.events += 1
            if kind == _MSG:
                if self.observer is not None:
                    self.observer(node, "msg", (a, b))
                mt = type(b)
                if mt in PHASE_MSGS:
                    self._phase_message(node, a, b)
                elif mt in LEADER_MSGS:
                    if node in self.leaders:
                        self._leader_event(node, self.leaders[node].on_message(t, a, b))
                else:
                    self._unpresume(node)
                    self._apply(node, m.on_message(t, a, b))
            elif kind == _TIMER:
                if self._tv.get((node, a)) != b:
                    continue
                component, key = a
                if component == "rec":
                    self._unpresume(node)
                    self._apply(node, m.on_timer(t, key))
                elif component == "phase":
                    self._apply_phase(node, self.phases[node].on_timer(t, key))
                else:
                    self._leader_event(node, self.leaders[node].on_timer(t, key))
            elif kind == _RESYNC:
                nxt, prv = self._next_prev(node)
                self._apply(node, m.aggregation_done(t, a))
                self._apply_phase(node, self.phases[node].resynced(t, a + 1, nxt, prv))
            else:
                ckind, key, dur, start = a
                if ckind == "aggregate":
                    pend = self._agg_pending.get(node)
                    if pend is None or pend[1] != b:
                        continue
                    del self._agg_pending[node]
                else:
                    self._it(key[2]).compute_s += dur
                if self.trace is not None:
                    self._trace_compute(node, m, ckind, key, dur, start)
                if ckind == "aggregate":
                    self._step_done(node, key[1])
                else:
                    self._unpresume(node)
                    self._apply(node, m.on_compute_done(t, key, ckind))
                if self.observer is not None:
                    self.observer(node, "done", (key, ckind))
            if node in self.data and (node, m.iteration) not in self._done_at and m.iteration in m.reported:
                self._done_at[(node, m.iteration)] = t  # its microbatches of the iteration are all settled
                if len(self._active()) > 0:
                    self._schedule_reflow()

    def _on_gone(self, gone: str) -> None:
        """The membership layer tells every live node that `gone` is gone.  The aggregation phase always
        hears it (the all-reduce needs the live group); the flow and microbatch machines only with `detect`
        (without it they find crashes by their own timeouts)."""
        self.reported_gone.add(gone)
        if self.detect and self.machines:
            self._flow_gone(gone)
        for nid in sorted(self.nodes):
            if nid in self.dead or nid == gone:
                continue
            nxt, prv = self._next_prev(nid)
            self._apply_phase(nid, self.phases[nid].forget(self.now, gone, nxt, prv))
            if self.detect:
                self._apply(nid, self.nodes[nid].peer_gone(self.now, gone))
        for d in self._live_data():
            if self._leading(d):
                self._apply_phase(d, self._maybe_begin(d))

    def _trace_compute(self, node: str, m, ckind: str, key, dur: float, start: float) -> None:
        self.trace.append(("compute", start, self.now, node, ckind, key, dur))
        if ckind == "final" and node in self.data:
            dm = getattr(m, "mbs", {}).get(key)
            if dm is not None:
                self.trace.append(("path", self.now, key, tuple(dm.path), dm.attempt, dm.rounds))

    # ---- results -----------------------------------------------------------
    def waste_breakdown(self, iterations: int) -> dict[str, float]:
        """Wasted compute (seconds, summed over the closed iterations) by cause; needs `trace`.

        Matches `report`'s wasted compute: a completed microbatch's useful work is one forward (or
        recompute) and one backward per stage on its final path plus its data node's forward, loss and
        final; everything else is waste, put in: `deferred` (work on microbatches deferred),
        `lost_in_crash` (off the final path, done by a relay that crashed before the microbatch completed: the
        work died with it, and the crash is why the final path does not hold it), `off_path_crashed_later` (off
        the final path, done by a relay that crashed only after the microbatch completed: it was abandoned for
        another reason, as `off_path_live`), `off_path_live` (off the final path on a relay still alive:
        abandoned attempts and branches),
        `repeated_on_path` (a relay of the final path doing its stage again: restarts),
        `data_node` (a data node's repeated work: restarts)."""
        if self.trace is None:
            raise ValueError("set `trace` to a list before `run`")
        paths = {e[2]: e[3] for e in self.trace if e[0] == "path"}
        done_at = {e[2]: e[1] for e in self.trace if e[0] == "path"}
        crashed = {n: t for t, n in self.crashes}
        out = dict.fromkeys(("deferred", "lost_in_crash", "off_path_crashed_later", "off_path_live",
                             "repeated_on_path", "data_node"), 0.0)
        seen: set = set()
        for e in self.trace:
            if e[0] != "compute" or e[4] == "aggregate" or e[5][2] >= iterations:
                continue
            _, _, _, node, kind, key, dur = e
            if key not in paths:
                out["deferred"] += dur
                continue
            if node in self.data:
                u = (key, node, kind)
                cause = "data_node"
            elif paths[key][self.stage[node]] == node:
                u = (key, node, "bwd" if kind == "backward" else "fwd")
                cause = "repeated_on_path"
            else:
                u = None
                if node not in crashed:
                    cause = "off_path_live"
                else:
                    cause = "lost_in_crash" if crashed[node] < done_at[key] else "off_path_crashed_later"
            if u is not None and u not in seen:
                seen.add(u)
                continue
            out[cause] += dur
        return out

    def ledger_check(self, iterations: int) -> tuple[int, int, int]:
        """(lost, deferred, completed twice) over the closed iterations."""
        lost = deferred = twice = 0
        for d in self.data:
            led = self.nodes[d].ledger
            for it, row in led.entries.items():
                if it >= iterations or it >= self.data_crashed.get(d, math.inf):
                    continue  # (a crashed data node's open iteration died with it, its ledger too)
                for st in row.values():
                    if st in (MbStatus.PENDING, MbStatus.INFLIGHT):
                        lost += 1
                    elif st is MbStatus.DEFERRED:
                        deferred += 1
            done = led.completed_everywhere()
            twice += len(done) - len(set(done))
        return lost, deferred, twice

    def report(self, iterations: int) -> dict:
        per = []
        for it in range(iterations):
            st = self.iters.get(it)
            completed = sum(self.nodes[d].ledger.counts(it)["completed"] for d in self.data
                            if self.data_crashed.get(d, math.inf) > it)
            alive = [d for d in self.data if self.data_crashed.get(d, math.inf) > it]
            if st is None or any(d not in st.closed for d in alive):
                per.append({"iteration": it, "finished": False, "completed": completed})
                continue
            dur = max(st.closed[d] - st.opened[d] for d in alive)
            useful = completed * IDEAL_MB_S
            per.append({
                "iteration": it, "finished": True, "completed": completed, "iteration_s": dur,
                "time_per_microbatch_s": dur / completed if completed else math.inf,
                "communication_time_s": st.transfer_s / completed if completed else st.transfer_s,
                "wasted_compute_s": max(0.0, st.compute_s - useful),
                "lost_contributions": st.lost_contrib,
                "lost_contribution_compute_s": st.lost_contrib_s,
            })
        lost, deferred, twice = self.ledger_check(iterations)
        unfinished = sum(1 for p in per if not p["finished"])
        fin = [p for p in per if p["finished"]]

        def mean(k: str) -> float:
            vals = [p[k] for p in fin if math.isfinite(p[k])]
            return statistics.fmean(vals) if vals else math.nan

        stats = {k: 0 for k in ("reroutes", "denies_sent", "deferred", "probes", "recovers", "resends", "restarts",
                                "gave_up", "presumed_dead", "stale")}
        for m in self.nodes.values():
            for k in stats:
                stats[k] += getattr(m.stats, k)
        phase_stats = {"resent": 0, "duplicates": 0, "refused_not_leading": 0, "out_of_step": 0}
        for ph in self.phases.values():
            for k in phase_stats:
                phase_stats[k] += getattr(ph.stats, k)
        phase_stats.update(elections=self.elections, resyncs=self.resyncs, dropped=self.dropped)
        return {
            "setting": self.setting.name, "policy": self.policy, "churn": self.churn, "seed": self.seed,
            "iterations": iterations,
            "time_per_microbatch_s": mean("time_per_microbatch_s"),
            "throughput_per_iteration": statistics.fmean([p["completed"] for p in per]) if per else 0.0,
            "communication_time_s": mean("communication_time_s"),
            "wasted_compute_s": mean("wasted_compute_s"),
            "lost_microbatches": lost + twice + unfinished * 0,
            "unfinished_iterations": unfinished,
            "deferred_microbatches": deferred,
            "lost_contributions": sum(p.get("lost_contributions", 0) for p in fin),
            "lost_contribution_compute_s": mean("lost_contribution_compute_s"),
            "crashes": len(self.crashes), "joins": self.joins, "routing": self.routing,
            "flow_messages": self.flow_messages,
            "protocol": stats,
            "phases": phase_stats,
            "per_iteration": per,
        }


def run_train(setting: str, policy: str, churn: float, iterations: int, seed: int, *, breakdown: bool = False,
              data_nodes: int = len(DATA_NODES), **options) -> dict:
    """One run; `options` are TrainSim's model switches (routing, reflow, lend, flow_options, detect,
    join_mid_iteration, swarm_reacts_to, gwtf_acts_on_gone, unpresume, can_take, one_wave, ...: see TrainSim).
    `breakdown`: trace the run and add `waste_breakdown_s` (seconds per iteration by cause,
    `TrainSim.waste_breakdown`)."""
    s = make_setting(setting, seed, data_nodes)
    sim = TrainSim(s, policy, churn, seed, **options)
    if breakdown:
        sim.trace = []
    sim.run(iterations)
    rep = sim.report(iterations)
    if breakdown:
        n = max(1, sum(1 for p in rep["per_iteration"] if p["finished"]))
        rep["waste_breakdown_s"] = {k: v / n for k, v in sim.waste_breakdown(iterations).items()}
    return rep

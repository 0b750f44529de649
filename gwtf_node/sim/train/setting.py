"""The Table II setting: stages, relays and capacities, links, compute times, the optimal flows
(docs/sim_train.md says what is modelled and why)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ...protocol.cost import link_cost
from ...protocol.scenario import parse_scenario, published_bandwidth_mbps

SETTINGS = ("table2-homogeneous", "table2-heterogeneous")
# Table VI of the GWTF paper (optimality against DT-FM): 3 data nodes, 3 homogeneous relays in each of the 5 relay
# stages, 4 microbatches per data node; "-xK": K times the data nodes and the relays (scripts/bench_optimality.py)
TABLE6_SCALES = (1, 2, 4, 8)
TABLE6_SETTINGS = tuple(f"table6-x{k}" for k in TABLE6_SCALES)
# Table VI's counts with the bandwidth clusters of geo12-links.json made real: the 12 locations grouped by region,
# each region holding a third of the data nodes and of the relays ("-xK" as Table VI's; make_geo12)
GEO12_REGIONS = {"Europe": ("Belgium", "Germany", "London", "NL"),
                 "North America": ("Canada", "Iowa", "LA", "Oregon"),
                 "Asia-Pacific": ("Australia", "Japan", "Singapore", "Taiwan")}
GEO12_SETTINGS = tuple(f"geo12-x{k}" for k in TABLE6_SCALES)
STAGE_SIZES = (4, 3, 3, 3, 3)
DATA_NODES = ("d0", "d1")
MICROBATCHES = 4
ACTIVATION_MB = 8.0 * 1.048576 * 32  # 8 MiB x 32, in MB
STAGE_STATE_MB = 38e6 * 4 * 3 / 1e6  # weights + Adam moments of 3 blocks, fp32 (RELAY_PARAMS below)
PROFILE_FILE = Path(__file__).resolve().parents[2] / "data" / "stage_profile.json"  # scripts/profile_stages.py
_RATIO = json.loads(PROFILE_FILE.read_text())["ratio_to_relay_forward"]
FORWARD_S = 0.35  # the anchor: a relay stage's forward on the paper's GPU (docs/sim_train.md)
BACKWARD_S = FORWARD_S * _RATIO["relay_backward"]
DATA_FWD_S = FORWARD_S * _RATIO["data_forward"]
DATA_LOSS_S = FORWARD_S * _RATIO["data_loss"]
DATA_FINAL_S = FORWARD_S * _RATIO["data_final"]
# The step of the aggregation phase (allreduce.py): the gradient of a stage is its parameters in fp32 (not scaled
# like the activations); a relay stage has 3 blocks of d = 1024 (4 d^2 attention + 3 d x 2752 MLP: 12.6 M parameters
# each), the data nodes' part the embedding and the head (32000 x 1024 each) and one block.
RELAY_PARAMS = 38e6
DATA_PARAMS = 2 * 32000 * 1024 + RELAY_PARAMS / 3
# Adam over a relay stage reads and writes ~0.6 GB: ~5 ms on the paper's GPU (448 GB/s, shared by ~3.6 nodes); 0.1 s
# bounds it generously, and the all-reduce's transfers (seconds) dominate anyway.
OPTIMIZER_STEP_S = 0.1
ALLREDUCE_TIMEOUT_S = 120.0  # the daemon's (runtime/node/aggregation.py): a round waits this long for a named member
REJOIN_S = 60.0
# membership: every node learns of a crash this long after it: the daemon's own liveness check (runtime/node/liveness.py:
# a check every PING_EVERY_S = 1 s, dead after DEAD_AFTER_S = 6 s of silence; a test keeps them equal).  60 s
# (heartbeats / DHT entries expiring) is a bench row.
DAEMON_DETECT_S = 7.0
DETECT_S = DAEMON_DETECT_S
# a relay of a middle stage gives a data node the loose deadline (LOOSE_DEAD_AFTER_S = 30 s, liveness.py): it learns
# of a data node's crash this long after it
MIDDLE_DATA_DETECT_S = 31.0
# a relay watches the relays it does not work with loosely too (same deadline): those of its stage and the stages next
# to it learn of a relay's crash this long after it, or DETECT_S after they send it a microbatch's message
IDLE_DETECT_S = 31.0
# ... or, for a watcher that watches more than 12 peers loosely, 2.5 s per peer plus the check's second (liveness.py's
# `loose_floor_s`: a node's loose Pings stay under 1.2 a second however many relays are near it)
LOOSE_S_PER_PEER = 2.5


def loose_detect_s(floor_s: float, per_peer_s: float, loose_peers: int) -> float:
    """When a node that watches `loose_peers` peers loosely learns of a crash of one of them: the floor
    (`idle_detect_s`, `middle_data_detect_s`), or `per_peer_s` per peer and the check's second when that is more."""
    return max(floor_s, per_peer_s * loose_peers + DAEMON_DETECT_S - SILENCE_S)  # (per_peer_s 0: the floor)
FLOW_CONVERGE_S = 60.0  # the flow machines settle this long after a change (paper: ~120 rounds, "roughly a minute")
MAX_SIM_S_PER_ITERATION = 4 * 3600.0
LINKS_FILE = Path(__file__).resolve().parents[2] / "data" / "geo12-links.json"  # shipped with the package

SILENCE_S = DAEMON_DETECT_S - 1.0  # the daemon's DEAD_AFTER_S: a peer silent this long is no longer heard
PRIOR_RULES = ("links", "modelled")  # the recovery machines' timing priors: the daemon's rule, or TrainSim._prior's model
ROUTINGS = ("machines", "oracle", "dtfm")  # dtfm: DT-FM's static schedule (`sim/schedule/`)
SWARM_REACTIONS = ("membership", "timeouts")  # what makes a SWARM data node restart a microbatch (docs/sim_train.md)
# The flow machines run with the defaults of protocol/flow/, as in the daemon: with two data nodes free-running labels with
# ordered launches, relabelling and cross displacement.  (Before ordered launches coalesced free-running labels, they
# fell into a CostAnnounce storm after some crash sequences, e.g. seed 1, homogeneous, 20% churn: 800k messages
# within 3 s of virtual time, and the simulator ran them with label waves; the same run now takes 1.4 s of CPU.
# Waves stay a sensitivity row of scripts/bench_churn.py.)
FLOW_OPTIONS: dict = {}


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

    def flow_cost(self, a: str, b: str) -> float:
        """d(a, b) of Equation 1 (ms) for an activation, both directions of the link: what a flow machine and
        the leader's placement count for it (`parse_scenario` computes the same for a scenario's links)."""
        (la, ba), (lb, bb) = self.link(a, b), self.link(b, a)
        return link_cost(0.0, 0.0, la, lb, ba, bb, ACTIVATION_MB)

    def transfer_s(self, a: str, b: str, mb: float) -> float:
        lat_ms, bw = self.link(a, b)
        return lat_ms / 1000.0 + mb * 8.0 / bw


def make_net(nodes: list[str], rng: random.Random, where: dict[str, tuple[str, ...]] | None = None) -> Net:
    """Every node at a location drawn uniformly from the 12, or from `where[node]` when given."""
    raw = _load_links()
    locs = raw["locations"]
    lat: dict = {}
    bw: dict = {}
    for e in raw["links"]:
        b = published_bandwidth_mbps(e["bandwidth_mbps"])
        for x, y in ((e["a"], e["b"]), (e["b"], e["a"])):
            lat[(x, y)] = e["latency_ms"]
            bw[(x, y)] = b
    intra = (raw["intra_location"]["latency_ms"], raw["intra_location"]["bandwidth_mbps"])
    where = where or {}
    for n, w in where.items():
        if not w or set(w) - set(locs):
            raise ValueError(f"{n}: locations {sorted(set(w) - set(locs))} are not in {LINKS_FILE.name}")
    return Net({n: rng.choice(where.get(n, locs)) for n in nodes}, lat, bw, intra)


@dataclass
class Setting:
    name: str
    relays: dict[str, tuple[int, int]]  # id -> (stage, capacity)
    net: Net
    data: tuple[str, ...] = DATA_NODES


def make_setting(name: str, seed: int, data_nodes: int | None = None) -> Setting:
    """Table II's relays and links; `data_nodes` data nodes (None: 2 as in the paper; a third one draws its
    location after the relays, so the relays' locations do not depend on it).  A Table VI name
    (TABLE6_SETTINGS): `make_table6`; a geo12 name (GEO12_SETTINGS): `make_geo12`."""
    if name in TABLE6_SETTINGS:
        return make_table6(int(name.rsplit("x", 1)[1]), seed, data_nodes)
    if name in GEO12_SETTINGS:
        return make_geo12(int(name.rsplit("x", 1)[1]), seed, data_nodes)
    if name not in SETTINGS:
        raise ValueError(f"unknown setting {name!r}: one of {SETTINGS + TABLE6_SETTINGS + GEO12_SETTINGS}")
    if data_nodes is None:
        data_nodes = len(DATA_NODES)
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


def make_table6(scale: int, seed: int, data_nodes: int | None = None) -> Setting:
    """Table VI's setting times `scale`: 3 x scale data nodes (or `data_nodes`), 3 x scale relays of capacity
    MICROBATCHES in each of the 5 relay stages, every node at one of the 12 locations (data nodes drawn first)."""
    if scale < 1:
        raise ValueError(f"scale is {scale}: it must be at least 1")
    n_data = 3 * scale if data_nodes is None else data_nodes
    if n_data < 1:
        raise ValueError(f"data_nodes is {n_data}: a run needs at least one data node")
    name = f"table6-x{scale}"
    rng = random.Random(f"setting:{name}:{seed}")
    relays = {f"s{s}r{i}": (s, MICROBATCHES) for s in range(len(STAGE_SIZES)) for i in range(3 * scale)}
    data = tuple(f"d{i}" for i in range(n_data))
    net = make_net(list(data) + list(relays), rng)
    return Setting(name, relays, net, data)


def make_geo12(scale: int, seed: int, data_nodes: int | None = None) -> Setting:
    """Table VI's counts (3 x scale data nodes, 3 x scale relays of capacity MICROBATCHES in each of the 5 relay
    stages, the same names) over the three regions of GEO12_REGIONS: data node i in region i mod 3, the relays
    dealt to the regions in equal numbers (5 x scale each) in a shuffled order, so the stages the setting gives
    them ignore the regions; every node at one of its region's 4 locations, uniformly."""
    if scale < 1:
        raise ValueError(f"scale is {scale}: it must be at least 1")
    n_data = 3 * scale if data_nodes is None else data_nodes
    if n_data < 1:
        raise ValueError(f"data_nodes is {n_data}: a run needs at least one data node")
    name = f"geo12-x{scale}"
    rng = random.Random(f"setting:{name}:{seed}")
    regions = list(GEO12_REGIONS.values())
    relays = {f"s{s}r{i}": (s, MICROBATCHES) for s in range(len(STAGE_SIZES)) for i in range(3 * scale)}
    data = tuple(f"d{i}" for i in range(n_data))
    slots = [i % len(regions) for i in range(len(relays))]
    rng.shuffle(slots)
    where = {d: regions[i % len(regions)] for i, d in enumerate(data)}
    where.update({r: regions[k] for r, k in zip(relays, slots)})
    return Setting(name, relays, make_net(list(data) + list(relays), rng, where), data)


def gradient_mb(stage: int) -> float:
    """MB of the gradient a member of `stage` (-1: the data nodes) all-reduces."""
    return (DATA_PARAMS if stage < 0 else RELAY_PARAMS) * 4 / 1e6


def compute_s(node_stage: int, kind: str) -> float:
    if node_stage < 0:
        return {"forward": DATA_FWD_S, "loss": DATA_LOSS_S, "final": DATA_FINAL_S}[kind]
    return BACKWARD_S if kind == "backward" else FORWARD_S  # forward, recompute


IDEAL_MB_S = DATA_FWD_S + DATA_LOSS_S + DATA_FINAL_S + len(STAGE_SIZES) * (FORWARD_S + BACKWARD_S)


def restage(setting: Setting, groups: list[list[str]]) -> tuple[Setting, dict[str, str]]:
    """The setting with the relays of `groups[s]` in stage s, renamed `s<stage>r<i>` (same location, same
    capacity), and the renaming (old id -> new id)."""
    relays: dict[str, tuple[int, int]] = {}
    loc = {d: setting.net.loc[d] for d in setting.data}
    rename: dict[str, str] = {}
    for s, group in enumerate(groups):
        for i, old in enumerate(group):
            new = f"s{s}r{i}"
            rename[old] = new
            relays[new] = (s, setting.relays[old][1])
            loc[new] = setting.net.loc[old]
    net = type(setting.net)(loc, setting.net.lat, setting.net.bw, setting.net.intra)
    return Setting(setting.name, relays, net, setting.data), rename


def swarm_placement(setting: Setting, max_evaluations: int | None = None) -> Setting:
    """The setting with every relay where the daemon's leader puts a swarm forming from scratch
    (`protocol/swarmplace.place_new_swarm`): every relay a candidate, each telling the Equation 1 cost of its
    link to every other node (the daemon's joiner tells its measured links, up to MAX_LINKS_REPORTED)."""
    from ...protocol.placement import Candidate
    from ...protocol.swarmplace import DEFAULT_SWARM_EVALUATIONS, place_new_swarm

    S, net = len(STAGE_SIZES), setting.net
    nodes = sorted(list(setting.data) + list(setting.relays))
    told = {r: [(p, net.flow_cost(r, p)) for p in nodes if p != r] for r in sorted(setting.relays)}
    cands = [Candidate(r, c, (1.0,) * S) for r, (_, c) in sorted(setting.relays.items())]
    stages = place_new_swarm(cands, told, setting.data, S,
                             DEFAULT_SWARM_EVALUATIONS if max_evaluations is None else max_evaluations)
    if stages is None:
        raise ValueError(f"{setting.name}: fewer relays than stages, a whole-swarm placement does not apply")
    return restage(setting, [sorted(r for r, k in stages.items() if k == s) for s in range(S)])[0]


def flow_scenario(setting: Setting, data_capacity: int | dict = MICROBATCHES):
    """The setting as a flow scenario: each data node with `data_capacity` units, linked to the first and last
    relay stages, each relay to the relays of the next stage."""
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
    from ..baselines import max_flow_value, optimal_routing
    if active is None:
        active = setting.data
    if not active:
        return {}
    total = max_flow_value(flow_scenario(setting, {d: MICROBATCHES for d in active}))
    share = max(1, min(MICROBATCHES, -(-total // len(active))))
    res = optimal_routing(flow_scenario(setting, {d: share for d in active}))
    out: dict[str, dict[str, dict[str, int]]] = {}
    for f in res.flows:
        hops = (f.data_node, *f.path, f.data_node)
        for a, b in zip(hops, hops[1:-1] + (f.data_node,)):
            if a == b:
                continue
            o = out.setdefault(a, {}).setdefault(f.data_node, {})
            o[b] = o.get(b, 0) + 1
    return out

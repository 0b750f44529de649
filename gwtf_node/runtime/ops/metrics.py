"""Prometheus metrics of a node (`gwtf-node join --metrics-port N`): the dashboard's figures, for scraping.

`prometheus_client.start_http_server` serves them from a thread of its own
on `--metrics-host` (127.0.0.1 by default: expose it on purpose).  A scrape
never touches the node's components: the collector reads the view the status
loop built last (status.py, `latest_view`, a new dict every second), so the
figures are at most a second old and no lock is needed.

Names follow Prometheus' conventions: a `gwtf_` prefix, the unit in the
name (`_seconds`, `_bytes_per_second`, `_ratio`), `_total` on counters (the
client adds it to counter families), labels for peers, stages and kinds.
A peer label is its readable name (the --name, else the last characters of
its peer id); `gwtf_node_info` maps this node's name to its peer id.
`docker/grafana-dashboard.json` is an example dashboard over these series.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric,
                                    StateSetMetricFamily)

from .startup import PortInUse

log = logging.getLogger("gwtf.metrics")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class ViewCollector:
    """A prometheus_client collector over the latest status view (`view()` returns it, or None before the first)."""

    def __init__(self, view: Callable[[], dict | None], states: Sequence[str]) -> None:
        self.view = view
        self.states = list(states)  # every value of the node's state (status.NodeState)

    def describe(self) -> Iterable[Metric]:
        return []  # the series depend on the swarm (peers, stages): collected only at scrape time

    def collect(self) -> Iterable[Metric]:
        v = self.view()
        if v is None:
            return
        yield from _node(v, self.states)
        yield from _election(v)
        yield from _microbatches(v)
        yield from _links(v)
        yield from _stages_and_flows(v)
        events = CounterMetricFamily("gwtf_events", "Events seen since start, by kind (crash, reroute, join, ...)",
                                     labels=["kind"])
        for kind, n in sorted(v.get("event_counts", {}).items()):
            events.add_metric([kind], n)
        yield events


def _node(v: dict, states: list[str]) -> Iterable[Metric]:
    n = v["node"]
    info = InfoMetricFamily("gwtf_node", "This node: peer id, name, role, stage, run")
    info.add_metric([], {"peer_id": n["peer_id"], "name": n["name"], "role": n["role"],
                         "stage": "" if n["stage"] is None else str(n["stage"]), "run_id": n["run_id"],
                         "policy": n["policy"]})
    yield info
    state = StateSetMetricFamily("gwtf_node_state", "What the node is doing")
    state.add_metric([], {s: s == n["state"] for s in states})
    yield state
    yield GaugeMetricFamily("gwtf_capacity_microbatches", "Microbatches this node holds per iteration",
                            value=n["capacity"])
    yield CounterMetricFamily("gwtf_optimizer_steps", "Optimizer steps applied to this node's part",
                              value=n["steps_applied"])
    yield CounterMetricFamily("gwtf_compute_seconds", "Seconds spent in stage computations",
                              value=n["compute_s"])
    yield CounterMetricFamily("gwtf_refused_frames", "Frames from peers refused (malformed, unexpected)",
                              value=n["refused_frames"])
    yield CounterMetricFamily("gwtf_handler_faults", "Frames whose handling failed on a fault of this node (logged "
                              "with its traceback; the node runs on)", value=n.get("handler_faults", 0))
    it = v["iteration"]
    if it["number"] is not None:
        yield GaugeMetricFamily("gwtf_iteration", "The iteration in flight (or about to open)", value=it["number"])
    if it["seconds"] is not None:
        yield GaugeMetricFamily("gwtf_iteration_elapsed_seconds", "Seconds since this data node opened the "
                                "iteration in flight", value=it["seconds"])
    loss = v["loss"]
    if loss["this_node"] is not None:
        yield GaugeMetricFamily("gwtf_loss", "Mean loss of this data node's completed microbatches, last "
                                "iteration", value=loss["this_node"])
    if loss["run"] is not None:
        yield GaugeMetricFamily("gwtf_run_loss", "Mean loss of the run's last iteration (the leader's record)",
                                value=loss["run"])


def _election(v: dict) -> Iterable[Metric]:
    e = v["election"]
    if e["term"] is not None:
        yield GaugeMetricFamily("gwtf_leader_term", "Term of the leader this node knows", value=e["term"])
    yield GaugeMetricFamily("gwtf_is_leader", "1 while this node is the acting leader", value=int(e["is_leader"]))
    if e["lease_remaining_s"] is not None:
        yield GaugeMetricFamily("gwtf_leader_lease_remaining_seconds", "Seconds left on the leader's lease (a "
                                "follower: on its promise to the leader)", value=e["lease_remaining_s"])
    reach = GaugeMetricFamily("gwtf_voter_reachable", "1 if the voter (a data node) was heard recently",
                              labels=["voter"])
    for voter in e["voters"]:
        reach.add_metric([voter["name"]], int(voter["reachable"]))
    yield reach


def _microbatches(v: dict) -> Iterable[Metric]:
    mb = v["microbatches"]
    yield CounterMetricFamily("gwtf_microbatches_completed", "Microbatches completed end to end (a relay: "
                              "contributions counted in its stage's all-reduce)", value=mb["completed"])
    for key, what in (("deferred", "deferred to the next iteration"), ("lost", "neither completed nor deferred")):
        if mb[key] is not None:
            yield CounterMetricFamily(f"gwtf_microbatches_{key}", f"This data node's microbatches {what}",
                                      value=mb[key])
    yield CounterMetricFamily("gwtf_wasted_compute_seconds", "Compute seconds on microbatch work that did not "
                              "count (dead attempts, deferred work, recomputations)", value=mb["wasted_compute_s"])
    yield CounterMetricFamily("gwtf_useful_compute_seconds", "Compute seconds on microbatch work that counted",
                              value=mb["useful_compute_s"])
    yield CounterMetricFamily("gwtf_lost_contributions", "Gradients of completed microbatches that died with a "
                              "relay before the all-reduce", value=mb["lost_contributions"])
    rec = CounterMetricFamily("gwtf_recovery_actions", "The recovery machine's actions, by kind", labels=["action"])
    for k, n in sorted(mb["recovery"].items()):
        rec.add_metric([k], n)
    yield rec
    hold = GaugeMetricFamily("gwtf_microbatches_held", "Microbatches a relay holds, by phase", labels=["phase"])
    for k, n in sorted(mb["holding"].items()):
        hold.add_metric([k], n)
    yield hold


def _links(v: dict) -> Iterable[Metric]:
    lat = GaugeMetricFamily("gwtf_link_latency_seconds", "One-way latency to a neighbour (measured round trip / 2, "
                            "or the emulated link's)", labels=["peer"])
    rtt = GaugeMetricFamily("gwtf_link_rtt_seconds", "Measured round trip to a neighbour", labels=["peer"])
    bw = GaugeMetricFamily("gwtf_link_bandwidth_bytes_per_second", "Bandwidth of the link in the cost model "
                           "(emulated, or assumed when none is given)", labels=["peer", "source"])
    cost = GaugeMetricFamily("gwtf_link_cost", "Cost of the link in the flow machine (Equation 1)", labels=["peer"])
    up = GaugeMetricFamily("gwtf_peer_up", "1 if the neighbour was heard recently", labels=["peer", "connection"])
    for nb in v["neighbours"]:
        p = nb["name"]
        if _num(nb["latency_ms"]) is not None:
            lat.add_metric([p], nb["latency_ms"] / 1000.0)
        if _num(nb["rtt_ms"]) is not None:
            rtt.add_metric([p], nb["rtt_ms"] / 1000.0)
        bw.add_metric([p, nb["bandwidth_source"]], nb["bandwidth_mbps"] * 1e6 / 8)
        if _num(nb["link_cost"]) is not None:
            cost.add_metric([p], nb["link_cost"])
        up.add_metric([p, nb["connection"]], int(nb["alive"]))
    yield from (lat, rtt, bw, cost, up)


def _stages_and_flows(v: dict) -> Iterable[Metric]:
    util = GaugeMetricFamily("gwtf_stage_utilization_ratio", "Flows through a stage / its capacity (the "
                             "leader's utilization round)", labels=["stage"])
    members = GaugeMetricFamily("gwtf_stage_members", "Relays of a stage this node knows, by state",
                                labels=["stage", "state"])
    for s in v["stages"]:
        if s["utilization"] is not None:
            util.add_metric([str(s["stage"])], s["utilization"])
        counts: dict[str, int] = {}
        for mem in s["members"]:
            counts[mem["state"]] = counts.get(mem["state"], 0) + 1
        for state, n in sorted(counts.items()):
            members.add_metric([str(s["stage"]), state], n)
    flows = GaugeMetricFamily("gwtf_flow_units", "Units of flow through this node, per data node, direction and "
                              "neighbour", labels=["data_node", "direction", "peer"])
    for f in v["flows"]:
        flows.add_metric([f["data_node_name"], f["direction"], f["peer_name"]], f["units"])
    yield from (util, members, flows)


class MetricsServer:
    """The exporter's HTTP server (a thread of prometheus_client); `close` stops it."""

    def __init__(self, view: Callable[[], dict | None], host: str, port: int, states: Sequence[str]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ViewCollector(view, states))
        self.registry.register(ProcessCollector(registry=None))
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise PortInUse(host, port, "metrics port", "choose another --metrics-port") from e
        self.port = self.server.server_port
        log.info("Prometheus metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


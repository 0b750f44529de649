"""The Prometheus exporter over a real view (tests/data, read from a running swarm): scraped and parsed.

tests/swarm/test_dashboard_swarm.py scrapes a running data node too.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gwtf_node.runtime.ops.metrics import MetricsServer
from gwtf_node.runtime.node.status import NodeState

DATA = Path(__file__).resolve().parents[1] / "data"


def scrape(port: int) -> dict[str, list]:
    """name -> samples of each family in the exposition of 127.0.0.1:port."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict, sample: str, **labels: str) -> float:
    name = sample if sample in families else sample.removesuffix("_total")  # (counters' family drops _total)
    for s in families[name]:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample}{labels}")


def test_metrics_follow_the_view_and_the_naming_conventions() -> None:
    view = json.loads((DATA / "status_view_d0.json").read_text())
    server = MetricsServer(lambda: view, "127.0.0.1", 0, [s.value for s in NodeState])
    try:
        fam = scrape(server.port)
    finally:
        server.close()
    assert value(fam, "gwtf_iteration") == view["iteration"]["number"]
    assert value(fam, "gwtf_microbatches_completed_total") == view["microbatches"]["completed"]
    assert value(fam, "gwtf_microbatches_deferred_total") == 0 and value(fam, "gwtf_microbatches_lost_total") == 0
    assert value(fam, "gwtf_leader_term") == view["election"]["term"] and value(fam, "gwtf_is_leader") == 1
    assert value(fam, "gwtf_loss") == view["loss"]["this_node"]
    for nb in view["neighbours"]:
        assert value(fam, "gwtf_link_latency_seconds", peer=nb["name"]) == nb["latency_ms"] / 1000
    assert value(fam, "gwtf_node_info", name="d0", role="data", stage="") == 1
    assert value(fam, "gwtf_node_state", gwtf_node_state=view["node"]["state"]) == 1
    assert value(fam, "gwtf_events_total", kind="join") == view["event_counts"]["join"]
    assert value(fam, "gwtf_stage_utilization_ratio", stage="0") == view["stages"][0]["utilization"]
    for name, samples in fam.items():
        if name.startswith("gwtf_") and samples and samples[0].name.endswith("_total"):
            assert all(s.name.endswith("_total") for s in samples)
    assert "process_cpu_seconds" in fam  # the process' own figures beside ours


def test_no_view_yet_no_gwtf_series() -> None:
    server = MetricsServer(lambda: None, "127.0.0.1", 0, [s.value for s in NodeState])
    try:
        fam = scrape(server.port)
    finally:
        server.close()
    assert not [n for n in fam if n.startswith("gwtf_")]


def test_the_grafana_dashboard_asks_only_for_exported_series() -> None:
    import re

    view = json.loads((DATA / "status_view_d0.json").read_text())
    server = MetricsServer(lambda: view, "127.0.0.1", 0, [s.value for s in NodeState])
    try:
        fam = scrape(server.port)
    finally:
        server.close()
    exported = {s.name for samples in fam.values() for s in samples}
    dash = json.loads((Path(__file__).resolve().parents[2] / "docker" / "grafana-dashboard.json").read_text())
    asked = {name for p in dash["panels"] for t in p["targets"] for name in re.findall(r"gwtf_[a-z_]+", t["expr"])}
    assert asked and asked <= exported, asked - exported

"""The daemon's commands: manifests, bad flags and files give one line and exit 2; links files resolve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf_node.cli import main
from gwtf_node.model.manifest import load_manifest
from gwtf_node.runtime.net.linkspec import LinksError, load_links, resolve_links

GEO = Path(__file__).resolve().parents[2] / "gwtf_node" / "data" / "geo12-links.json"


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    return err


def test_init_run_writes_a_loadable_manifest(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run.json"
    assert main(["init-run", "--out", str(out), "--family", "gpt", "--stages", "3", "--microbatches", "6"]) == 0
    man = load_manifest(out)
    assert man.model.family == "gpt" and len(man.stages) == 3
    assert man.data.microbatches_per_iteration == 6
    assert man.run_id in capsys.readouterr().out


def test_init_run_with_own_data(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("hello world, this is a small corpus of text. " * 200)
    out = tmp_path / "run.json"
    assert main(["init-run", "--out", str(out), "--data", str(text)]) == 0
    assert load_manifest(out).data.source == [str(text)]


@pytest.mark.parametrize("argv, needle", [
    (["init-run", "--out", "/nonexistent-dir/x/run.json"], "cannot write"),
    (["init-run", "--out", "r.json", "--stages", "0"], "at least 1"),
    (["init-run", "--out", "r.json", "--data", "/no/such/file.txt"], "file"),
    (["join", "--run", "/no/such/run.json", "--role", "relay", "--stage", "0"], "run.json"),
    (["local", "--iterations", "0"], "at least 1"),
    (["local", "--links", "/no/such/links.json"], "no such file"),
    (["local", "--relay-nice", "20"], "niceness in 0..19"),
    (["local", "--relay-nice", "-1"], "at least 0"),
    (["join", "--run", "/no/such/run.json", "--role", "relay"], "run.json"),  # no --stage: auto, not a crash
    (["status", "--state-dir", "/no/such/dir"], "no such directory"),
])
def test_bad_flags_and_files(tmp_path: Path, capsys, monkeypatch, argv: list[str], needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert needle in _one_line_error(capsys, argv)


def test_local_refuses_a_bad_links_file_before_starting(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "links.json"
    bad.write_text("not json")
    assert "not valid JSON" in _one_line_error(capsys, ["local", "--links", str(bad), "--workdir", str(tmp_path / "w")])
    assert not [p for p in (tmp_path / "w").iterdir() if p.is_dir()]  # no node was started


def test_join_checks_stage_and_bootstrap(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run.json"
    assert main(["init-run", "--out", str(run)]) == 0
    capsys.readouterr()
    for argv, needle in [(["--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/xyz"], "not a valid multiaddr"),
                         (["--port", "70000"], "0..65535"),
                         (["--host", "not-an-ip"], "IPv4 or IPv6"),
                         (["--state-dir", "/proc/no-such-dir/x"], "cannot create"),
                         (["--scaled-formation", "--waves-formation"], "contradict each other")]:
        assert needle in _one_line_error(capsys, ["join", "--run", str(run), "--role", "relay", *argv])
    assert "outside the run's stages" in _one_line_error(
        capsys, ["join", "--run", str(run), "--role", "relay", "--stage", "7"])
    assert "'auto' or a stage number" in _one_line_error(
        capsys, ["join", "--run", str(run), "--role", "relay", "--stage", "two"])
    assert "/p2p/" in _one_line_error(
        capsys, ["join", "--run", str(run), "--role", "relay", "--stage", "0", "--bootstrap", "/ip4/127.0.0.1/tcp/1"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in _one_line_error(capsys, ["join", "--run", str(bad), "--role", "data"])


def test_links_from_locations_and_from_a_scenario(tmp_path: Path) -> None:
    names = ["d0", "r0_0", "r1_0"]
    res = resolve_links(GEO, names)
    (tmp_path / "l.json").write_text(json.dumps(res))
    links = load_links(tmp_path / "l.json")
    assert len(links) == 6  # every ordered pair
    # round robin: d0 in Australia, r0_0 in Belgium
    geo = json.loads(GEO.read_text())
    ab = next(x for x in geo["links"] if {x["a"], x["b"]} == {"Australia", "Belgium"})
    assert links[("d0", "r0_0")][0] == pytest.approx(ab["latency_ms"])

    scen = {"stages": 1, "nodes": [], "links": [
        {"a": "d0", "b": "r0_0", "latency_ms": [10, 20], "bandwidth_mbps": 100},
        {"a": "d0", "b": "r1_0", "cost": 5},  # cost only: not shaped
        {"a": "d0", "b": "zz", "latency_ms": 1, "bandwidth_mbps": 1},  # not in this swarm
    ]}
    (tmp_path / "s.json").write_text(json.dumps(scen))
    res = resolve_links(tmp_path / "s.json", names)
    got = {(x["a"], x["b"]): (x["latency_ms"], x["bandwidth_mbps"]) for x in res["links"]}
    assert got == {("d0", "r0_0"): (10.0, 100.0), ("r0_0", "d0"): (20.0, 100.0)}


@pytest.mark.parametrize("content, needle", [
    ("[]", "no 'links' list"),
    ('{"links": [{"a": "d0", "b": "r0_0", "latency_ms": -1, "bandwidth_mbps": 5}]}', "non-negative"),
    ('{"links": [{"a": "d0", "b": "r0_0", "latency_ms": 1, "bandwidth_mbps": 0}]}', "positive"),
    ("{oops", "not valid JSON"),
])
def test_bad_links_files(tmp_path: Path, content: str, needle: str) -> None:
    p = tmp_path / "l.json"
    p.write_text(content)
    with pytest.raises(LinksError, match=needle):
        resolve_links(p, ["d0", "r0_0"])


def test_libp2p_warnings_do_not_reach_the_node_log_bare() -> None:
    """libp2p sets up its own logger on import; node logs got its warnings unformatted through Python's
    last-resort handler (hundreds of "Failed to read DHT message" lines per run)."""
    import subprocess
    import sys
    code = ("from gwtf_node.cli import _setup_logging\n"
            "_setup_logging('INFO')\n"
            "import libp2p, logging\n"  # as in the daemon: imported after the setup
            "log = logging.getLogger('libp2p.kad_dht.kad_dht')\n"
            "log.warning('dht-warning')\n"
            "log.error('dht-error')\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stderr
    assert "dht-warning" not in err
    assert "ERROR libp2p.kad_dht.kad_dht: dht-error" in err

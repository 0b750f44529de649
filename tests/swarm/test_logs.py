"""The daemon's log: floods folded into one line with a count, libraries' chatter below the default level,
a rotating node.log in the state directory beside stderr, and a real node's log free of the chatter."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gwtf_node.runtime.ops.logs import LOG_FORMAT, LibraryFilter, RepeatFilter, setup_logging

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _logger(name: str, *filters: logging.Filter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    h = logging.StreamHandler(out)
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for f in filters:
        h.addFilter(f)
    lg = logging.getLogger(name)
    lg.handlers[:] = [h]
    lg.propagate = False
    lg.setLevel(logging.DEBUG)
    return lg, out


def test_identical_lines_are_counted_within_the_window_and_reported_after_it() -> None:
    clock = Clock()
    flt = RepeatFilter(window_s=60.0, clock=clock, wall=lambda: 0.0)
    lg, out = _logger("test.repeat", flt)
    for _ in range(30):  # one a second for 30 s
        lg.warning("send Ping to %s failed: %s", "r0_1", "connection refused")
        clock.t += 1.0
    lg.warning("send Ping to %s failed: %s", "r1_0", "connection refused")  # another peer: news
    assert out.getvalue().count("send Ping to r0_1") == 1
    assert out.getvalue().count("send Ping to r1_0") == 1
    clock.t += 31.0  # the window of the first line is over: the next one carries the count
    lg.warning("send Ping to %s failed: %s", "r0_1", "connection refused")
    lines = out.getvalue().splitlines()
    assert lines[-1] == "WARNING test.repeat: send Ping to r0_1 failed: connection refused " \
                        f"(repeated 29 more times since {time.strftime('%H:%M:%S', time.localtime(0))})"
    assert len(lines) == 3


def test_changing_numbers_are_news_and_levels_are_apart() -> None:
    clock = Clock()
    flt = RepeatFilter(window_s=60.0, clock=clock)
    lg, out = _logger("test.attempts", flt)
    for attempt in range(1, 4):
        lg.warning("bootstrap unreachable: attempt %d", attempt)
    lg.error("bootstrap unreachable: attempt %d", 3)  # same text, another level
    assert len(out.getvalue().splitlines()) == 4


def test_flush_reports_what_is_still_held() -> None:
    clock = Clock()
    flt = RepeatFilter(window_s=60.0, clock=clock)
    lg, out = _logger("test.flush", flt)
    for _ in range(5):
        lg.error("all-reduce failed")
    assert out.getvalue().count("all-reduce failed") == 1
    flt.flush(lg.handlers)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("ERROR test.flush: all-reduce failed (repeated 4 more times since")
    flt.flush(lg.handlers)  # nothing held any more
    assert len(out.getvalue().splitlines()) == 2


def test_the_flushed_count_is_stamped_when_it_is_written() -> None:
    """The summary written at shutdown carries the time it is written, not the time of the last repeat."""
    clock, wall = Clock(), Clock()
    wall.t = 1_000_000.0
    flt = RepeatFilter(window_s=3600.0, clock=clock, wall=wall)
    lg, out = _logger("test.stamp", flt)
    lg.handlers[0].setFormatter(logging.Formatter("%(created).0f %(message)s"))
    for _ in range(3):
        lg.error("all-reduce failed")
    wall.t += 1200.0  # twenty minutes later the node stops
    flt.flush(lg.handlers)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("1001200 all-reduce failed (repeated 2 more times"), last


def test_one_filter_on_two_handlers_decides_once() -> None:
    clock = Clock()
    flt = RepeatFilter(window_s=60.0, clock=clock)
    outs = [io.StringIO(), io.StringIO()]
    lg = logging.getLogger("test.two")
    lg.handlers[:] = [logging.StreamHandler(o) for o in outs]
    for h in lg.handlers:
        h.addFilter(flt)
    lg.propagate = False
    for _ in range(3):
        lg.warning("same")
    assert [o.getvalue() for o in outs] == ["same\n", "same\n"]


@pytest.mark.parametrize("level, name, levelno, msg, shown", [
    (logging.INFO, "libp2p.network.auto_connector", logging.INFO,
     "Connections (0, in_flight=0) below target (200); initiating 200 new dials", False),
    (logging.INFO, "libp2p.transport.tcp.tcp", logging.ERROR, "Failed to open TCP stream: %s", False),
    (logging.INFO, "libp2p.transport.tcp.tcp", logging.ERROR, "Unexpected error opening TCP stream: %s", False),
    (logging.INFO, "libp2p.host.basic_host", logging.ERROR, "Failed to open stream to peer x:", False),
    (logging.INFO, "libp2p.kad_dht.kad_dht", logging.WARNING, "Failed to read DHT message", False),
    (logging.INFO, "libp2p.kad_dht.kad_dht", logging.ERROR, "Error in DHT maintenance loop", True),
    (logging.INFO, "gwtf.node", logging.INFO, "Failed to open TCP stream", True),  # ours: never filtered
    (logging.DEBUG, "libp2p.transport.tcp.tcp", logging.ERROR, "Failed to open TCP stream: %s", True),
    (logging.DEBUG, "libp2p.kad_dht.kad_dht", logging.WARNING, "Failed to read DHT message", True),
    (logging.DEBUG, "libp2p.kad_dht.kad_dht", logging.INFO, "refreshing", False),
])
def test_library_chatter_stays_below_the_default_level(level, name, levelno, msg, shown) -> None:
    record = logging.LogRecord(name, levelno, __file__, 1, msg, ("x",) if "%s" in msg else None, None)
    assert LibraryFilter(level).filter(record) is shown


def test_setup_writes_node_log_and_stderr(tmp_path: Path, monkeypatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    setup = setup_logging("INFO", tmp_path, max_mb=1, backups=2)
    try:
        logging.getLogger("gwtf.node").info("hello from the node")
        logging.getLogger("libp2p.network.auto_connector").info("initiating 200 new dials")
        logging.getLogger("libp2p.transport.tcp.tcp").error("Failed to open TCP stream: refused")
    finally:
        setup.close()
    text = (tmp_path / "node.log").read_text()
    assert "INFO gwtf.node: hello from the node" in text and "hello from the node" in err.getvalue()
    assert "dials" not in text + err.getvalue() and "TCP stream" not in text + err.getvalue()
    rotating = [h for h in setup.handlers if isinstance(h, logging.handlers.RotatingFileHandler)]
    assert rotating[0].maxBytes == 1024 * 1024 and rotating[0].backupCount == 2


def test_the_log_file_rotates(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    setup = setup_logging("INFO", tmp_path, max_mb=0.001, backups=2)  # about 1 kB per file
    try:
        for i in range(100):
            logging.getLogger("gwtf.node").info("line %d of the log", i)
    finally:
        setup.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["node.log", "node.log.1", "node.log.2"]
    assert "line 99 of the log" in (tmp_path / "node.log").read_text()


def test_stderr_already_the_log_file_is_not_written_twice(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "node.log"
    with open(path, "w") as fh:
        monkeypatch.setattr(sys, "stderr", fh)
        setup = setup_logging("INFO", tmp_path)
        try:
            logging.getLogger("gwtf.node").info("once")
        finally:
            setup.close()
    assert path.read_text().count("once") == 1 and setup.path == path
    assert LOG_FORMAT.startswith("%(asctime)s")


@pytest.mark.multiprocess
def test_a_real_node_log_holds_our_lines_and_no_chatter(tmp_path: Path) -> None:
    """A relay whose bootstrap peer is not there: it retries, gives up after 4 s (exit 3) and its node.log,
    written by the node itself, holds its attempts and none of libp2p's dial errors."""
    from gwtf_node.model.manifest import default_manifest, save_manifest

    run = tmp_path / "run.json"
    save_manifest(default_manifest(), run)
    state = tmp_path / "relay"
    dead = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWJwRmcgBMcj11yjpfcUvqGtUmvfigLocoLkGV21pHQhr2"
    out = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "join", "--run", str(run), "--role", "relay",
                          "--state-dir", str(state), "--bootstrap", dead, "--bootstrap-timeout", "4",
                          "--device", "cpu", "--insecure-unsigned"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 3, out.stderr[-3000:]
    log = (state / "node.log").read_text()
    assert "unreachable (Connection refused): attempt 1" in log and "attempt 2" in log
    assert "no bootstrap peer answered" in log
    for chatter in ("Failed to open TCP stream", "new dials", "AUTO_CONNECTOR_STATE", "Traceback"):
        assert chatter not in log and chatter not in out.stderr, chatter
    assert log.splitlines() == [ln for ln in out.stderr.splitlines() if ln[:4].isdigit()]  # the same lines


def test_log_words_for_a_peer_place_and_a_forgotten_peer() -> None:
    """Peers are described in words (no internal stage numbers) and keep their names after they are forgotten."""
    from gwtf_node.runtime.net.discovery import describe_place
    from gwtf_node.runtime.net.peers import PeerInfo, Peers, Place

    assert describe_place("data", -1) == "data node"
    assert describe_place("relay", 2) == "relay of stage 2"
    assert describe_place("relay", -2) == "relay without a stage yet"
    peers = Peers("ME", "r0", 2, Place("relay", 0, 4))
    pid = "12D3KooWEfE867xYabcdefghijklmnop"
    peers.peers[pid] = PeerInfo(peer_id=pid, role="relay", stage=1, name="r1_0")
    assert peers.who(pid) == "r1_0"
    peers.forget(pid)
    assert peers.who(pid) == "r1_0"  # ("redialling r1_0, presumed dead", not a peer-id prefix)
    assert peers.who("12D3KooWnobodyknowsthisone") == "12D3KooWnobodykn"


def test_a_refused_record_is_a_warning_once_per_reason(caplog) -> None:
    from gwtf_node.runtime.trust.records import RunRecords

    counted: list[str] = []
    recs = RunRecords(host=None, run_id="run", owner_public_key="", on_refused=counted.append)
    with caplog.at_level(logging.DEBUG, logger="gwtf.node"):
        for _ in range(3):
            recs._refused("provider 12D3KooWabc: a forged record")
        recs._refused("provider 12D3KooWdef: another reason")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["DHT record refused: provider 12D3KooWabc: a forged record",
                        "DHT record refused: provider 12D3KooWdef: another reason"]
    assert len(counted) == 4  # every refusal is still counted (status.json "refused")


def test_the_lines_of_every_iteration_go_to_node_log_not_stderr(tmp_path: Path, monkeypatch) -> None:
    """stderr (a terminal, the journal) carries the events; the routine lines of each iteration are in node.log."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    setup = setup_logging("INFO", tmp_path)
    try:
        for i in range(300):  # five minutes of one-second iterations
            logging.getLogger("gwtf.steps").info("iteration %d: summed in round s0/it%d/abc", i, i)
        logging.getLogger("gwtf.node").warning("peer r0_1 presumed dead")
        logging.getLogger("gwtf.steps").warning("iteration 300: stage 0 holds 2 of 4 contributions")
    finally:
        setup.close()
    log = (tmp_path / "node.log").read_text()
    assert log.count("summed in round") == 300
    assert err.getvalue().count("\n") == 2 and "presumed dead" in err.getvalue() and "2 of 4" in err.getvalue()

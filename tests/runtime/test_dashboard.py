"""The dashboard without a swarm: the event feed, the microbatch tally, frames drawn from real views, no daemon.

The two views in tests/data (`status_view_d0.json`, `status_view_r0_0.json`)
were read from the control sockets of a running local swarm (1 data node,
2 stages x 1 relay, iteration 3); tests/swarm/test_dashboard_swarm.py checks live
views against a running swarm.
"""

from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path

import pytest
import trio
from rich.console import Console

from gwtf_node.cli import main
from gwtf_node.cli.status import render
from gwtf_node.runtime.ops.control import serve
from gwtf_node.runtime.ops.events import EventFeed, EventKind, EventLog, PeerSeen, short_id
from gwtf_node.runtime.node.tally import Tally

from support.ptyutil import run_in_pty

DATA = Path(__file__).resolve().parents[1] / "data"
A = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAaaaaaa"
B = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAbbbbbb"


def _view(name: str) -> dict:
    return json.loads((DATA / f"status_view_{name}.json").read_text())


def _names(p: str) -> str:
    return {A: "d0"}.get(p, short_id(p))


def test_event_feed_tells_news_from_repeats() -> None:
    log = EventLog(size=8)
    feed = EventFeed(log, _names)
    d0, relay = PeerSeen("data", -1, False, 1), PeerSeen("relay", -2, False, 5)
    feed.peers_seen(1.0, {A: d0}, set())
    feed.peers_seen(2.0, {A: d0}, set())  # a repeat: no event
    feed.peers_seen(3.0, {A: d0, B: relay}, set())
    feed.peers_seen(4.0, {A: d0, B: PeerSeen("relay", 1, False, 5)}, set())  # placed by the leader
    feed.peers_seen(5.0, {A: d0, B: PeerSeen("relay", 1, True, 5)}, set())  # announces its leave
    feed.peers_seen(6.0, {A: d0}, set())  # said Goodbye
    feed.peers_seen(7.0, {A: d0, B: PeerSeen("relay", 1, False, 6)}, set())  # back
    feed.peers_seen(8.0, {A: d0, B: PeerSeen("relay", 1, False, 7)}, set())  # restarted before found dead
    feed.peers_seen(9.0, {A: d0}, {B})  # presumed dead
    texts = [(e.kind, e.text) for e in log.recent()]
    assert texts == [
        (EventKind.JOIN, "d0 joined (data node)"),
        (EventKind.JOIN, "bbbbbb joined (relay, not placed yet)"),
        (EventKind.PLACED, "bbbbbb serves stage 1"),
        (EventKind.LEAVE, "bbbbbb announced its leave"),
        (EventKind.LEAVE, "bbbbbb left"),
        (EventKind.JOIN, "bbbbbb is back (relay of stage 1)"),
        (EventKind.CRASH, "bbbbbb restarted (a new process, same identity)"),
        (EventKind.CRASH, "bbbbbb presumed dead"),
    ]
    assert log.counts[EventKind.JOIN] == 3 and "12D3KooW" not in " ".join(t for _, t in texts)


def test_elections_are_changes_of_leader_or_term() -> None:
    log = EventLog()
    feed = EventFeed(log, _names)
    feed.leader_seen(1.0, None, None)
    feed.leader_seen(2.0, None, 0)  # a term moving before anyone wins is not news
    feed.leader_seen(3.0, A, 1)
    feed.leader_seen(4.0, A, 1)
    feed.leader_seen(5.0, None, 1)  # the lease ended
    feed.leader_seen(6.0, B, 2)
    assert [e.text for e in log.recent()] == ["d0 leads in term 1", "no acting leader (term 1)", "bbbbbb leads in term 2"]
    assert [(e.term, e.leader) for e in feed.recent_elections()] == [(1, A), (1, None), (2, B)]


def test_recovery_counters_become_events_and_counts() -> None:
    log = EventLog(size=2)  # the ring keeps the newest; the counts keep everything
    feed = EventFeed(log, _names)
    feed.recovery_counters(1.0, {"reroutes": 0, "deferred": 0})
    feed.recovery_counters(2.0, {"reroutes": 3, "deferred": 1})
    feed.recovery_counters(3.0, {"reroutes": 3, "deferred": 1, "recovers": 2})
    assert [e.text for e in log.recent()] == ["1 microbatch(es) deferred to the next iteration",
                                              "2 stage forward(s) recomputed from a stash"]
    assert log.counts[EventKind.REROUTE] == 3 and log.counts[EventKind.DEFER] == 1
    assert log.counts[EventKind.RECOVERY] == 2


def test_tally_splits_compute_into_useful_and_wasted() -> None:
    seconds = {("d", 0, 0): 1.0, ("d", 1, 0): 2.0, ("d", 2, 0): 4.0, ("d", 0, 1): 8.0}
    t = Tally(seconds)
    t.data_settled(0, "d", {"deferred": 1, "pending": 0, "inflight": 0}, {0: 3.0, 1: 5.0})
    assert (t.completed, t.deferred, t.lost, t.last_loss) == (2, 1, 0, 4.0)
    assert (t.useful_compute_s, t.wasted_compute_s) == (3.0, 4.0)  # seq 2 was deferred after its work
    assert seconds == {("d", 0, 1): 8.0}  # iteration 1 is not settled yet
    seconds[("d", 1, 0)] = 0.5  # late work on a settled iteration: wasted at the next settlement
    relay = Tally(seconds)
    relay.relay_counted(1, frozenset({("d", 0, 1)}))
    assert (relay.contributions, relay.useful_compute_s, relay.wasted_compute_s) == (1, 8.0, 0.5)
    assert relay.to_json("relay")["deferred"] is None and relay.to_json("relay")["completed"] == 1


def _frame(polled, **kw) -> str:
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=120, color_system="truecolor").print(render(polled, **kw))
    return buf.getvalue()


def test_frames_render_from_real_views() -> None:
    d0, r0 = _view("d0"), _view("r0_0")
    one = _frame([(Path("d0"), d0)])
    assert "\x1b[" in one  # drawn for a terminal
    for needle in ("d0", "LEADER", "election", "r0_0", "r1_0", "neighbours", "recent events", "flows through"):
        assert needle in one, needle
    assert "stage -1" not in one and "stage -2" not in one
    several = _frame([(Path("d0"), d0), (Path("r0_0"), r0), (Path("r1_0"), None)])
    assert "not running" in several and "r0_0" in several
    swarm = _frame([(Path("d0"), d0), (Path("r0_0"), r0)], swarm=True)
    assert "gwtf-node swarm" in swarm and "utilization" in swarm


@pytest.mark.trio
async def test_ctrl_c_leaves_the_live_view_also_when_sigint_came_ignored(tmp_path: Path) -> None:
    """The live view refreshes until Ctrl-C, its only way out, also when `status` was started with SIGINT ignored
    (as every command of a script's background job is: a CI runner, `nohup ... &`); the view is served by a real
    control socket that answers with a view read from a running swarm."""
    node = tmp_path / "d0"
    node.mkdir()
    view = _view("d0")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, node, lambda: view, lambda: {"graceful": False, "pid": os.getpid()})
        rc, drawn = await trio.to_thread.run_sync(lambda: run_in_pty(
            ["status", "--state-dir", str(node), "--interval", "0.2"], timeout_s=120, sigint_ignored=True,
            interrupt_when=lambda d: d.count("recent events") >= 2))
        nursery.cancel_scope.cancel()
    assert rc == 0 and drawn.count("recent events") >= 2, drawn[-2000:]


def test_status_with_no_daemon_says_so_and_exits_1(tmp_path: Path, capsys, monkeypatch) -> None:
    node = tmp_path / "d0"
    node.mkdir()
    (node / "status.json").write_text(json.dumps({"pid": 1, "name": "d0"}))  # left by a node that stopped
    assert main(["status", "--state-dir", str(node)]) == 1
    assert "no node is running" in capsys.readouterr().err
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a control socket left by a killed node
    s.bind(str(node / "control.sock"))
    s.close()
    assert main(["status", "--state-dir", str(tmp_path), "--once"]) == 1
    err = capsys.readouterr().err
    assert "left from a node that stopped" in err and "no node is running" in err
    assert main(["status", "--state-dir", str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # no gwtf-state here
    assert main(["status"]) == 1
    assert "no node is running: no node state directory in gwtf-state (the default" in capsys.readouterr().err


def test_leave_with_no_daemon_says_so(tmp_path: Path, capsys) -> None:
    assert main(["leave", "--state-dir", str(tmp_path)]) == 2
    assert "no running node" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["d0", "r0_0"])
def test_views_hold_no_sentinels(name: str) -> None:
    v = _view(name)
    assert v["node"]["stage"] in (None, 0, 1)
    for s in v["stages"]:
        assert s["stage"] >= 0 and all("12D3KooW" not in m["name"] for m in s["members"])
    assert all(nb["stage"] is None or nb["stage"] >= 0 for nb in v["neighbours"])
    assert all("12D3KooW" not in e["text"] for e in v["events"])


def _volunteer_views() -> tuple[dict, dict]:
    """The stored views as a volunteer's swarm shows them: default names, long events, a relayed neighbour, this
    node's reachability (runtime/node/status.py `_reachability`)."""
    d0, r0 = _view("d0"), _view("r0_0")
    for v, name in ((d0, "data-qwmSBK"), (r0, "relay-M3uMoe")):
        v["node"]["name"] = name
        v["node"]["reachability"] = {"kind": "public", "basis": "announced", "checked_by": None,
                                     "checked_by_name": None, "relays": [], "relay_names": [], "hole_punch": None}
        v["election"]["leader_name"] = "data-qwmSBK"
        v["events"].append({"at": 1.0e9, "kind": "crash", "text": "relay-Zq81Lm presumed dead: silent for 25.2 s "
                            "(its microbatches are rerouted to relay-M3uMoe and relay-Pp0aaB of stage 0)"})
    r0["neighbours"][0] |= {"connection": "hole-punched", "latency_source": "emulated"}
    r0["neighbours"][1] |= {"connection": "relayed+libp2p", "alive": False}
    d0["microbatches"] |= {"completed": 12345, "wasted_compute_s": 1234.5}
    return d0, r0


def _plain(polled, width: int, **kw) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(render(polled, width=width, **kw))
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 200])
def test_frames_fit_the_width_by_leaving_columns_out_never_cutting_cells(width: int) -> None:
    d0, r0 = _volunteer_views()
    frames = [_plain([(Path("r0_0"), r0)], width), _plain([(Path("d0"), d0), (Path("r0_0"), r0)], width),
              _plain([(Path("d0"), d0), (Path("r0_0"), r0), (Path("r1_0"), None)], width, swarm=True)]
    for frame in frames:
        assert max(len(line) for line in frame.splitlines()) <= width, frame
        assert "…" not in frame and "..." not in frame, frame  # no cell cut short
        for cell in ("training", "leader data-qwmSBK", "relay-M3uMoe"):  # the leader by its name
            assert cell in frame, (cell, frame)
    one, several, _swarm = frames
    assert "hole-punched" in one and "relayed+libp2p" in one  # the connection kind per neighbour
    assert "reachability public (its --announce address, not checked by a peer yet)" in " ".join(one.split())
    assert "public" in several.split("nodes")[1].split("election")[0] or width == 80
    if width == 80:
        assert "too narrow for:" in several
    else:
        assert "too narrow for" not in "".join(frames)
        assert "12345 / 0 / 0" in several and "1234.50" in several and "data-qwmSBK (1)" in several

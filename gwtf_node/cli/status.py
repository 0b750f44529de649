"""`gwtf-node status`: the live dashboard of running nodes, read from their control sockets.

Each node answers on the control socket of its state directory
(runtime/ops/control.py) with its view (runtime/node/status.py `view`).  `status`
asks the nodes of the given state directories (a node's own, or a directory
holding several: a local swarm's workdir) and draws:

* one node: the node, the election, the iteration and its microbatches, the
  stages, the flows through it, its neighbours' links and recent events;
* several nodes: one row per node, then the election and events of the node
  that leads (or of the first node);
* `--swarm`: the run as the leader sees it (its election, stages with
  utilization, run loss, events) and a row for every node that answered.

Every table fits the terminal's width (80 columns when piped): the columns
that matter least are left out, and named, rather than cells cut (tables.py).
The node's own reachability (public, firewalled, behind NAT, local) is in its
header and in the nodes table, the connection kind to each neighbour (direct,
inbound, relayed, hole-punched) in the neighbours table.

It refreshes every `--interval` seconds with rich's `Live` until Ctrl-C;
`--once` (also when stdout is not a terminal) prints one frame and
`--json` the views themselves.  With no node answering (no control socket,
one left by a node that stopped, or no default state directory) it says so
and exits with status 1; a --state-dir that does not exist is a usage error
(status 2).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import CliError
from .tables import Col, fit_table

EXIT_NO_DAEMON = 1
DEFAULT_STATE_DIR = "gwtf-state"  # join's default --state-dir
NODE_MARKERS = ("control.sock", "control.path", "status.json", "node.key", "addr")
KIND_STYLE = {"crash": "bold red", "leave": "yellow", "join": "green", "placed": "green", "election": "magenta",
              "reroute": "cyan", "defer": "yellow", "recovery": "cyan"}
STATE_STYLE = {"training": "green", "aggregating": "cyan", "joining": "yellow", "connecting": "yellow",
               "waiting": "yellow",
               "paused": "bold red", "leaving": "magenta", "not running": "dim red"}


def add_status_parser(sub: Any) -> None:
    stt = sub.add_parser("status", help="live dashboard of running nodes (their control sockets)")
    stt.add_argument("--state-dir", nargs="+", action="extend", default=None, metavar="DIR",
                     help="a node's state directory (the --state-dir of its join; default gwtf-state), or a "
                          "directory holding several (a local swarm's --workdir); several: --state-dir a b, "
                          "or the flag again")
    stt.add_argument("--once", action="store_true", help="print one frame and exit (also when not on a terminal)")
    stt.add_argument("--json", action="store_true", help="print the nodes' status views as JSON and exit")
    stt.add_argument("--swarm", action="store_true", help="the whole run as its leader sees it")
    stt.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period of the live view")
    stt.set_defaults(func=cmd_status)


# ---------------------------------------------------------------------- finding and asking the nodes
def node_dirs(paths: list[str]) -> tuple[list[Path], list[str]]:
    """The node state directories named by `paths` (each path itself, or the node directories inside it), and
    the paths that are no directory."""
    out: list[Path] = []
    missing: list[str] = []
    for d in paths:
        p = Path(d)
        if not p.is_dir():
            missing.append(d)
            continue
        if any((p / m).exists() for m in NODE_MARKERS):
            out.append(p)
        else:
            out += sorted(c for c in p.iterdir() if c.is_dir() and any((c / m).exists() for m in NODE_MARKERS))
    return out, missing


class Nodes:
    """Open control connections to the nodes of some state directories; `poll` asks each for its view."""

    def __init__(self, dirs: list[Path]) -> None:
        from ..runtime.ops.control import Client

        self.dirs = dirs
        self.clients: dict[Path, Client | None] = {d: None for d in dirs}
        self.down: dict[Path, str] = {}

    def poll(self) -> list[tuple[Path, dict | None]]:
        from ..runtime.ops.control import Client, ControlError

        out = []
        for d in self.dirs:
            c = self.clients[d]
            try:
                if c is None:
                    c = self.clients[d] = Client(d)
                view = c.ask("status")["status"]
                self.down.pop(d, None)
                out.append((d, view))
            except ControlError as e:
                if c is not None:
                    c.close()
                self.clients[d] = None
                self.down[d] = str(e)
                out.append((d, None))
        return out

    def close(self) -> None:
        for c in self.clients.values():
            if c is not None:
                c.close()


def cmd_status(args: argparse.Namespace) -> int:
    given = args.state_dir is not None
    dirs, missing = node_dirs(args.state_dir if given else [DEFAULT_STATE_DIR])
    if missing and given:
        raise CliError(f"--state-dir {missing[0]}: no such directory (give the --state-dir of a running node, "
                       "or a local swarm's workdir)")
    if not dirs:
        where = ", ".join(args.state_dir) if given else f"{DEFAULT_STATE_DIR} (the default --state-dir)"
        print(f"no node is running: no node state directory in {where}; give the --state-dir of a running node, "
              "or a local swarm's workdir", file=sys.stderr)
        return EXIT_NO_DAEMON
    nodes = Nodes(dirs)
    try:
        polled = nodes.poll()
        if not any(v for _, v in polled):
            for d in dirs:
                print(f"not running: {nodes.down.get(d, d)}", file=sys.stderr)
            print("no node is running: start one with gwtf-node join (or gwtf-node local)", file=sys.stderr)
            return EXIT_NO_DAEMON
        if args.json:
            views = [v for _, v in polled if v is not None]
            print(json.dumps(views[0] if len(dirs) == 1 else views, indent=1))
            return 0
        from rich.console import Console

        console = Console()
        if args.once or not console.is_terminal:
            console.print(render(polled, swarm=args.swarm, width=console.width))
            return 0
        return _live(nodes, polled, console, args)
    finally:
        nodes.close()


def _live(nodes: Nodes, polled: list, console: Any, args: argparse.Namespace) -> int:
    """Redraw until Ctrl-C.  Ctrl-C is the view's only way out, so it raises KeyboardInterrupt here even where the
    process started with SIGINT ignored (every command of a script's background job does: POSIX shells ignore
    SIGINT in asynchronous lists, and Python then installs no handler of its own)."""
    from rich.live import Live

    interval = max(0.2, args.interval)
    main_thread = threading.current_thread() is threading.main_thread()  # (signal handlers are set there only)
    before = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    try:
        with Live(render(polled, swarm=args.swarm, width=console.width), console=console, screen=False,
                  auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                polled = nodes.poll()
                live.update(render(polled, swarm=args.swarm, width=console.width), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


# ---------------------------------------------------------------------- drawing
def render(polled: list[tuple[Path, dict | None]], *, swarm: bool = False, width: int | None = None) -> Any:
    """One frame of the dashboard (a rich renderable) from the views of the nodes (None: not running); its tables
    at most `width` terminal cells wide (None: as wide as they are), leaving columns out rather than cutting
    cells (tables.py)."""
    from rich.console import Group

    views = [v for _, v in polled if v is not None]
    if swarm:
        lead = _leader_view(views)
        parts = [_swarm_header(lead), _nodes_table(polled, width), _stages_table(lead, width),
                 _election_panel(lead), _events_table(lead, width)]
    elif len(polled) == 1 and views:
        v = views[0]
        parts = [_node_header(v), _election_panel(v), _iteration_panel(v), _stages_table(v, width),
                 _flows_table(v, width), _neighbours_table(v, width), _events_table(v, width)]
    else:
        lead = _leader_view(views)
        parts = [_nodes_table(polled, width), _election_panel(lead), _events_table(lead, width)]
    return Group(*[p for p in parts if p is not None])


def _leader_view(views: list[dict]) -> dict:
    """The view of the node that leads, else of a data node (voters know the election best), else the first."""
    for v in views:
        if v["node"]["is_leader"]:
            return v
    for v in views:
        if v["node"]["role"] == "data":
            return v
    return views[0]


def _where(node: dict) -> str:
    return "data node" if node["role"] == "data" else \
        f"relay, stage {node['stage']}" if node["stage"] is not None else "relay, not placed yet"


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def _f(v: Any, fmt: str = "{}", none: str = "-") -> str:
    return none if v is None else fmt.format(v)


def _ago(at: float) -> str:
    s = max(0.0, time.time() - at)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _node_header(v: dict) -> Any:
    from rich.panel import Panel

    n, it, loss, mb = v["node"], v["iteration"], v["loss"], v["microbatches"]
    lead = " [bold magenta]LEADER[/]" if n["is_leader"] else ""
    lines = [f"[bold]{n['name']}[/] ({n['short_id']}) {_where(n)}, capacity {n['capacity']}{lead}  "
             f"state {_state(n['state'])}",
             f"peer id {n['peer_id']}   run {n['run_id'][:16]}   policy {n['policy']}   pid {n['pid']}   "
             f"up {_duration(n['uptime_s'])}"]
    phase = f", {it['phase']}" if it["phase"] else ""
    secs = f" for {it['seconds']:.1f} s" if it["seconds"] is not None else ""
    run_loss = f"   run loss {loss['run']:.4f} (iteration {loss['run_iteration']})" if loss["run"] is not None else ""
    my_loss = f"   loss {loss['this_node']:.4f}" if loss["this_node"] is not None else ""
    lines.append(f"iteration {_f(it['number'])}{phase}{secs}   steps applied {it['steps_applied']}{my_loss}"
                 f"{run_loss}")
    waste = mb["wasted_compute_s"]
    total = waste + mb["useful_compute_s"]
    pct = f" ({100 * waste / total:.1f}%)" if total > 0 else ""
    done = "completed" if n["role"] == "data" else "contributions"
    lines.append(f"microbatches {done} {mb['completed']}, deferred {_f(mb['deferred'])}, lost {_f(mb['lost'])}"
                 f"   wasted compute {waste:.2f} s{pct} of {n['compute_s']:.1f} s"
                 f"   lost contributions {mb['lost_contributions']}")
    rec = {k: c for k, c in mb["recovery"].items() if c}
    if rec:
        lines.append("recovery " + ", ".join(f"{k} {c}" for k, c in sorted(rec.items())))
    reach = _reach_words(n.get("reachability"))
    if reach:
        lines.append(f"reachability {reach}")
    for note in v["notes"]:
        lines.append(f"[yellow]{note}[/]")
    return Panel("\n".join(lines), title="gwtf-node", title_align="left")


REACH_STYLE = {"public": "green", "local": "green", "firewalled": "yellow", "behind NAT": "yellow",
               "unknown": "dim"}


def _reach_short(r: dict | None) -> str:
    return "" if not r else f"[{REACH_STYLE.get(r['kind'], 'white')}]{r['kind']}[/]"


def _reach_words(r: dict | None) -> str:
    """This node's reachability in words (runtime/node/status.py `_reachability`); "" in a view without it."""
    if not r:
        return ""
    why = {"dial-back": f"a peer dialled it back{(': ' + r['checked_by_name']) if r.get('checked_by_name') else ''}"
           if r["kind"] == "public" else "a peer's dial-back did not reach it",
           "announced": "its --announce address, not checked by a peer yet",
           "addresses": "loopback addresses: a swarm on one machine" if r["kind"] == "local"
           else "private addresses only"}.get(r.get("basis") or "", "not checked by a peer yet")
    relays = r.get("relay_names") or r.get("relays") or []
    through = f"; reached through relay {', '.join(relays)}" if relays else ""
    return f"{_reach_short(r)} ({why}){through}"


def _swarm_header(v: dict) -> Any:
    from rich.panel import Panel

    e, it, loss = v["election"], v["iteration"], v["loss"]
    rec = loss.get("run_record") or {}
    lead = e["leader_name"] or "none"
    lines = [f"[bold]run {v['node']['run_id'][:16]}[/] as seen by {v['node']['name']}   leader [magenta]{lead}[/] "
             f"term {_f(e['term'])}   iteration {_f(it['number'])}"
             + (f", {it['phase']}" if it["phase"] else "")]
    if rec:
        lines.append(f"last iteration {rec.get('iteration')}: loss {_f(rec.get('loss'), '{:.4f}')}, "
                     f"{rec.get('completed', rec.get('microbatches'))} microbatches completed, "
                     f"{rec.get('deferred', 0)} deferred, {rec.get('lost', 0)} lost, {rec.get('seconds', 0):.2f} s, "
                     f"{rec.get('relays', '?')} relays")
    return Panel("\n".join(lines), title="gwtf-node swarm", title_align="left")


def _nodes_table(polled: list[tuple[Path, dict | None]], width: int | None = None) -> Any:
    cols = [Col("node", 100), Col("role", 80), Col("stage", 85), Col("state", 90), Col("iteration", 70),
            Col("loss", 65), Col("done/deferred/lost", 40), Col("wasted s", 20), Col("leader (term)", 45),
            Col("reach", 50), Col("neighbours", 30)]
    rows = []
    for d, v in polled:
        if v is None:
            rows.append([d.name, "", "", _state("not running")] + [""] * (len(cols) - 4))
            continue
        n, mb, e = v["node"], v["microbatches"], v["election"]
        lead = f"{e['leader_name']} ({e['term']})" if e["leader_name"] else "-"
        up = sum(1 for nb in v["neighbours"] if nb["alive"])
        rows.append([n["name"] + (" *" if n["is_leader"] else ""), n["role"], _f(n["stage"]), _state(n["state"]),
                     _f(v["iteration"]["number"]), _f(v["loss"]["this_node"], "{:.4f}"),
                     f"{mb['completed']} / {_f(mb['deferred'])} / {_f(mb['lost'])}", f"{mb['wasted_compute_s']:.2f}",
                     lead, _reach_short(n.get("reachability")) or "-", f"{up}/{len(v['neighbours'])}"])
    return fit_table("nodes", cols, rows, width)


def _election_panel(v: dict) -> Any:
    from rich.panel import Panel

    e = v["election"]
    me = v["node"]["name"]
    who = f"[magenta]{e['leader_name']}[/]" if e["leader_name"] else "[red]none acting[/]"
    if e["voter"]:
        mine = f"{me} is a voter ({e['role']}), voted for {_f(e['voted_for_name'])} in term {_f(e['term'])}; " \
               f"quorum {e['quorum']} of {len(e['voters'])}"
    else:
        heard = f", heard {e['leader_heard_s_ago']} s ago" if e["leader_heard_s_ago"] is not None else ""
        mine = f"{me} does not vote (a relay: the leader's queries tell it who leads{heard})"
    lease = f"   lease {e['lease_remaining_s']:.1f} s left" if e["lease_remaining_s"] is not None else ""
    voters = "  ".join(f"{'[green]+[/]' if x['reachable'] else '[red]x[/]'} {x['name']}" for x in e["voters"])
    lines = [f"leader {who}   term {_f(e['term'])}{lease}", mine, f"voters: {voters or '-'}"]
    if e["recent"]:
        lines.append("recent: " + "; ".join(
            f"term {_f(r['term'])} {r['leader_name'] or 'no leader'} ({_ago(r['at'])})" for r in e["recent"][-4:]))
    return Panel("\n".join(lines), title="election", title_align="left")


def _iteration_panel(v: dict) -> Any:
    it = v["iteration"]
    if not it["ledger"]:
        return None
    from rich.panel import Panel

    ledger = ", ".join(f"{k} {c}" for k, c in it["ledger"].items())
    recent = v["loss"]["recent"]
    losses = "  ".join(f"{k}: {x:.4f}" for k, x in list(recent.items())[-6:])
    return Panel(f"microbatches of iteration {it['number']}: {ledger}" + (f"\nloss by iteration  {losses}"
                                                                          if losses else ""),
                 title="this node's microbatches", title_align="left")


def _stages_table(v: dict, width: int | None = None) -> Any:
    cols = [Col("stage", 100), Col("members (state, flows/capacity)", 90, free=True), Col("utilization", 80)]
    rows = [["data", ", ".join(d["name"] for d in v["data_nodes"]) or "-", ""]]
    for s in v["stages"]:
        mem = ", ".join(f"{m['name']}{'*' if m['me'] else ''} ({m['state']}, {_f(m['flows'], '{}', '?')}/"
                        f"{m['capacity']})" for m in s["members"])
        util = s["utilization"]
        rows.append([str(s["stage"]), mem or "[red]empty[/]",
                     _f(util, "{:.0%}") if util is None or util <= 1 else f"[red]{util:.0%}[/]"])
    return fit_table(f"stages (as {v['node']['name']} knows them)", cols, rows, width)


def _flows_table(v: dict, width: int | None = None) -> Any:
    if not v["flows"]:
        return None
    cols = [Col("data node", 100), Col("direction", 80), Col("peer", 90), Col("units", 70), Col("link cost", 60)]
    rows = [[f["data_node_name"], "from" if f["direction"] == "in" else "to", f["peer_name"], str(f["units"]),
             _f(f["cost"], "{:.3f}")] for f in v["flows"]]
    return fit_table("flows through this node", cols, rows, width)


SOURCE = {"measured": "", "emulated": " em", "assumed": " ?"}  # how a link figure was found (the table's key)


def _neighbours_table(v: dict, width: int | None = None) -> Any:
    if not v["neighbours"]:
        return None
    cols = [Col("peer", 100), Col("where", 80), Col("side", 40), Col("connection", 90), Col("alive", 85),
            Col("rtt ms", 50), Col("latency ms", 30), Col("Mbit/s", 35), Col("cost", 60)]
    rows = []
    for nb in v["neighbours"]:
        where = "data node" if nb["role"] == "data" else f"stage {_f(nb['stage'], '{}', '?')}"
        rows.append([nb["name"], where, _f(nb["side"]), nb["connection"],
                     "[green]yes[/]" if nb["alive"] else "[red]no[/]", _f(nb["rtt_ms"], "{:.2f}"),
                     _f(nb["latency_ms"], "{:.2f}") + SOURCE.get(nb["latency_source"] or "", ""),
                     f"{nb['bandwidth_mbps']:g}" + SOURCE.get(nb["bandwidth_source"], ""),
                     _f(nb["link_cost"], "{:.3f}")])
    return fit_table("neighbours (em: emulated, ?: assumed)", cols, rows, width)


def _events_table(v: dict, width: int | None = None, n: int = 10) -> Any:
    cols = [Col("when", 90), Col("kind", 80), Col("what", 100, free=True)]
    rows = [[time.strftime("%H:%M:%S", time.localtime(ev["at"])),
             f"[{KIND_STYLE.get(ev['kind'], 'white')}]{ev['kind']}[/]", ev["text"]] for ev in v["events"][-n:]]
    return fit_table(f"recent events (at {v['node']['name']})", cols, rows or [["", "", "none yet"]], width)

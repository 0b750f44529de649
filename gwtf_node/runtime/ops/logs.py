"""The daemon's log: a rotating `node.log` in the state directory and stderr, without floods or chatter.

A volunteer's node runs for weeks, so what it logs must stay readable and bounded:

* **Where.**  Every record goes to stderr (a terminal, the journal under
  systemd, a container's log) and to `STATE_DIR/node.log`, a
  `RotatingFileHandler` that keeps `max_mb` MB per file and `backups` older
  files (`node.log.1` ... `node.log.N`).  When stderr already *is* that file
  (a launcher such as `gwtf-node local` redirected the process's output
  there), the file is not opened a second time: one writer, no doubled lines,
  and the launcher's file is not rotated under it.
* **Libraries' chatter.**  libp2p logs routine events at levels a person would
  read as news: its auto-connector sets its own logger to INFO and says
  "initiating 200 new dials" every 10 s, and every dial to a dead peer logs
  "Failed to open TCP stream" at ERROR (thousands of lines per churn run), next
  to our own warning about the same failed send.  `LibraryFilter` passes a
  library's records from ERROR up (WARNING up with `--log-level DEBUG`),
  whatever level the library set on its own loggers, and demotes the listed
  routine messages (`ROUTINE`) to DEBUG.
* **Routine.**  The lines of every iteration (logger `gwtf.steps`: a data
  node's "settled", the leader's loss, a relay's step) go to node.log only:
  on stderr (a terminal, the journal) a line a second would bury the
  events.  Where stderr is node.log itself, or at `--log-level DEBUG`,
  nothing is left out.
* **Floods.**  After a crash the same line can repeat every second for
  minutes (a failed ping to the dead peer).  `RepeatFilter` shows the first of
  identical lines (same logger, level and text) and counts the rest for
  `window_s`; the next one after the window carries the count ("(repeated 59
  more times since 12:00:01)"), and `flush` logs the counts still held when the
  node stops.  Identical *text*, not the template: a line whose numbers change
  (an attempt number, a count) carries news and is shown.
* **Python warnings.**  A library's `warnings.warn` (transformers' deprecation
  notices, torch's) would go to bare stderr, and Python shows it again after any
  `warnings.catch_warnings()` block anywhere in the process (leaving one resets
  the once-per-location registry): one relay wrote the same two-line
  FutureWarning thousands of times.  `WarningRouter` replaces
  `warnings.showwarning`: the first warning of each (category, text, place) is
  a WARNING of the logger `py.warnings` in the node log, the rest are DEBUG.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

LOG_FILE_NAME = "node.log"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LIBRARIES = ("libp2p", "multiaddr", "async_service", "trio")  # loggers of libraries, by name prefix
# Routine events that libraries log at WARNING or ERROR: demoted to DEBUG.  Each comes with a line of our
# own that says what failed for the node (a send, a ping, a bootstrap attempt).
ROUTINE: tuple[tuple[str, str], ...] = (
    ("libp2p.transport.tcp", "Failed to open TCP stream"),  # a dial to a peer that is gone
    # a hole punch's dials (holepunch.py): a NATed peer's private address ("Network is unreachable"), the listen
    # port's pair still held by the previous punch (Errno 99); the punch's own line says whether it connected
    ("libp2p.transport.tcp", "Unexpected error opening TCP stream"),
    ("libp2p.host.basic_host", "Failed to open stream to peer"),
    ("libp2p.protocol_muxer.multiselect_client", "MultiselectClient handshake"),  # a connection closed mid-way
    ("libp2p.network.auto_connector", ""),  # "initiating 200 new dials", every 10 s
    # an outbound dial whose Noise handshake failed (bootstrap.py says why: e.g. another peer id answers there)
    ("libp2p.network.swarm", "failed to upgrade security"),
)
REPEAT_WINDOW_S = 60.0  # identical lines within this window are counted, not shown
ROUTINE_LOGGERS = ("gwtf.steps",)  # the lines of every iteration (module doc "Routine")
REPEAT_KEYS_MAX = 4096  # distinct lines remembered at once (older windows are forgotten first)


def _is_library(name: str) -> bool:
    return any(name == lib or name.startswith(lib + ".") for lib in LIBRARIES)


class LibraryFilter(logging.Filter):
    """Pass a library's records from `library_level` up, and its routine ones only at DEBUG."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.library_level = logging.WARNING if level <= logging.DEBUG else logging.ERROR

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_library(record.name):
            return True
        for prefix, text in ROUTINE:
            if (record.name == prefix or record.name.startswith(prefix + ".")) and str(record.msg).startswith(text):
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
                return self.level <= logging.DEBUG
        return record.levelno >= self.library_level


@dataclass
class _Seen:
    since: float  # when the shown line of this window was logged (monotonic clock)
    since_wall: float  # the same instant on the wall clock, for the message
    repeats: int = 0  # identical lines suppressed since then
    record: logging.LogRecord | None = None  # the last suppressed one (for `flush`)


class RepeatFilter(logging.Filter):
    """Show the first of identical lines in each `window_s` and count the others (see the module docstring).

    One instance may sit on several handlers: the decision about a record is made once, kept on the record,
    and reused by the other handlers that see it.
    """

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.window_s, self.clock, self.wall = window_s, clock, wall
        self._seen: dict[tuple[str, int, str], _Seen] = {}
        self._lock = threading.Lock()  # torch worker threads log too

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            decided = getattr(record, "_gwtf_repeat_shown", None)
            if decided is None:
                decided = self._decide(record)
                record._gwtf_repeat_shown = decided  # type: ignore[attr-defined]
            return decided

    def _decide(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed call (wrong arguments for its template): let logging report it
            return True
        key = (record.name, record.levelno, text)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.since < self.window_s:
            seen.repeats += 1
            seen.record = record
            return False
        if seen is not None and seen.repeats:
            record.msg, record.args = f"{text} (repeated {seen.repeats} more times since {_clock(seen.since_wall)})", None
        self._seen[key] = _Seen(since=now, since_wall=self.wall())
        if len(self._seen) > REPEAT_KEYS_MAX:
            self._forget(now)
        return True

    def _forget(self, now: float) -> None:
        """Drop the lines whose window is over and nothing is held for; then the oldest, to stay bounded."""
        for key in [k for k, s in self._seen.items() if now - s.since >= self.window_s and not s.repeats]:
            del self._seen[key]
        while len(self._seen) > REPEAT_KEYS_MAX:
            del self._seen[min(self._seen, key=lambda k: self._seen[k].since)]

    def pending(self) -> list[tuple[logging.LogRecord, int, float]]:
        """The suppressed lines not yet reported: (last record, how many, since when on the wall clock)."""
        with self._lock:
            return [(s.record, s.repeats, s.since_wall) for s in self._seen.values() if s.repeats and s.record]

    def flush(self, handlers: list[logging.Handler]) -> None:
        """Write the counts still held (the node is stopping) to `handlers`, bypassing this filter."""
        for record, repeats, since in self.pending():
            summary = logging.makeLogRecord(record.__dict__)
            summary.msg = f"{record.getMessage()} (repeated {repeats} more times since {_clock(since)}, last at " \
                          f"{_clock(record.created)})"
            summary.args = None
            # stamped now, when it is written (the copied record carries the time of the last repeat)
            summary.created = self.wall()
            summary.msecs = (summary.created - int(summary.created)) * 1000
            summary._gwtf_repeat_shown = True  # type: ignore[attr-defined]
            for h in handlers:
                h.handle(summary)
        with self._lock:
            self._seen.clear()


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class WarningRouter:
    """`warnings.showwarning` that logs each distinct warning once at WARNING, its repeats at DEBUG (module doc)."""

    MAX_SEEN = 1024  # distinct warnings remembered; past it, every warning is logged at DEBUG

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, str, int]] = set()
        self.log = logging.getLogger("py.warnings")
        self._lock = threading.Lock()

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        key = (getattr(category, "__name__", str(category)), str(message), str(filename), int(lineno or 0))
        with self._lock:
            first = key not in self.seen and len(self.seen) < self.MAX_SEEN
            if first:
                self.seen.add(key)
        where = f"{os.path.basename(str(filename))}:{lineno}"
        if first:
            self.log.warning("%s: %s (%s; shown once, repeats at DEBUG)", key[0], key[1], where)
        else:
            self.log.debug("%s: %s (%s)", key[0], key[1], where)


def route_warnings() -> WarningRouter:
    """Send Python warnings to the log (`WarningRouter`), every occurrence, deduplicated there."""
    router = WarningRouter()
    warnings.showwarning = router
    # "always": the router sees every occurrence and decides; Python's own registry is reset by any
    # catch_warnings block in the process, so it cannot be what keeps a warning to one line
    warnings.simplefilter("always")
    for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=quiet)  # as Python's defaults: for developers
    return router


class RoutineFilter(logging.Filter):
    """On stderr beside a node.log: leave out the INFO lines of every iteration (`ROUTINE_LOGGERS`), see the module
    docstring."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or record.name not in ROUTINE_LOGGERS


@dataclass
class LogSetup:
    """What `setup_logging` installed: its handlers, the flood filter, and the log file (None: stderr only)."""

    handlers: list[logging.Handler]
    repeats: RepeatFilter
    path: Path | None

    def close(self) -> None:
        """Report the repeats still counted, then flush and detach the handlers."""
        self.repeats.flush(self.handlers)
        root = logging.getLogger()
        for h in self.handlers:
            h.flush()
            root.removeHandler(h)
            h.close()  # a StreamHandler leaves its stream (stderr) open


def _same_file(stream, path: Path) -> bool:
    """Whether `stream` writes to the file at `path` (a launcher redirected stderr there)."""
    try:
        a, b = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def setup_logging(level: str = "INFO", state_dir: Path | None = None, *, max_mb: float = 10.0,
                  backups: int = 5, repeat_window_s: float = REPEAT_WINDOW_S) -> LogSetup:
    """Log to stderr and, with a state directory, to its rotating `node.log`; quiet libraries, fold floods.

    Raises OSError when the log file cannot be opened (the caller says so in one line).
    """
    numeric = getattr(logging, level)
    fmt = logging.Formatter(LOG_FORMAT)
    repeats = RepeatFilter(window_s=repeat_window_s)
    libraries = LibraryFilter(numeric)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    path = None
    if state_dir is not None:
        path = Path(state_dir) / LOG_FILE_NAME
        if not _same_file(sys.stderr, path):
            handlers.append(logging.handlers.RotatingFileHandler(
                path, maxBytes=int(max_mb * 1024 * 1024), backupCount=backups, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(fmt)
        h.setLevel(numeric)
        h.addFilter(libraries)
        h.addFilter(repeats)
    if len(handlers) > 1 and numeric > logging.DEBUG:
        handlers[0].addFilter(RoutineFilter())  # (node.log has them; stderr carries the news)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(numeric)
    # libp2p configures its own logger when first imported (WARNING, no handler, no propagation: Python's
    # last-resort handler then prints its warnings bare).  Import it first, then route it through ours.
    import libp2p  # noqa: F401
    for lib in LIBRARIES:
        lg = logging.getLogger(lib)
        lg.handlers.clear()
        lg.setLevel(logging.WARNING if numeric <= logging.DEBUG else logging.ERROR)
        lg.propagate = True
    route_warnings()
    return LogSetup(handlers=handlers, repeats=repeats, path=path)

"""What every command shares: input errors, argument types, scenario loading, logging.

Errors a person can fix (bad flags, bad files) raise `CliError`; `main` prints
its one line to stderr and exits with status 2 (`EXIT_USAGE`), never a
traceback.  `join` exits with 3 (`EXIT_NO_PEER`) when no bootstrap peer
answered in time: the input may be right and the swarm not up yet.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


EXIT_USAGE = 2  # an input a person can fix: bad flags or files, a port or state directory in use, refused by peers
EXIT_NO_PEER = 3  # join: no bootstrap peer answered within --bootstrap-timeout (retrying later may help)


class CliError(Exception):
    """A problem with the user's input; the message says what to fix."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every other input error
        raise CliError(f"{self.prog}: {message}{self._suggestion(message)}")

    def parse_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # for _suggestion: which subcommand ran
        return super().parse_args(args, namespace)

    def _suggestion(self, message: str) -> str:
        """"; did you mean --x?" for an unrecognized flag close to one of this parser's (as config keys get)."""
        import difflib

        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        flags = _flags_of(self, getattr(self, "_argv", None) or [])
        for word in message[len(prefix):].split():
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""


def _flags_of(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The long flags of the (sub)command that `argv` names: the parser's own, then its subcommand's, deepest."""
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for i, word in enumerate(argv):
                if word in a.choices:
                    return flags + _flags_of(a.choices[word], argv[i + 1:])
    return flags


def _int_at_least(lowest: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {v}")
        return v
    return parse


_positive_int = _int_at_least(1)


_nonneg_int = _int_at_least(0)


def _relay_nice(text: str) -> int:
    v = _nonneg_int(text)
    if v > 19:
        raise argparse.ArgumentTypeError(f"must be a niceness in 0..19 (0: as the data nodes), got {v}")
    return v


def _port(text: str) -> int:
    v = _nonneg_int(text)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 0..65535 (0: any free port), got {v}")
    return v


def _ip_address(text: str) -> str:
    import ipaddress
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an IPv4 or IPv6 address to listen on, got {text!r}") from None


def _listen_addr(text: str) -> str:
    """A `--listen` address as a multiaddr (/ip4/H/tcp/P or /ip6/H/tcp/P), from a multiaddr or HOST:PORT."""
    from ..runtime.net.addresses import AddressError, parse_endpoint
    try:
        return parse_endpoint(text, "--listen").multiaddr
    except AddressError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--listen {text.strip()!r}: ")) from None


def _announce_addr(text: str) -> str:
    """An `--announce` address as a multiaddr: a concrete host and port that peers can dial."""
    from ..runtime.net.addresses import AddressError, parse_announce
    try:
        return parse_announce(text).multiaddr
    except AddressError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--announce {text.strip()!r}: ")) from None


def _scaled_formation(args: argparse.Namespace, scaled: str = "scaled_formation",
                      waves: str = "waves_formation") -> bool | None:
    """`--scaled-formation` (the flag of dest `scaled`) True, `--waves-formation` False, neither None (auto:
    protocol/neighbourhood.py); both: a CliError."""
    on, off = getattr(args, scaled), getattr(args, waves)
    if on and off:
        flags = (f"--{d.replace('_', '-')}" for d in (scaled, waves))
        raise CliError("{} and {} contradict each other: give one, or neither for auto".format(*flags))
    return True if on else False if off else None


def _probability(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text!r}") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1), got {text!r}")
    return v


def _churn(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--churn must be a probability, got {text!r}") from None
    if not 0.0 <= v <= 1.0 or math.isnan(v):
        raise argparse.ArgumentTypeError(f"--churn must be in [0, 1], got {text!r}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds, got {text!r}") from None
    if not 0.0 <= v < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return v


def _lease_seconds(text: str) -> float:
    v = _seconds(text)
    if not 0.2 <= v <= 30.0:
        raise argparse.ArgumentTypeError(f"must be between 0.2 and 30 seconds, got {text!r}")
    return v


def _load_scenario(path: str, activation_mb: float | None):
    from ..protocol.scenario import ScenarioError, parse_scenario

    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except FileNotFoundError:
        raise CliError(f"scenario file {path!r} does not exist") from None
    except IsADirectoryError:
        raise CliError(f"scenario path {path!r} is a directory, not a JSON file") from None
    except PermissionError:
        raise CliError(f"cannot read scenario file {path!r}: permission denied") from None
    except UnicodeDecodeError:
        raise CliError(f"scenario file {path!r} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise CliError(f"scenario file {path!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    try:
        return parse_scenario(obj, activation_mb=activation_mb)
    except ScenarioError as e:
        raise CliError(f"bad scenario {path!r}: {e}") from None


def _manifest_error_types():
    from ..model.manifest import ManifestError
    from ..runtime.net.linkspec import LinksError

    return (ManifestError, LinksError)


def _first_manifest_error(exc: BaseException):
    """The manifest error inside `exc` (trio wraps what a nursery's body raises in exception groups), or None:
    the stage or the data is built from the manifest only once the node runs (a model config transformers
    refuses, a tokenizer file that cannot be read)."""
    if isinstance(exc, _manifest_error_types()):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = _first_manifest_error(sub)
            if found is not None:
                return found
    return None


def _setup_logging(level: str, state_dir=None, *, max_mb: float = 10.0, backups: int = 5):
    """Log to stderr and, with a state directory, to its rotating node.log (runtime/ops/logs.py)."""
    from ..runtime.ops.logs import setup_logging

    return setup_logging(level, state_dir, max_mb=max_mb, backups=backups)

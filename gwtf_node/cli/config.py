"""Settings of `gwtf-node join`: a TOML file, `GWTF_*` environment variables and flags, in rising precedence.

Every flag of `join` is a setting, and the table of settings is the join
parser itself: `configurable(parser, command)` reads the parser's actions
(name, type, choices, default, required), so a flag added to `join` with a
plain `add_argument` line is a setting too, with no second list to keep in
step.  For a flag `--some-flag`:

* the config file key is `some_flag` (the flag's name, dashes as underscores);
* the environment variable is `GWTF_SOME_FLAG` (the key upper-cased);
* flag > environment > file > the flag's default.

The file is `--config FILE` (or `GWTF_CONFIG`), else `config.toml` in the state
directory if it exists (the state directory named by `--state-dir`,
`GWTF_STATE_DIR` or the default).  Values are checked at start with the same
parsers as the flags, and by TOML type: a wrong type, a value out of range, or
an unknown key is one line naming the key and what is expected, exit 2.  In a
file, relative paths (`PATH_KEYS`) are taken relative to the file's directory,
so a config.toml can sit beside the run.json it names.  In the environment, a
list (`bootstrap`) is separated by commas or spaces, a switch is 1/true/yes/on
or 0/false/no/off, and an empty variable counts as unset.

`gwtf-node config show` takes the same flags and prints the effective
settings as TOML, each with where it came from (default, file, env, flag).
"""

from __future__ import annotations

import argparse
import difflib
import enum
import json
import math
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..runtime.node.faults import ENV_VARS as FAULT_ENV_VARS
from .common import CliError, EXIT_USAGE, _churn, _nonneg_int, _port, _positive_int, _probability, _seconds

CONFIG_FILE_NAME = "config.toml"
ENV_PREFIX = "GWTF_"
CONFIG_ENV = "GWTF_CONFIG"
# GWTF_* variables that are not settings: those of the test swarms (fault injection, a handler's fault raised)
NOT_SETTINGS = frozenset({CONFIG_ENV, *FAULT_ENV_VARS})
PATH_KEYS = frozenset({"run", "links", "restore", "state_dir"})  # relative to the config file's directory
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class Kind(enum.Enum):
    """What a setting's value is, which decides the TOML types it accepts."""

    STRING = "a string"
    INTEGER = "an integer"
    NUMBER = "a number"
    SWITCH = "true or false"
    LIST = "a list of strings"
    SCALAR = "a string or a number"  # a flag whose type function this module does not know


_INTEGER_TYPES = (int, _positive_int, _nonneg_int, _port)
_NUMBER_TYPES = (float, _seconds, _probability, _churn)


class Source(enum.Enum):
    """Where a setting's effective value came from."""

    DEFAULT = "default"
    FILE = "file"
    ENV = "env"
    FLAG = "flag"


@dataclass(frozen=True)
class Setting:
    """One flag of a command seen as a setting."""

    key: str  # config file key: the flag's dest ("state_dir")
    flag: str  # "--state-dir"
    kind: Kind
    default: Any
    parse: Callable[[str], Any] | None  # the flag's argparse type: text -> value, raising on a bad value
    choices: tuple | None
    required: bool

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()


@dataclass(frozen=True)
class Effective:
    """The settings in force: value, source and where exactly (the flag, variable or file) per key."""

    values: dict[str, Any]
    sources: dict[str, tuple[Source, str]]
    file: Path | None  # the config file read, if any
    looked_for: Path | None  # the default file looked for when none was given
    ignored_env: list[str]  # GWTF_* variables that name no setting
    missing: list[str]  # required settings given nowhere


def settings_of(parser: argparse.ArgumentParser) -> list[Setting]:
    """The settings of `parser`: one per optional flag (not --help, not --config)."""
    out = []
    for a in parser._actions:  # the parser's own list of what it accepts: the one table of the flags
        if not a.option_strings or isinstance(a, argparse._HelpAction) or a.dest == "config":
            continue
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            kind = Kind.SWITCH
        elif isinstance(a, argparse._AppendAction) or a.nargs in ("+", "*"):
            kind = Kind.LIST
        elif a.type in _INTEGER_TYPES:
            kind = Kind.INTEGER
        elif a.type in _NUMBER_TYPES:
            kind = Kind.NUMBER
        elif a.type is None or a.type is str:
            kind = Kind.STRING
        else:
            kind = Kind.SCALAR
        flag = next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
        default = getattr(a, "_config_default", a.default)
        required = getattr(a, "_config_required", a.required)
        out.append(Setting(a.dest, flag, kind, default, a.type, tuple(a.choices) if a.choices else None, required))
    return out


def configurable(parser: argparse.ArgumentParser, command: Callable[[argparse.Namespace], int]):
    """Make every flag of `parser` a setting, and return `command` wrapped to run on the effective settings.

    Call it last, where the parser's defaults are set: `j.set_defaults(func=configurable(j, cmd_join))`.
    The flags' defaults become the settings' defaults (a flag not given leaves no attribute, so that a given
    flag is told from a default one) and required flags may be given in the file or environment instead.
    """
    parser.add_argument("--config", default=None, metavar="FILE",
                        help=f"settings file (TOML; default: STATE_DIR/{CONFIG_FILE_NAME} if present); every flag "
                             f"is also a key of it (--state-dir: state_dir) and a variable {ENV_PREFIX}<KEY> "
                             f"(GWTF_STATE_DIR); flags win over variables, variables over the file")
    for a in parser._actions:
        if a.option_strings and not isinstance(a, argparse._HelpAction) and a.dest != "config":
            a._config_default, a._config_required = a.default, a.required  # type: ignore[attr-defined]
            a.default, a.required = argparse.SUPPRESS, False

    def run(args: argparse.Namespace) -> int:
        eff = resolve(settings_of(parser), args, os.environ)
        for name in eff.ignored_env:
            print(f"warning: {name} names no setting of gwtf-node {parser.prog.split()[-1]}; known: "
                  f"{', '.join(s.env for s in settings_of(parser))}", file=sys.stderr)
        if eff.missing:
            raise CliError(_missing_message(settings_of(parser), eff))
        for key, value in eff.values.items():
            setattr(args, key, value)
        args.config_file = eff.file
        return command(args)

    return run


def _missing_message(settings: list[Setting], eff: Effective) -> str:
    by_key = {s.key: s for s in settings}
    where = eff.file or eff.looked_for or CONFIG_FILE_NAME
    return "; ".join(f"{by_key[k].flag} is required: give the flag, {by_key[k].env}, or {k} = ... in {where}"
                     for k in eff.missing)


def resolve(settings: list[Setting], args: argparse.Namespace, environ: Mapping[str, str]) -> Effective:
    """The effective settings: flags given in `args`, then `environ`, then the config file, then defaults."""
    flags = {s.key: getattr(args, s.key) for s in settings if hasattr(args, s.key)}
    env = {s.key: _from_env(s, environ[s.env]) for s in settings if environ.get(s.env, "") != ""}
    known = {s.env for s in settings}
    ignored = sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known and n not in NOT_SETTINGS)
    path, looked_for, explicit = _config_path(settings, args, environ, flags, env)
    file: dict[str, Any] = {}
    if path is not None:
        file = read_config(path, settings)
        if not explicit and "state_dir" in file and Path(file["state_dir"]).resolve() != path.parent.resolve():
            raise CliError(f"state_dir in {path} names another directory ({file['state_dir']}): the file in a "
                           "state directory configures that directory; give another with --config")
    values: dict[str, Any] = {}
    sources: dict[str, tuple[Source, str]] = {}
    missing = []
    for s in settings:
        if s.key in flags:
            values[s.key], sources[s.key] = flags[s.key], (Source.FLAG, s.flag)
        elif s.key in env:
            values[s.key], sources[s.key] = env[s.key], (Source.ENV, s.env)
        elif s.key in file:
            values[s.key], sources[s.key] = file[s.key], (Source.FILE, str(path))
        else:
            values[s.key], sources[s.key] = s.default, (Source.DEFAULT, "")
            if s.required:
                missing.append(s.key)
    return Effective(values, sources, path, looked_for, ignored, missing)


def _config_path(settings, args, environ, flags, env) -> tuple[Path | None, Path | None, bool]:
    """(the file to read or None, the default file looked for, whether it was named explicitly)."""
    given = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    if given:
        path = Path(given)
        if not path.is_file():
            what = "--config" if getattr(args, "config", None) else CONFIG_ENV
            raise CliError(f"{what} {given}: no such file")
        return path, None, True
    defaults = {s.key: s.default for s in settings}
    state_dir = flags.get("state_dir", env.get("state_dir", defaults.get("state_dir")))
    if state_dir is None:
        return None, None, False
    path = Path(state_dir) / CONFIG_FILE_NAME
    return (path if path.is_file() else None), path, False


def read_config(path: Path, settings: list[Setting]) -> dict[str, Any]:
    """The settings a TOML file sets, checked: raises CliError naming the key and what it expects."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CliError(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): "
                       "a config file is TOML text") from None
    except tomllib.TOMLDecodeError as e:
        raise CliError(f"{path} is not valid TOML: {e}") from None
    by_key = {s.key: s for s in settings}
    out = {}
    for key, value in data.items():
        s = by_key.get(key)
        if s is None:
            close = difflib.get_close_matches(key, by_key, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise CliError(f"unknown key '{key}' in {path}: known keys are {', '.join(sorted(by_key))}{hint}")
        v = _from_file(s, value, path)
        if s.key in PATH_KEYS and isinstance(v, str) and v:
            p = Path(v).expanduser()
            v = str(p if p.is_absolute() else path.parent / p)
        out[key] = v
    return out


def _toml_type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    return type(v).__name__


def _checked(s: Setting, text: str, where: str) -> Any:
    """`text` through the flag's own parser and choices, as argparse would: CliError naming `where`."""
    try:
        v = s.parse(text) if s.parse is not None else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise CliError(f"{where}: {e}") from None
    if s.choices is not None and v not in s.choices:
        raise CliError(f"{where} is {text!r}; expected one of {', '.join(map(str, s.choices))}")
    return v


def _from_file(s: Setting, value: Any, path: Path) -> Any:
    where = f"{s.key} in {path}"
    wrong = CliError(f"{where} is {_toml_type(value)} ({_toml_value(value)}); expected {s.kind.value}"
                     + (f": one of {', '.join(map(str, s.choices))}" if s.choices else ""))
    if s.kind is Kind.SWITCH:
        if not isinstance(value, bool):
            raise wrong
        return value
    if s.kind is Kind.LIST:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise wrong
        return [_checked(s, x, where) for x in items]
    if isinstance(value, bool):
        raise wrong
    if s.kind is Kind.INTEGER and not isinstance(value, int):
        raise wrong
    if s.kind is Kind.NUMBER and not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise wrong
    if s.kind is Kind.STRING and not isinstance(value, str):
        raise wrong
    if s.kind is Kind.SCALAR and not isinstance(value, (str, int, float)):
        raise wrong
    return _checked(s, value if isinstance(value, str) else repr(value), where)


def _from_env(s: Setting, text: str) -> Any:
    where = f"{s.env}={text!r}"
    if s.kind is Kind.SWITCH:
        if text.strip().lower() in _TRUE:
            return True
        if text.strip().lower() in _FALSE:
            return False
        raise CliError(f"{where}: expected 1/true/yes/on or 0/false/no/off")
    if s.kind is Kind.LIST:
        return [_checked(s, x, where) for x in text.replace(",", " ").split()]
    return _checked(s, text, where)


def _toml_value(v: Any) -> str:
    """`v` as a TOML literal."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string is a JSON string for what a setting holds


def format_effective(settings: list[Setting], eff: Effective, command: str = "join") -> str:
    """The effective settings as a TOML file, each line commented with where its value came from."""
    lines = [f"# gwtf-node {command}: effective settings (flag > env {ENV_PREFIX}* > file > default)"]
    if eff.file is not None:
        lines.append(f"# config file: {eff.file}")
    else:
        lines.append("# config file: none" + (f" ({eff.looked_for} does not exist)" if eff.looked_for else ""))
    rows = []
    for s in settings:
        source, detail = eff.sources[s.key]
        origin = source.value + (f" {detail}" if detail else "")
        value = eff.values[s.key]
        if value is None:
            text = f"# {s.key} = (not set{': required' if s.key in eff.missing else ''})"
        else:
            text = f"{s.key} = {_toml_value(value)}"
        rows.append((text, origin))
    width = max(len(t) for t, _ in rows)
    lines += [f"{t:<{width}}  # {o}" for t, o in rows]
    for name in eff.ignored_env:
        lines.append(f"# ignored: {name} names no setting")
    return "\n".join(lines)


def effective_json(settings: list[Setting], eff: Effective) -> dict:
    return {"config_file": str(eff.file) if eff.file else None,
            "settings": {s.key: {"value": eff.values[s.key], "source": eff.sources[s.key][0].value,
                                 "from": eff.sources[s.key][1] or None} for s in settings},
            "missing": eff.missing, "ignored_env": eff.ignored_env}


def add_config_parser(sub, join: argparse.ArgumentParser) -> None:
    """`gwtf-node config show`: the same flags as `join`, printing the effective settings instead of running.

    Add it after the join parser is complete (`configurable` applied), so that it has all of join's flags.
    """
    cfg = sub.add_parser("config", help="the settings of join: where each comes from (config file, GWTF_*, flags)")
    cs = cfg.add_subparsers(dest="config_command", required=True, parser_class=type(cfg))
    show = cs.add_parser("show", parents=[join], add_help=False, conflict_handler="resolve",
                         help="print the effective settings of join, as TOML, with where each value came from",
                         description="Print the settings `gwtf-node join` would run with, given the same flags, "
                                     "environment and config file, as a TOML file: each line says where its value "
                                     "came from (default, file, env, flag).")
    show.add_argument("--json", action="store_true", help="print them as JSON")

    def run(args: argparse.Namespace) -> int:
        settings = settings_of(join)
        eff = resolve(settings, args, os.environ)
        if getattr(args, "json", False):
            print(json.dumps(effective_json(settings, eff), indent=1))
        else:
            print(format_effective(settings, eff))
        if eff.missing:
            print(f"error: {_missing_message(settings, eff)}", file=sys.stderr)
            return EXIT_USAGE
        return 0

    show.set_defaults(func=run)

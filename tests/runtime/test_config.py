"""Settings of `gwtf-node join` from a TOML file, GWTF_* variables and flags: precedence, checks, `config show`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf_node.cli import build_parser, main
from gwtf_node.cli.config import Source, resolve, settings_of

ROOT = Path(__file__).resolve().parents[2]


def _join_parser():
    p = build_parser()
    sub = next(a for a in p._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    return sub.choices["join"]


def _effective(argv: list[str], env: dict[str, str]):
    j = _join_parser()
    return resolve(settings_of(j), j.parse_args(argv), env)


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    return err


def test_every_join_flag_is_a_setting_with_its_variable() -> None:
    j = _join_parser()
    flags = {o for a in j._actions for o in a.option_strings if o.startswith("--")} - {"--help", "--config"}
    settings = settings_of(j)
    assert {s.flag for s in settings} == flags
    for s in settings:  # the documented rule: flag name without dashes, dashes as underscores, upper-cased
        assert s.key == s.flag[2:].replace("-", "_") and s.env == "GWTF_" + s.key.upper()


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.toml").write_text('port = 7001\ncapacity = 5\nname = "from-file"\nrole = "relay"\n'
                                       'run = "run.json"\nbootstrap = ["/ip4/10.0.0.1/tcp/1/p2p/a"]\n')
    env = {"GWTF_PORT": "7002", "GWTF_CAPACITY": "6", "GWTF_BOOTSTRAP": "/ip4/10.0.0.2/tcp/1/p2p/b, /ip4/10.0.0.3/tcp/1/p2p/c"}
    eff = _effective(["--state-dir", str(state), "--port", "7003"], env)
    assert eff.file == state / "config.toml"
    assert (eff.values["port"], eff.sources["port"][0]) == (7003, Source.FLAG)
    assert (eff.values["capacity"], eff.sources["capacity"]) == (6, (Source.ENV, "GWTF_CAPACITY"))
    assert (eff.values["name"], eff.sources["name"][0]) == ("from-file", Source.FILE)
    assert eff.values["bootstrap"] == ["/ip4/10.0.0.2/tcp/1/p2p/b", "/ip4/10.0.0.3/tcp/1/p2p/c"]
    assert eff.values["run"] == str(state / "run.json")  # relative to the file's directory
    assert (eff.values["iterations"], eff.sources["iterations"][0]) == (0, Source.DEFAULT)
    assert eff.missing == []
    assert _effective(["--state-dir", str(tmp_path / "elsewhere")], {}).missing == ["run", "role"]


def test_config_flag_and_variable_name_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text("iterations = 9\n")
    assert _effective(["--config", str(cfg)], {}).values["iterations"] == 9
    assert _effective([], {"GWTF_CONFIG": str(cfg)}).values["iterations"] == 9


@pytest.mark.parametrize("content, needle", [
    ("prot = 5\n", "unknown key 'prot' in {cfg}: known keys are announce, bootstrap, bootstrap_timeout"),
    ("port = \"9000\"\n", "port in {cfg} is a string (\"9000\"); expected an integer"),
    ("port = 70000\n", "port in {cfg}: must be a TCP port in 0..65535"),
    ("port = true\n", "port in {cfg} is a boolean (true); expected an integer"),
    ("bootstrap_timeout = \"soon\"\n", "bootstrap_timeout in {cfg} is a string"),
    ("role = \"dta\"\n", "role in {cfg} is 'dta'; expected one of data, relay"),
    ("role = 1\n", "role in {cfg} is an integer (1); expected a string: one of data, relay"),
    ("bootstrap = 5\n", "bootstrap in {cfg} is an integer (5); expected a list of strings"),
    ("host = \"example.org\"\n", "host in {cfg}: must be an IPv4 or IPv6 address"),
    ("log_level = \"info\"\n", "log_level in {cfg} is 'info'; expected one of DEBUG, INFO, WARNING, ERROR"),
    ("[join]\nport = 1\n", "unknown key 'join'"),
    ("port = \n", "is not valid TOML"),
])
def test_a_bad_config_file_names_the_key(tmp_path: Path, capsys, content: str, needle: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(content)
    err = _one_line_error(capsys, ["join", "--state-dir", str(tmp_path), "--run", "r.json", "--role", "data"])
    assert needle.format(cfg=cfg) in err, err


def test_a_bad_variable_or_missing_file_names_it(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GWTF_PORT", "abc")
    assert "GWTF_PORT='abc': expected a whole number" in _one_line_error(capsys, ["join", "--state-dir", str(tmp_path)])
    monkeypatch.delenv("GWTF_PORT")
    err = _one_line_error(capsys, ["join", "--config", str(tmp_path / "absent.toml")])
    assert f"--config {tmp_path / 'absent.toml'}: no such file" in err
    err = _one_line_error(capsys, ["join", "--state-dir", str(tmp_path)])
    assert "--run is required: give the flag, GWTF_RUN, or run = ... in" in err
    (tmp_path / "config.toml").write_bytes(b"name = \"caf\xe9\"\n")
    assert "is not UTF-8 text" in _one_line_error(capsys, ["join", "--state-dir", str(tmp_path)])


def test_the_file_settings_reach_join(tmp_path: Path, capsys) -> None:
    """A config file alone (no flags but the state directory) runs join's own checks on its values."""
    (tmp_path / "config.toml").write_text('run = "run.json"\nrole = "relay"\nstage = "7"\ninsecure_unsigned = true\n')
    from gwtf_node.model.manifest import default_manifest, save_manifest
    save_manifest(default_manifest(), tmp_path / "run.json")
    assert "--stage 7 is outside the run's stages 0..1" in _one_line_error(capsys, ["join", "--state-dir", str(tmp_path)])


def test_config_show_prints_values_and_sources(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "config.toml").write_text('port = 7001\nrole = "relay"\nrun = "/x/run.json"\n')
    monkeypatch.setenv("GWTF_CAPACITY", "4")
    monkeypatch.setenv("GWTF_PROT", "1")
    assert main(["config", "show", "--state-dir", str(tmp_path), "--name", "n1"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split("=")[0].strip(): ln for ln in out.splitlines() if not ln.startswith("#")}
    assert lines["port"].startswith("port = 7001") and lines["port"].endswith(f"# file {tmp_path / 'config.toml'}")
    assert lines["capacity"].endswith("# env GWTF_CAPACITY")
    assert lines["name"].startswith('name = "n1"') and lines["name"].endswith("# flag --name")
    assert lines["iterations"].endswith("# default")
    assert "# ignored: GWTF_PROT names no setting" in out
    assert main(["config", "show", "--state-dir", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["settings"]["port"] == {"value": 7001, "source": "file", "from": str(tmp_path / "config.toml")}


def test_config_show_output_is_a_valid_config(tmp_path: Path, capsys) -> None:
    """What `config show` prints can be saved as config.toml and gives the same settings back."""
    assert main(["config", "show", "--state-dir", str(tmp_path), "--run", str(tmp_path / "run.json"),
                 "--role", "data", "--port", "7005", "--bootstrap", "/ip4/1.2.3.4/tcp/5/p2p/x"]) == 0
    first = capsys.readouterr().out
    (tmp_path / "config.toml").write_text(first)
    assert main(["config", "show", "--state-dir", str(tmp_path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["settings"]
    assert again["port"]["value"] == 7005 and again["bootstrap"]["value"] == ["/ip4/1.2.3.4/tcp/5/p2p/x"]
    assert again["role"] == {"value": "data", "source": "file", "from": str(tmp_path / "config.toml")}


def test_config_show_in_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("prot = 5\n")
    out = subprocess.run([sys.executable, "-m", "gwtf_node.cli", "config", "show", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: unknown key 'prot' in {tmp_path / 'config.toml'}: known keys are ")
    assert out.stderr.count("\n") == 1 and "did you mean 'port'?" in out.stderr

"""Python warnings reach the node log once each, never a flood on stderr (runtime/ops/logs.py WarningRouter)."""

import subprocess
import sys
from pathlib import Path

CODE = """
import sys, warnings
from pathlib import Path
from gwtf_node.runtime.ops.logs import setup_logging
setup = setup_logging(sys.argv[2], Path(sys.argv[1]))
def deprecated_call():
    warnings.warn("`past_key_values` is deprecated", FutureWarning, stacklevel=1)
for _ in range(200):
    deprecated_call()
    with warnings.catch_warnings():  # leaving it resets Python's once-per-location registry
        warnings.simplefilter("ignore", UserWarning)
warnings.warn("another one", UserWarning)
warnings.warn("for developers only", DeprecationWarning)
warnings.warn("an unclosed socket", ResourceWarning)
setup.close()
"""


def _run(tmp_path: Path, level: str) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-c", CODE, str(tmp_path), level], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, (tmp_path / "node.log").read_text()


def test_a_repeated_library_warning_is_one_line(tmp_path: Path) -> None:
    err, log = _run(tmp_path, "INFO")
    assert err.count("past_key_values") == 1, err
    assert log.count("past_key_values") == 1
    assert "WARNING py.warnings: FutureWarning: `past_key_values` is deprecated" in log
    assert log.count("another one") == 1
    assert "for developers only" not in err + log and "unclosed" not in err + log
    assert len(err.splitlines()) == 2, err  # the two distinct warnings, nothing else


def test_repeats_are_kept_at_debug(tmp_path: Path) -> None:
    _, log = _run(tmp_path, "DEBUG")
    assert log.count("WARNING py.warnings: FutureWarning") == 1
    assert "DEBUG py.warnings: FutureWarning: `past_key_values` is deprecated" in log
    assert "repeated 198 more times" in log  # the flood filter counts the identical DEBUG lines

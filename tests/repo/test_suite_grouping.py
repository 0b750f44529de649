"""The test command's `--dist loadgroup` keeps a module's shared fixture in one worker.

tests/conftest.py gives the tests that share a module's swarm one `xdist_group`; pytest-xdist must then send
them all to one worker, or each worker that receives one of them starts that swarm anew (with pytest 9.2 and
pytest-xdist 3.8, the group never reaches the node ids, and the suite started every shared swarm up to three
times; the dev extra holds pytest under 9.2).  This runs the installed pytest and pytest-xdist on a small suite whose module fixture counts its
set-ups.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = '''
import os
import pytest

@pytest.fixture(scope="module")
def shared():
    with open(os.environ["SETUPS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    yield

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(shared, i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
'''


def test_a_groups_module_fixture_is_set_up_once_across_three_workers(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(SUITE)
    setups = tmp_path / "setups"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"SETUPS_FILE": str(setups)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "12 passed" in done.stdout, done.stdout[-3000:]
    pids = setups.read_text().split()
    assert len(pids) == 1, f"the module fixture was set up in {len(pids)} workers: pytest-xdist ignores xdist_group"


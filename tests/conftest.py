"""Shared test helpers.

Tests that need something a laptop may lack (root, scontrol, mpirun) call
``require``: it skips with the reason, unless HPCTORCH_REQUIRE_CLUSTER=1 (set by
.ci/run), where a missing requirement is a failure.
"""

from __future__ import annotations

import atexit
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .environment import clean_env  # noqa: F401 - the tests import it from here
from .standbys import standbys_of  # noqa: F401 - the tests import it from here

ROOT = Path(__file__).resolve().parent.parent


def _folder_of_this_run(prefix: str) -> str:
    """A temporary folder that goes with this test process."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, True)
    return folder


# A job the tests start may name a bad node (the screen, a straggler, a SIGBUS): never in the user's
# own list, which their next 'hpctorch submit' would read.
os.environ.setdefault("HPCTORCH_BAD_NODES", os.path.join(_folder_of_this_run("hpctorch-tests-"), "bad-nodes.jsonl"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # A run's secret (guard.authority's file mechanism) is kept by run id in the user's state
    # folder, and tests reuse run ids ("wd"): two workers side by side replaced each other's, and
    # a watchdog then met the other's secret and ran unwatched. Each worker keeps its own, as two
    # jobs never share a run id.
    os.environ["XDG_STATE_HOME"] = _folder_of_this_run("hpctorch-state-")
EXAMPLES = ROOT / "examples"
STRICT = os.environ.get("HPCTORCH_REQUIRE_CLUSTER") == "1"


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if STRICT:
        pytest.fail(f"required in CI (HPCTORCH_REQUIRE_CLUSTER=1): {reason}")
    pytest.skip(reason)


WAIT_FOR_STANDBYS = inspect.getsource(standbys_of) + """
def wait_for_standbys(count):
    # Waited for, not slept on: a loaded machine spawns them late.
    deadline = time.monotonic() + 180
    while len(standbys_of(os.environ["JOB_MARK"])) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"fewer than {count} standbys after 180 s")
        time.sleep(0.1)
"""
"""Source for a worker script (it needs ``os`` and ``time``): ``wait_for_standbys(count)``, this
job's standbys (``standbys_of``, the same function the tests call) counted until there are ``count``."""


PREFIX = re.compile(r"^\[[^\]\n]*rank \d+\]: ", re.M)


def unprefixed(output: str) -> str:
    """Worker output without hpctorch's '[host rank R]: ' line prefixes (per-task mode has none)."""
    return PREFIX.sub("", output)


def hpctorch(*args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the hpctorch CLI in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "hpctorch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=cwd or ROOT,
    )


FIRST_CLUSTER_SHARD = {"test_slurm_cluster.py", "test_interop_cluster.py", "test_squatter_cluster.py"}
"""With HPCTORCH_CLUSTER_SHARD=1 or 2 (scripts/run-tests), a test process runs only its half of the
cluster tests: the first these modules' (about half the cluster tests' time, and every job of theirs a Slurm job,
whose port is derived from its own job id), the second every other."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = os.environ.get("HPCTORCH_CLUSTER_SHARD")
    if shard not in ("1", "2"):
        return
    first = shard == "1"
    mine = [item for item in items if item.get_closest_marker("cluster") is None or (item.path.name in FIRST_CLUSTER_SHARD) == first]
    if len(mine) < len(items):
        kept = {id(item) for item in mine}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = mine

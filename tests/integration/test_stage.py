"""--stage-env on one machine: simulated nodes run their workers from the copy (a small venv built
for the test, packed and unpacked for real: tests/smallenv.py), a second run reuses it, and the
copy's interpreter is the whole worker's (sys.prefix, sys.executable, the environment's own
packages), under hpctorch's starter and torch's agent alike. The test run's own 1.5 GB environment
is staged on the cluster (tests/cluster/test_venv_staging_cluster.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .. import smallenv
from ..conftest import ROOT, clean_env, require, unprefixed

WHERE = """
import os, sys, json, torch, torch.distributed as dist, stagedmark
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print("where " + json.dumps({"rank": dist.get_rank(), "sum": total.item(), "prefix": sys.prefix, "base": sys.base_prefix,
                             "mark": stagedmark.__file__, "torch": torch.__file__, "executable": sys.executable}), flush=True)
dist.destroy_process_group()
os._exit(0)
"""


@pytest.fixture(scope="module")
def small_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    why = smallenv.missing()
    require(why is None, f"the staging tests' small environment needs {why}")
    return smallenv.make(tmp_path_factory.mktemp("smallenv") / "env")


def hpctorch_in(python: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``hpctorch`` run by ``python`` (the small environment's), as a user of that environment would."""
    return subprocess.run([str(python), "-m", "hpctorch", *args], capture_output=True, text=True, env=clean_env(), timeout=timeout, cwd=ROOT)


def where(output: str) -> list[dict]:
    return [json.loads(line[len("where "):]) for line in unprefixed(output).splitlines() if line.startswith("where ")]


def test_simulated_nodes_run_from_the_copy_and_later_runs_reuse_it(tmp_path: Path, small_python: Path) -> None:
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    stage = tmp_path / "stage"
    stage.mkdir()
    env_root = small_python.parent.parent
    args = ("run", "--simulate-nodes", "2", "--nproc-per-node", "1", "--stage-env", "--stage-dir", str(stage), str(script))
    done = hpctorch_in(small_python, *args, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    copies = next((stage / f"hpctorch-stage-{os.getuid()}").glob("*/copies"))
    (copy,) = [p for p in copies.iterdir() if p.name != ".users"]  # .users: which processes run from which copy
    ranks = where(done.stdout + done.stderr)
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["sum"] for r in ranks} == {2.0}
    for r in ranks:
        for field in ("prefix", "mark", "executable"):
            assert r[field].startswith(str(copy) + "/"), (field, r)
        assert r["base"] == "/usr" and not r["torch"].startswith(str(copy))  # the system's, and a path the .pth names: not copied
    assert {r["prefix"] for r in ranks} != {str(env_root)}
    assert re.search(r"hpctorch: the workers run from a copy of .* on each node's own disk", done.stderr)
    # One machine, the environment on its own disk: said to gain nothing (it is staged as asked).
    assert re.search(r"hpctorch: --stage-env on one machine whose environment \(.*\) is on its own disk \(\w+\): the copy gains nothing", done.stderr)
    assert re.search(r"hpctorch: packing the environment \(\d+ files, \d+\.\d MiB\)", done.stderr), done.stderr[-3000:]
    made = json.loads((copy / "staged.json").read_text())["made"]
    again = hpctorch_in(small_python, *args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.name for p in copies.iterdir() if p.name != ".users"] == [copy.name]
    assert json.loads((copy / "staged.json").read_text())["made"] == made  # reused, not made again
    assert {r["mark"] for r in where(again.stdout + again.stderr)} == {r["mark"] for r in ranks}
    # torch's elastic agent (--max-restarts) starts the workers from the same copy.
    agent = hpctorch_in(small_python, "run", "--nproc-per-node", "2", "--max-restarts", "1", "--stage-env", "--stage-dir", str(stage),
                        str(script), timeout=300)
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert {r["mark"] for r in where(agent.stdout + agent.stderr)} == {r["mark"] for r in ranks}

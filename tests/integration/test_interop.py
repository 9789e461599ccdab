"""Lightning, Accelerate and DeepSpeed scripts, unchanged, under hpctorch run: the ranks
and world size as each framework reports them, per node (2 simulated nodes x 2) and per
task (mpirun starting every rank)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from ..conftest import ROOT, clean_env, hpctorch, require
from ..interop import FRAMEWORKS, JOB_LIMIT_S, example, expected, reported


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_per_node_on_two_simulated_nodes(framework: str) -> None:
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "2", example(framework), env=clean_env(), timeout=JOB_LIMIT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert reported(done.stdout, framework) == expected(framework, [(0, 0, 4, 0), (1, 1, 4, 0), (2, 0, 4, 1), (3, 1, 4, 1)])
    if framework == "lightning":
        assert "TorchElasticEnvironment" in done.stdout


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_per_task_under_mpirun(framework: str) -> None:
    require(shutil.which("mpirun.openmpi") is not None, "Open MPI (mpirun.openmpi) is not installed")
    script = example(framework)
    done = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", "4", sys.executable, "-m", "hpctorch", "run", script],
                          capture_output=True, text=True, env=clean_env(), timeout=JOB_LIMIT_S, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert reported(done.stdout, framework) == expected(framework, [(r, r, 4, 0) for r in range(4)])

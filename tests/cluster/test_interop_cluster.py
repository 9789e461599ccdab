"""The frameworks under real srun on 2 nodes: per task (srun starts every rank, the case
where Lightning's own SLURMEnvironment would otherwise take over) and per node."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..interop import FRAMEWORKS, JOB_LIMIT_S, example, expected, hosts, reported
from .conftest import PYTHON
from .harness import Cluster

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("mode", ["per-task", "per-node"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_framework_under_srun(cluster: Cluster, job_dir: Path, framework: str, mode: str) -> None:
    script = example(framework)
    srun = ["srun", "-N2", "--kill-on-bad-exit=1"]
    if mode == "per-task":
        argv = [*srun, "--ntasks-per-node=2", PYTHON, "-m", "hpctorch", "run", script]
    else:
        argv = [*srun, "--ntasks-per-node=1", PYTHON, "-m", "hpctorch", "run", "--nproc-per-node", "2", script]
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *argv], timeout=JOB_LIMIT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert reported(done.stdout, framework) == expected(framework, [(0, 0, 4, 0), (1, 1, 4, 0), (2, 0, 4, 1), (3, 1, 4, 1)])
    assert hosts(done.stdout, framework) == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    if framework == "lightning":
        assert "SLURMEnvironment" not in done.stdout and "TorchElasticEnvironment" in done.stdout

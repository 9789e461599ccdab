"""The torchrun line of most Slurm recipes, with the command name swapped, under real srun:
torch's c10d rendezvous at the first node's host name (which resolves to the management
network here: hpctorch reaches that node on the fabric)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..conftest import unprefixed
from .conftest import PYTHON, TOY, toy_ranks
from .harness import Cluster

pytestmark = pytest.mark.cluster

LINE = (f"{PYTHON} -m hpctorch run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d "
        '--rdzv-endpoint "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):29500" '
        f'--rdzv-id "$SLURM_JOB_ID" {TOY} --steps 6')


def test_the_common_torchrun_line_under_srun(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=1",
                                 "--kill-on-bad-exit=1", "sh", "-c", LINE], timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    ranks = toy_ranks(done.stdout)
    # torch's c10d rendezvous numbers the nodes; each host holds two consecutive ranks.
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1, 2, 3] and {r["world"] for r in ranks} == {"4"}
    by_host = {host: sorted(int(r["rank"]) for r in ranks if r["host"] == host) for host in ("node1", "node2")}
    assert sorted(by_host.values()) == [[0, 1], [2, 3]], by_host
    masters = {r["master"] for r in ranks}
    assert len(masters) == 1 and next(iter(masters)).startswith("198.18.0."), masters  # the fabric, not 198.19
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", unprefixed(done.stdout), re.M)]
    assert losses and losses[-1] < losses[0]

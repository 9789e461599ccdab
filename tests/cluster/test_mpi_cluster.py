"""hpctorch under a real OpenMPI mpirun across the namespace nodes (the seed's method)."""

from __future__ import annotations

import pytest

from ..conftest import require
from .conftest import PYTHON, TOY, assert_trained_across_nodes, toy_ranks
from .harness import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def _mpi4py() -> None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        require(False, "mpi4py is not installed (pip install 'hpctorch[mpi]')")


def test_mpirun_one_rank_per_node_is_per_node_mode(cluster: Cluster) -> None:
    argv = cluster.mpirun(1, [PYTHON, "-m", "hpctorch", "run", "--nproc-per-node", "2", TOY, "--steps", "6"])
    done = subprocess_run(cluster, argv)
    assert_trained_across_nodes(done.stdout)
    assert any(line.split()[:2] == ["mode", "per-node"] for line in done.stderr.splitlines()), done.stderr[-2000:]  # the banner
    assert {r["agent"] for r in toy_ranks(done.stdout)} == {"torch"}


def test_mpirun_every_rank_is_per_task_mode(cluster: Cluster) -> None:
    argv = cluster.mpirun(2, [PYTHON, "-m", "hpctorch", "run", TOY, "--steps", "6"])
    done = subprocess_run(cluster, argv)
    assert_trained_across_nodes(done.stdout)
    # Per task, hpctorch execs each rank: no torch agent started them, none prefixed output.
    assert {r["agent"] for r in toy_ranks(done.stdout)} == {"none"}, done.stdout[-2000:]
    assert "[node1 rank" not in done.stdout


def test_init_under_mpirun_without_a_launcher(cluster: Cluster) -> None:
    argv = cluster.mpirun(2, [PYTHON, TOY, "--init", "hpctorch", "--steps", "6"])
    done = subprocess_run(cluster, argv)
    assert_trained_across_nodes(done.stdout)


def subprocess_run(cluster: Cluster, argv: list[str]):  # type: ignore[no-untyped-def]
    done = cluster.run("node1", argv, timeout=180)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done

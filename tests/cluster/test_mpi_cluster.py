"""hpctorch under real MPI launchers across the namespace nodes (the seed's method): OpenMPI's
mpirun and MPICH's Hydra (mpiexec.hydra, PMI-1 over PMI_FD), with mpi4py's wheel, which carries
both ABIs: hpctorch asks it for the launcher's family."""

from __future__ import annotations

import re

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
    # hpctorch starts each node's workers itself (no torch agent), prefixing their output.
    assert {r["agent"] for r in toy_ranks(done.stdout)} == {"none"}
    assert re.search(r"^\[\S+ rank 0\]: ", done.stdout, re.M), done.stdout[-2000:]


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


def test_hydra_one_rank_per_node_is_per_node_mode(cluster: Cluster) -> None:
    done = subprocess_run(cluster, cluster.hydra(1, [PYTHON, "-m", "hpctorch", "run", "--nproc-per-node", "2", TOY, "--steps", "6"]))
    assert_trained_across_nodes(done.stdout)
    # hpctorch starts each node's workers itself (no torch agent), prefixing their output.
    assert {r["agent"] for r in toy_ranks(done.stdout)} == {"none"}
    assert re.search(r"^\[\S+ rank 0\]: ", done.stdout, re.M), done.stdout[-2000:]


def test_hydra_every_rank_is_per_task_mode(cluster: Cluster) -> None:
    done = subprocess_run(cluster, cluster.hydra(2, [PYTHON, "-m", "hpctorch", "run", TOY, "--steps", "6"]))
    assert_trained_across_nodes(done.stdout)
    assert {r["agent"] for r in toy_ranks(done.stdout)} == {"none"}, done.stdout[-2000:]


def test_init_under_hydra_without_a_launcher(cluster: Cluster) -> None:
    done = subprocess_run(cluster, cluster.hydra(2, [PYTHON, TOY, "--init", "hpctorch", "--steps", "6"]))
    assert_trained_across_nodes(done.stdout)


def test_hydra_inside_a_slurm_job_is_read_as_mpi(cluster: Cluster, job_dir) -> None:  # type: ignore[no-untyped-def]
    # Hydra's Slurm bootstrap: srun starts one proxy per node (the step's tasks), the ranks
    # below them carry Hydra's PMI values, not the step's.
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nmpiexec.hydra -bootstrap slurm -iface hsn0 -np 4 -ppn 2 {PYTHON} -m hpctorch run {TOY} --steps 6\n")
    state, output = cluster.sbatch(job_dir, script, "-N2", "--ntasks-per-node=2")
    assert state == "COMPLETED", output[-3000:]
    assert_trained_across_nodes(output)
    assert {r["agent"] for r in toy_ranks(output)} == {"none"}


def test_mpi4py_on_another_mpi_than_the_launchers_is_one_line_not_a_world_of_one(cluster: Cluster) -> None:
    # Open MPI's library under MPICH's mpiexec: MPI_Init sees a singleton. Before, one node
    # then ran a local job on loopback and "succeeded".
    argv = cluster.hydra(1, ["env", "MPI4PY_LIBMPI=libmpi.so.40", PYTHON, "-m", "hpctorch", "run", "--nproc-per-node", "2", TOY, "--steps", "6"])
    done = cluster.run("node1", argv, timeout=180)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("hpctorch: error:")]
    assert len(errors) == 2, done.stderr[-3000:]  # one line from each node
    assert "mpich started 2 tasks" in errors[0] and "sees a world of 1" in errors[0] and "Open MPI" in errors[0], errors[0]
    assert "MPI4PY_LIBMPI=libmpi.so.40 from the environment" in errors[0]
    assert "step 0" not in done.stdout


def subprocess_run(cluster: Cluster, argv: list[str]):  # type: ignore[no-untyped-def]
    done = cluster.run("node1", argv, timeout=180)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done

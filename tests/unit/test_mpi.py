"""MPI detection (OpenMPI captured here; others from their documentation) and the allgather's arithmetic."""

from __future__ import annotations

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.plan.bootstrap import from_records
from hpctorch.schedulers import detect
from hpctorch.schedulers.allocation import Launched

from .fixtures import load_env


@pytest.mark.parametrize(
    "fixture, scheduler, rank, local, tasks, node_rank, job_id",
    [
        ("mpi/openmpi_2x2_rank3.env", "openmpi", 3, 1, (2, 2), None, "1633746945"),
        ("mpi/mpich_hydra_2x2_rank2.env", "mpich", 2, 0, (2, 2), None, None),
        ("mpi/mvapich2_2x1_rank1.env", "mvapich2", 1, 0, (1, 1), None, None),
        ("mpi/cray_pals_2x4_rank5.env", "cray-pals", 5, 1, (4, 4), 1, "6f2e1c7a-4d55-4b5c-9a39-2c1d1b0e7f11"),
    ],
)
def test_each_mpi_flavour(fixture: str, scheduler: str, rank: int, local: int, tasks: tuple[int, ...], node_rank: int | None, job_id: str | None) -> None:
    a = detect(load_env(fixture))
    assert (a.scheduler, a.task_rank, a.local_task_rank, a.tasks_per_node, a.node_rank, a.job_id) == (scheduler, rank, local, tasks, node_rank, job_id)
    assert a.launched is Launched.UNNAMED and a.nodes == ()


def test_openmpi_node_rank_variable_is_not_the_node_rank() -> None:
    env = load_env("mpi/openmpi_2x2_rank3.env")
    assert env["OMPI_COMM_WORLD_NODE_RANK"] == "1"  # happens to equal the local rank
    assert detect(env).node_rank is None  # the allgather decides


def test_allgather_numbers_nodes_by_host_in_rank_order() -> None:
    base = detect(load_env("mpi/openmpi_2x2_rank3.env"))
    records = [["node1", "198.18.0.1"], ["node1", "198.18.0.1"], ["node2", "198.18.0.2"], ["node2", "198.18.0.2"]]
    a = from_records(base, 3, records, 41000)
    assert (a.nodes, a.tasks_per_node, a.node_rank, a.local_task_rank) == (("node1", "node2"), (2, 2), 1, 1)
    assert (a.master_addr, a.master_port, a.launched) == ("198.18.0.1", 41000, Launched.RANKS)
    assert "allgather" in a.sources["master_addr"]


def test_allgather_on_one_host_leaves_the_master_to_loopback() -> None:
    base = detect(load_env("mpi/openmpi_2x2_rank3.env"))
    a = from_records(base, 1, [["vm", "10.0.0.5"], ["vm", "10.0.0.5"]], 41000)
    assert (a.nodes, a.tasks_per_node, a.master_addr, a.master_port) == (("vm",), (2,), None, 41000)


def test_heterogeneous_placement_is_counted_per_node() -> None:
    base = detect(load_env("mpi/mpich_hydra_2x2_rank2.env"))
    records = [["a", "x"], ["a", "x"], ["a", "x"], ["b", "y"]]
    a = from_records(base, 3, records, 1)
    assert (a.tasks_per_node, a.node_rank, a.local_task_rank) == ((3, 1), 1, 0)


def test_cyclic_mapping_is_refused() -> None:
    base = detect(load_env("mpi/openmpi_2x2_rank3.env"))
    with pytest.raises(HpctorchError, match="cyclic"):
        from_records(base, 0, [["a", "x"], ["b", "y"], ["a", "x"], ["b", "y"]], 1)


def test_inconsistent_mpi_variables() -> None:
    with pytest.raises(HpctorchError, match="OMPI_COMM_WORLD_RANK=4 is out of range"):
        detect(load_env("mpi/openmpi_2x2_rank3.env", OMPI_COMM_WORLD_RANK="4"))


def test_hydra_inside_a_slurm_step_is_mpi_and_srun_pmi_is_slurm() -> None:
    step = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "1",
            "SLURM_LOCALID": "0"}
    # srun's own PMI: PMI_RANK/PMI_SIZE are the step's.
    assert detect({**step, "PMI_RANK": "1", "PMI_SIZE": "2"}).scheduler == "slurm"
    # Hydra's proxies are the step's tasks; the ranks below them have their own PMI values.
    hydra = detect({**step, "PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"})
    assert (hydra.scheduler, hydra.task_rank, hydra.tasks_per_node) == ("mpich", 5, (4, 4))


def test_mpi4py_is_asked_for_the_launchers_mpi_family_unless_the_user_chose() -> None:
    from hpctorch.plan import bootstrap
    from hpctorch.schedulers import detect

    hydra = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1", "PMI_FD": "6"}
    env, why = bootstrap._mpi4py_env(detect(hydra), hydra)
    assert env["MPI4PY_LIBMPI"].split(":") == ["libmpi.so.12", "libmpich.so.12"] and "mpich's family" in why
    openmpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    assert bootstrap._mpi4py_env(detect(openmpi), openmpi)[0]["MPI4PY_LIBMPI"] == "libmpi.so.40"
    chosen = {**hydra, "MPI4PY_LIBMPI": "/opt/cray/libmpi.so.12"}
    env, why = bootstrap._mpi4py_env(detect(chosen), chosen)
    assert env["MPI4PY_LIBMPI"] == "/opt/cray/libmpi.so.12" and why == "MPI4PY_LIBMPI=/opt/cray/libmpi.so.12 from the environment"

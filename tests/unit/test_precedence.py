"""Which launcher wins when several left their variables (shared/DESIGN.md, Precedence)."""

from __future__ import annotations

import pytest

from hpctorch.schedulers import detect

from .fixtures import load_env

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "MASTER_ADDR": "198.18.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}


def merged(*fixtures: str, **extra: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for fixture in fixtures:
        env.update(load_env(fixture))
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "case, env, scheduler",
    [
        ("torchrun inside an srun step", merged("slurm/srun_2x1_rank1.env", **TORCHRUN), "torchrun"),
        ("mpirun inside an sbatch script", merged("slurm/sbatch_batch_script.env", "mpi/openmpi_2x2_rank3.env"), "openmpi"),
        ("srun step with srun's PMI variables", merged("slurm/srun_2x2_rank3.env", PMI_RANK="3", PMI_SIZE="4"), "slurm"),
        ("Hydra mpiexec inside a batch script", merged("slurm/sbatch_batch_script.env", "mpi/mpich_hydra_2x2_rank2.env"), "mpich"),
        ("plain srun step", load_env("slurm/srun_2x2_rank3.env"), "slurm"),
        ("nothing", {}, "local"),
    ],
)
def test_precedence(case: str, env: dict[str, str], scheduler: str) -> None:
    assert detect(env).scheduler == scheduler, case


def test_slurm_step_variables_win_over_job_variables() -> None:
    a = detect(load_env("slurm/salloc_srun_one_node.env"))
    assert a.nodes == ("node1",)  # the step's, not the job's node[1-2]

"""Under real srun, with torch's variables pre-set the way enroot's PyTorch hook sets them
inside every NGC container (NVIDIA/enroot conf/hooks/extra/50-slurm-pytorch.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import PYTHON, TOY, assert_trained_across_nodes
from .harness import Cluster

pytestmark = pytest.mark.cluster
HPCTORCH = (PYTHON, "-m", "hpctorch")

# The hook's lines, as a wrapper that then execs the command (the hook writes them into the
# container's environment file instead; what the task sees is the same).
HOOK = """#!/bin/sh
export MASTER_ADDR="$(scontrol show hostname "$SLURM_STEP_NODELIST" | head -n1)"
export MASTER_PORT="$((SLURM_JOB_ID % 4536 + 61000))"
export WORLD_SIZE="$SLURM_NTASKS" RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID"
if [ "${SLURM_STEP_NUM_TASKS:-1}" -gt "${SLURM_STEP_NUM_NODES:-1}" ]; then export OMP_NUM_THREADS=1; fi
exec "$@"
"""


def srun(cluster: Cluster, job_dir: Path, per_node: int, *argv: str, **env: str):  # type: ignore[no-untyped-def]
    hook = job_dir / "hook.sh"
    hook.write_text(HOOK)
    return cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", f"--ntasks-per-node={per_node}",
                                 "--kill-on-bad-exit=1", "sh", str(hook), *argv], **env)


def test_per_node_under_the_hook(cluster: Cluster, job_dir: Path) -> None:
    done = srun(cluster, job_dir, 1, *HPCTORCH, "run", "--verbose", "--nproc-per-node", "2", TOY, "--steps", "6")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)
    # The hook's MASTER_ADDR names node1, which resolves to the management network here.
    assert "198.18.0.1" in done.stderr and "by a name not trusted" in done.stderr


def test_per_task_under_the_hook(cluster: Cluster, job_dir: Path) -> None:
    done = srun(cluster, job_dir, 2, *HPCTORCH, "run", TOY, "--steps", "6")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)


def test_a_wrapper_that_contradicts_slurm_fails_in_one_line(cluster: Cluster, job_dir: Path) -> None:
    done = srun(cluster, job_dir, 1, "env", "WORLD_SIZE=8", *HPCTORCH, "run", "--nproc-per-node", "2", TOY, "--steps", "2")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpctorch: error:")]
    assert lines and all("WORLD_SIZE=8 contradicts slurm, which says 2" in line for line in lines), done.stderr[-2000:]
    assert "Traceback" not in done.stderr

"""hpctorch on a real 2-node Slurm cluster, run the way users run it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from .conftest import PYTHON, TOY, assert_trained_across_nodes
from .harness import Cluster

pytestmark = pytest.mark.cluster
HPCTORCH = (PYTHON, "-m", "hpctorch")


def sbatch(cluster: Cluster, job_dir: Path, body: str, *options: str) -> str:
    script = job_dir / "job.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    state, output = cluster.sbatch(job_dir, script, *options)
    assert state == "COMPLETED", (state, output)
    return output


def test_sbatch_with_srun_per_node(cluster: Cluster, job_dir: Path) -> None:
    body = f"srun {' '.join(HPCTORCH)} run --nproc-per-node 2 {TOY} --steps 6"
    output = sbatch(cluster, job_dir, body, "-N2", "--ntasks-per-node=1")
    assert_trained_across_nodes(output)


def test_batch_script_without_srun_starts_the_step_itself(cluster: Cluster, job_dir: Path) -> None:
    body = f"{' '.join(HPCTORCH)} run --nproc-per-node 2 {TOY} --steps 6"
    output = sbatch(cluster, job_dir, body, "-N2", "--ntasks-per-node=1")
    assert "re-running under 'srun --nodes=2 --ntasks-per-node=1" in output
    assert_trained_across_nodes(output)


def test_srun_per_task(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", *HPCTORCH, "run", TOY, "--steps", "6"])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)


def test_init_under_srun_without_a_launcher(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1", PYTHON, TOY, "--init", "hpctorch", "--steps", "6"])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)


def test_interface_trap_fails_fast_on_the_management_net_and_passes_on_the_fabric(cluster: Cluster, job_dir: Path) -> None:
    srun = ("srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1")
    # Forced onto the management interface the hostnames resolve to: node2 cannot reach node1.
    started = time.monotonic()
    bad = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *srun, *HPCTORCH, "run", "--iface", "mgmt0", "--rdzv-timeout", "10", "--nproc-per-node", "2", TOY], timeout=120)
    assert bad.returncode != 0
    assert time.monotonic() - started < 60
    assert "hpctorch: error: rendezvous at 198.19.0.1:" in bad.stderr, bad.stderr
    # By default hpctorch picks the fabric and exchanges node1's fabric address itself.
    good = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *srun, *HPCTORCH, "run", "--nproc-per-node", "2", TOY, "--steps", "6"])
    assert good.returncode == 0, (good.stdout[-2000:], good.stderr[-3000:])
    assert_trained_across_nodes(good.stdout)
    assert "GLOO_SOCKET_IFNAME=hsn0" in good.stderr and "read from" not in good.stderr  # node 0 prints the plan


def test_hpctorch_submit_writes_a_script_slurm_runs(cluster: Cluster, job_dir: Path) -> None:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), *HPCTORCH, "submit", "--scheduler", "slurm",
                                 "--nodes", "2", "--nproc-per-node", "2", "--time", "5", "--job-name", "toy", TOY, "--steps", "6"])
    assert done.returncode == 0, done.stderr
    match = re.search(r"submitted slurm job (\d+); script: (\S+); logs: (\S+)", done.stdout)
    assert match, done.stdout
    job_id, script, logs = match.groups()
    assert logs == f"hpctorch-toy-{job_id}.out" and (job_dir / script).exists()
    assert cluster.wait_job(job_id) == "COMPLETED"
    assert_trained_across_nodes((job_dir / logs).read_text())

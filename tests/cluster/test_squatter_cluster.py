"""Only your own job, on 2 real Slurm nodes: another user of node1 (a real second uid) binds the
job's derived master port first and runs the genuine ``hpctorch run`` as "node 0" with the job's
Slurm variables and a Python environment of its own, whose .pth leaves a marker naming the uid of
every process that imports it. The job's node 0 finds its port held (by whom /proc says) and
serves on the next of the job's ports; its node 1 finds a store there that does not authenticate
(MUNGE says who made its credential), says so, and joins node 0 at the next port. The job trains
on its own nodes; no process of the job's user imports the squatter's environment, and the
squatter's job never sees the job's ranks. With --stage-env and without."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctorch.schedulers import job_port

from .. import smallenv
from ..conftest import require
from .conftest import PYTHON, TOY, toy_ranks
from .harness import Cluster

pytestmark = pytest.mark.cluster

SQUATTER = "hpct-squatter"
MARKER = "import os; open(os.path.join({folder!r}, 'imported-by-uid-%d' % os.getuid()), 'a').close()\n"


@pytest.fixture(scope="module")
def squatter() -> Iterator[tuple[int, Path]]:
    """A second user (made here, removed after) and a folder of its own everyone may read."""
    require(os.geteuid() == 0 and shutil.which("useradd") is not None and shutil.which("setpriv") is not None,
            "needs root, useradd and setpriv to act as a second user")
    why = smallenv.missing()
    require(why is None, f"the squatter's environment needs {why}")
    made = False
    try:
        uid = pwd.getpwnam(SQUATTER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", SQUATTER], check=True, timeout=30)
        uid, made = pwd.getpwnam(SQUATTER).pw_uid, True
    home = Path(tempfile.mkdtemp(prefix="hpctorch-squatter-"))
    home.chmod(0o755)
    env_dir = home / "env"
    python = smallenv.make(env_dir)
    packages = next(env_dir.glob("lib/python3*/site-packages"))
    (packages / "zz-marker.pth").write_text(MARKER.format(folder=str(home / "markers")))
    (home / "markers").mkdir(mode=0o777)
    (home / "markers").chmod(0o1777)
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(env_dir)], check=True, timeout=60)
    try:
        yield uid, home
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if made:
            subprocess.run(["pkill", "-KILL", "-u", str(uid)], check=False, timeout=30)  # userdel refuses a user with processes
            subprocess.run(["userdel", SQUATTER], check=False, timeout=30)


@pytest.fixture(scope="module")
def step_variables(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The Slurm variables of node 0's task in a 2-node step (a job of the squatter's own shows them)."""
    where = tmp_path_factory.mktemp("step")
    where.chmod(0o755)
    shown = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(where), "srun", "-N2", "--ntasks-per-node=1",
                                  "sh", "-c", 'if [ "$SLURM_NODEID" = 0 ]; then env; fi'], timeout=120)
    assert shown.returncode == 0, shown.stderr
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if line.startswith("SLURM_") and "=" in line)


def _listening(cluster: Cluster, port: int) -> bool:
    shown = cluster.run("node1", ["ss", "-Hltn", f"sport = :{port}"], timeout=30)
    return str(port) in shown.stdout


@pytest.mark.parametrize(("stage", "restarts"), [(False, ()), (True, ()), (False, ("--max-restarts", "1"))],
                         ids=["plain", "stage-env", "c10d"])
def test_a_squatter_on_node_0s_port_is_passed_over_and_runs_nothing_of_the_jobs(
        cluster: Cluster, job_dir: Path, squatter: tuple[int, Path], step_variables: dict[str, str], stage: bool,
        restarts: tuple[str, ...]) -> None:
    """The job's derived port held on node 0 by another user running genuine hpctorch as node 0:
    the job trains on its own nodes, at the next of its ports; with --max-restarts, torch's c10d
    rendezvous and agent, the same."""
    uid, home = squatter
    stage_flags = ["--stage-env", "--stage-dir", str(job_dir)] if stage else []
    stage_flags += restarts
    # Staged: a small environment of the job's own (the real one's staging is tested on its own).
    python = smallenv.make(job_dir / "env") if stage else PYTHON
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nsrun {python} -m hpctorch run {' '.join(stage_flags)} --nproc-per-node 1 --rdzv-timeout 60 "
                      f"{TOY} --steps 3\n")
    out = job_dir / "out.txt"
    held = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "--hold", "-o", str(out),
                                 "-N2", "--ntasks-per-node=1", str(script)], timeout=30)
    assert held.returncode == 0, held.stderr
    job_id = held.stdout.strip().split(";")[0]
    port = job_port.derive_port(job_id, "0")
    # The squatter: the job's variables (its id is public: squeue), its own environment and script.
    squat_dir = home / f"job-{job_id}"
    variables = {**step_variables, "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
                 "SLURM_SUBMIT_DIR": str(squat_dir)}
    squat_dir.mkdir()
    os.chown(squat_dir, uid, uid)
    (squat_dir / "own.py").write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                                      "print(f'squatter saw world={dist.get_world_size()}', flush=True)\n")
    env = ["env", "-i", f"HOME={squat_dir}", "PATH=/usr/bin:/bin", "OMP_NUM_THREADS=1", *[f"{k}={v}" for k, v in variables.items()]]
    # torch's static rendezvous: its hpctorch serves the store itself, from first to last (hpctorch's
    # own starter would hand the port to its rank 0, a few seconds in which the job could take it).
    squat_log = (home / f"squatter-{job_id}.log").open("w")
    squatting = subprocess.Popen(cluster.on("node1", ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *env,
                                                       str(home / "env" / "bin" / "python"), "-m", "hpctorch", "run",
                                                       *(["--stage-env", "--stage-dir", str(squat_dir)] if stage else []),
                                                       "--nproc-per-node", "1", "--rdzv-backend", "static", "--rdzv-timeout", "120",
                                                       str(squat_dir / "own.py")]),
                                 stdout=squat_log, stderr=subprocess.STDOUT, cwd=squat_dir)
    try:
        deadline = time.monotonic() + 180
        while not _listening(cluster, port):
            assert squatting.poll() is None, (home / f"squatter-{job_id}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the squatter never bound the job's port"
            time.sleep(0.5)
        released = subprocess.run(["scontrol", "release", job_id], env=cluster.env(), capture_output=True, text=True, timeout=30)
        assert released.returncode == 0, released.stderr
        state = cluster.wait_job(job_id, timeout=300)
        output = out.read_text() if out.exists() else ""
    finally:
        squatting.kill()
        squatting.wait(timeout=60)
        subprocess.run(["pkill", "-KILL", "-u", str(uid)], check=False, timeout=30)  # its hpctorch and workers too
        squat_log.close()
    squatted = (home / f"squatter-{job_id}.log").read_text()
    assert state == "COMPLETED", output[-3000:]
    ranks = toy_ranks(output)
    assert sorted((int(r["rank"]), r["world"]) for r in ranks) == [(0, "2"), (1, "2")], output[-3000:]  # on its own nodes
    assert "Traceback" not in output
    # node 0 (node1): its port is held, by whom /proc says, and it serves on the next
    moved = [line for line in output.splitlines() if line.startswith(f"hpctorch: master port {port} ")]
    assert len(moved) == 1 and f"(held by another user: uid {uid} ({SQUATTER})): serving on " in moved[0], output[-3000:]
    # node 1 (node2): the store at the derived port is another user's (MUNGE's word): passed over
    passed = [line for line in output.splitlines() if f"master port {port} is not this job's" in line]
    assert len(passed) == 1 and "is served by another user" in passed[0], output[-3000:]
    markers = sorted(p.name for p in (home / "markers").iterdir())
    assert f"imported-by-uid-{os.getuid()}" not in markers, markers  # nothing of the job ran the squatter's environment
    assert "squatter saw world=" not in squatted, squatted[-3000:]  # its job never formed with the job's node

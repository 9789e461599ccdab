"""Hung jobs on the real 2-node cluster: every process alive, rank 3 (node2) in its own
function, ranks 0-2 waiting in all_reduce. ``hpctorch stacks`` started the way the job was
(srun --jobid --overlap), per node and per task; ``--stall-timeout`` firing by itself; a rank
that dies while the others are stuck, with the survivors' stacks in the teardown summary."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import ROOT
from .harness import Cluster
from .test_faults_cluster import Job
from .test_slurm_cluster import HPCTORCH

pytestmark = pytest.mark.cluster
HANG = str(ROOT / "tests" / "fixtures" / "hang.py")
GUARD_S = 180  # hang guards, far above the ~15 s these take


def _submit(cluster: Cluster, job_dir: Path, body: str, *options: str) -> tuple[str, Path]:
    script, out = job_dir / "job.sh", job_dir / "out.txt"
    script.write_text("#!/bin/sh\n" + body + "\n")
    submitted = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "-o", str(out),
                                      *options, str(script)], timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0], out


def _wait_for(out: Path, pattern: str, count: int) -> str:
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        text = out.read_text() if out.exists() else ""
        if len(re.findall(pattern, text)) >= count:
            return text
        time.sleep(0.5)
    raise AssertionError(f"hung: {count} x {pattern!r} never came:\n{text[-3000:]}")


@pytest.mark.parametrize("per_node", [1, 2])
def test_stacks_on_every_node_names_both_places(cluster: Cluster, job_dir: Path, per_node: int) -> None:
    nproc = "--nproc-per-node 2" if per_node == 1 else ""  # per node: hpctorch's agent; per task: srun's tasks
    job_id, out = _submit(cluster, job_dir, f"srun {' '.join(HPCTORCH)} run {nproc} {HANG}", "-N2", f"--ntasks-per-node={per_node}")
    try:
        _wait_for(out, r"rank \d of 4 ready", 4)
        deadline = time.monotonic() + GUARD_S
        while True:  # until every rank is in its hang (a moment after "ready"): asked again, not waited for
            stacks = cluster.run("node1", ["srun", "--jobid", job_id, "--overlap", "-N2", "--ntasks-per-node=1", *HPCTORCH, "stacks"],
                                 timeout=GUARD_S)
            if stacks.returncode != 0 or "2 different" in stacks.stdout.split("\n")[0] or time.monotonic() > deadline:
                break
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env(), timeout=30, check=False)
        cluster.wait_job(job_id, timeout=120)
    assert stacks.returncode == 0, stacks.stderr
    lines = stacks.stdout.splitlines()
    assert lines[0].startswith("hpctorch: stacks: 4 rank(s) on 2 node(s), by py-spy; 2 different:"), stacks.stdout
    assert re.fullmatch(r"  rank 3 \(node2\): stuck_here hang\.py:\d+", lines[1]), stacks.stdout
    assert re.fullmatch(r"  ranks 0-2 \(node\[1-2\]\): all_reduce ← train_step hang\.py:\d+", lines[2]), stacks.stdout
    assert "(on each node)" in lines[3] and len(lines) == 4, stacks.stdout  # printed once, by node 0


def test_a_stall_is_reported_then_a_dead_rank_shows_the_survivors(cluster: Cluster, job_dir: Path) -> None:
    # Hostfile mode on both nodes; rank 1 (node1) exits 3 after 20 s, long after the 4 s stall dump.
    job = Job(cluster, job_dir, "--stall-timeout", "4", script=(HANG,), HANG_EXIT_RANK="1", HANG_EXIT_AFTER="20")
    try:
        job.wait_all(timeout=GUARD_S)
    finally:
        job.kill()
    assert all(node.returncode != 0 for node in job.nodes)
    errors = "".join(job.stderr)
    stall = errors.index("no rank wrote any output for 4 s (--stall-timeout); the job goes on")
    teardown = errors.index("where the other ranks were when the job was stopped")
    assert stall < teardown, errors[-3000:]
    assert re.search(r"  rank 3 \(node2\): stuck_here hang\.py:\d+", errors[stall:teardown]), errors[-3000:]
    assert re.search(r"  ranks 0,2 \(node\[1-2\]\): all_reduce ← train_step hang\.py:\d+", errors[stall:teardown]), errors[-3000:]
    assert re.search(r"  rank 1 \(node1\): main hang\.py:\d+", errors[stall:teardown]), errors[-3000:]  # sleeping before its exit
    assert re.search(r"  rank 3 \(node2\): stuck_here hang\.py:\d+", errors[teardown:]), errors[-3000:]
    assert "rank 1 on node 0 (node1) (local rank 1) exited with code 3" in errors

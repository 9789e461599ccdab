"""Hot spares (--spare-nodes 1 --max-restarts 1) on 3 real Slurm nodes: node3's link is shaped, so
the screen makes it the spare, waiting in torch's c10d rendezvous; a rank on node2 dies of SIGKILL
mid-job (or node2 is lost whole), node2 leaves, node3 moves in, and the job finishes on node1 and
node3 with world size 4."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import ROOT
from .conftest import ONE_THREAD, PYTHON
from .harness import Cluster
from .test_screen_cluster import shaped

pytestmark = [pytest.mark.cluster, pytest.mark.serial]  # judges CPU and link measures against the other nodes: alone (scripts/run-tests)
HPCTORCH = f"{PYTHON} -m hpctorch"
REPORT = str(ROOT / "tests" / "fixtures" / "report.py")


def hot(cluster: Cluster, job_dir: Path, *worker_args: str) -> tuple[str, str, dict, list[dict]]:
    """A 3-node job with one hot spare (node3, its link shaped): (state, output, summary, reports)."""
    summary = job_dir / "summary.json"
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nexport HPCTORCH_BAD_NODES={job_dir / 'bad-nodes.jsonl'}\n{ONE_THREAD}"
                      f"srun {HPCTORCH} run --spare-nodes 1 --max-restarts 1 --nproc-per-node 2 --summary-json {summary} "
                      f"{REPORT} --init --brief {' '.join(worker_args)}\n")
    with shaped(cluster, 3):
        state, output = cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=1", timeout=300)
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in output.splitlines() if "REPORT " in line]
    return state, output, (json.loads(summary.read_text()) if summary.exists() else {}), reports


def test_a_hot_spare_takes_the_place_of_the_node_whose_rank_died(cluster: Cluster, job_dir: Path) -> None:
    state, output, summary, reports = hot(cluster, job_dir, "--die-first", "node2")
    assert state == "COMPLETED", output[-4000:]
    assert "hpctorch: node3 waits as a hot spare (fabric " in output, output[-4000:]
    assert "hot spare: node3 (takes the place of a node whose rank fails first)" in output, output[-4000:]
    assert output.count("hpctorch: node2 leaves the job: its local rank 0 died of SIGKILL; a hot spare takes its place") == 1, output[-4000:]
    assert output.count("hpctorch: node3 moves in from the spares") == 1, output[-4000:]
    # Only the second round reported: node1 (restarted in place) and node3, world size 4, every rank once.
    assert sorted((r["rank"], r["world_size"]) for r in reports) == [(0, 4), (1, 4), (2, 4), (3, 4)], output[-4000:]
    assert {r["host"] for r in reports} == {"node1", "node3"} and {r["rank_sum"] for r in reports} == {6.0}, output[-4000:]
    assert "replaced by a hot spare: node2" in output and summary.get("replaced") == ["node2"], (summary, output[-4000:])
    assert "went silent" not in output and "rendezvous at" not in output, output[-4000:]


def test_a_hot_spare_never_needed_leaves_when_the_job_ends(cluster: Cluster, job_dir: Path) -> None:
    state, output, summary, reports = hot(cluster, job_dir)
    assert state == "COMPLETED", output[-4000:]
    assert "hpctorch: node3 waits as a hot spare (fabric " in output, output[-4000:]
    assert "hpctorch: node3: hot spare not needed (" in output, output[-4000:]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3] and {r["host"] for r in reports} == {"node1", "node2"}, output[-4000:]
    assert "moves in" not in output and "leaves the job" not in output and not summary.get("replaced"), output[-4000:]


def _kill_node(cluster: Cluster, node: str) -> int:
    """A node lost whole: every hpctorch process on it (the agent, its workers, the zygote they are
    forked from, any warm standby waiting for a restart) killed at once; how many of them were the
    agent and its workers (by name: the zygote's and a waiting standby's are hpctorch's own)."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.netns(node)], capture_output=True, text=True, timeout=10).stdout.split()
    killed = 0
    for pid in map(int, pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle, open(f"/proc/{pid}/comm", "rb") as comm:
                command, name = handle.read().replace(b"\0", b" "), comm.read().strip()
        except OSError:
            continue
        if b"-m hpctorch " in command or b"_worker.py" in command:  # not slurmd, whose configuration path names hpctorch
            os.kill(pid, signal.SIGKILL)
            killed += name not in (b"hpctorch-zygote", b"hpctorch-warm")
    return killed


def test_a_hot_spare_takes_the_seat_of_a_node_lost_whole(cluster: Cluster, job_dir: Path) -> None:
    """node2's hpctorch and workers all die at once (as in a crash): nobody claims for it; node1's
    ranks, broken, see node2 stop beating and restart in place; node 0's watchdog, instead of
    ending the job, leaves node2 to torch's rendezvous, which drops it and lets node3 in."""
    summary, out = job_dir / "summary.json", job_dir / "out.txt"
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nexport HPCTORCH_BAD_NODES={job_dir / 'bad-nodes.jsonl'}\n{ONE_THREAD}"
                      f"srun {HPCTORCH} run --spare-nodes 1 --max-restarts 1 --nproc-per-node 2 --summary-json {summary} "
                      f"{REPORT} --init --brief --collectives 20\n")
    with shaped(cluster, 3):
        submit = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "sbatch", "--parsable", "-o", str(out),
                                       "-p", "wide", "-N3", "--ntasks-per-node=1", str(script)], timeout=30)
        assert submit.returncode == 0, submit.stderr
        job_id = submit.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 180
        while "host=node2" not in (out.read_text() if out.exists() else ""):  # node2's ranks in their loop of collectives
            assert time.monotonic() < deadline, (out.read_text() if out.exists() else "no output")[-3000:]
            time.sleep(0.2)
        assert _kill_node(cluster, "node2") == 3  # the agent and its two workers
        cluster.wait_job(job_id, timeout=300)
    output = out.read_text()
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in output.splitlines() if "REPORT " in line]
    assert "hpctorch: node 1 (node2) went silent: no heartbeat for 10 s; a hot spare takes its place" in output, output[-4000:]
    assert output.count("hpctorch: node3 moves in from the spares") == 1, output[-4000:]
    assert sorted((r["rank"], r["world_size"]) for r in reports) == [(0, 4), (1, 4), (2, 4), (3, 4)], output[-4000:]
    assert {r["host"] for r in reports} == {"node1", "node3"}, output[-4000:]
    assert "leaves the job" not in output, output[-4000:]  # node1, broken by node2's loss, did not take the blame
    assert "replaced by a hot spare: node2" in output and json.loads(summary.read_text()).get("replaced") == ["node2"], output[-4000:]

"""One dead rank must not leave the others waiting: whole-job teardown across nodes."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from ..conftest import ROOT
from .conftest import PYTHON
from .harness import Cluster

pytestmark = pytest.mark.cluster
COMPUTE = str(ROOT / "tests" / "fixtures" / "compute.py")


class Job:
    """hpctorch in hostfile mode on every node, its output read as it comes."""

    def __init__(self, cluster: Cluster, job_dir: Path, *extra: str, script: tuple[str, ...] = (COMPUTE, "--seconds", "60"),
                 **env: str) -> None:
        hosts = job_dir / "hosts"
        hosts.write_text("".join(f"{n} slots=2\n" for n in cluster.names))
        argv = [PYTHON, "-m", "hpctorch", "run", "--hostfile", str(hosts), "--rendezvous-dir", str(job_dir), *extra, *script]
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self.nodes = [subprocess.Popen(cluster.on(n, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env(**env))
                      for n in cluster.names]
        self.pumps = [threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
                      for process in self.nodes for stream, sink in ((process.stdout, self.lines.put), (process.stderr, self.stderr.append))]
        for pump in self.pumps:
            pump.start()

    @staticmethod
    def _pump(stream, sink) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            sink(line)

    def ready_workers(self, count: int, timeout: float = 120) -> dict[int, tuple[int, str]]:
        workers: dict[int, tuple[int, str]] = {}
        deadline = time.monotonic() + timeout
        while len(workers) < count:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            match = re.search(r"READY rank=(\d+) pid=(\d+) host=(\S+)", line)
            if match:
                workers[int(match.group(1))] = (int(match.group(2)), match.group(3))
        return workers

    def wait_all(self, timeout: float) -> float:
        """Seconds until every node's hpctorch exited; its output is then read to the end (its last
        lines come at its exit, and a loaded machine's reading threads may be behind)."""
        started = time.monotonic()
        for process in self.nodes:
            process.wait(timeout=max(0.1, timeout - (time.monotonic() - started)))
        ended = time.monotonic() - started
        for pump in self.pumps:
            pump.join(timeout=max(0.1, timeout - (time.monotonic() - started)))
        assert not any(pump.is_alive() for pump in self.pumps), "a node's output never ended (a process of the job holds it open)"
        return ended

    def kill(self) -> None:
        for process in self.nodes:
            if process.poll() is None:
                process.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("victim, node, host", [(3, 1, "node2"), (1, 0, "node1")])
def test_a_killed_worker_ends_the_whole_job(cluster: Cluster, job_dir: Path, victim: int, node: int, host: str) -> None:
    # On node 0 too: its agent serves the store, and must serve until node 2 read why.
    job = Job(cluster, job_dir)
    try:
        workers = job.ready_workers(4)
        victim_pid, where = workers[victim]
        assert where == host
        os.kill(victim_pid, signal.SIGKILL)
        # Without teardown the others sit in time.sleep(60) and then hang in the barrier.
        elapsed = job.wait_all(timeout=45)  # a hang guard, not a speed figure (benchmarks/teardown.py)
    finally:
        job.kill()
    assert all(p.returncode != 0 for p in job.nodes)
    assert not any(_alive(pid) for pid, _ in workers.values())
    errors = "".join(job.stderr)
    cause = f"rank {victim} on node {node} ({host}) (local rank 1) was killed by signal 9"
    assert cause in errors, errors[-2000:]
    # The other node names the cause too, not "the master's store is gone".
    assert f"hpctorch: stopped: rank {victim} on node {node} ({host})" in errors, errors[-2000:]
    assert "store at" not in errors
    print(f"teardown after kill -9 of rank {victim}: {elapsed:.1f} s")


@pytest.mark.disturbs_cluster  # node2 cut off and stopped: no other job may run there meanwhile
def test_a_vanished_node_is_noticed_and_named(cluster: Cluster, job_dir: Path) -> None:
    job = Job(cluster, job_dir)
    frozen: list[int] = []
    try:
        workers = job.ready_workers(4)
        time.sleep(5)  # the watchdog's helpers start after the workers' imports: most likely beating by now
        node2_agent = job.nodes[1].pid
        # Everything on the node stops: hpctorch, its watchdog helper, the workers.
        frozen = [node2_agent] + [p.pid for p in psutil.Process(node2_agent).children(recursive=True)]
        subprocess.run(["ip", "-n", cluster.netns("node2"), "link", "set", "hsn0", "down"], check=True)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        # A hang guard: the silence limit is 10 s, and a node never heard from is named 60 s after all started.
        job.nodes[0].wait(timeout=100)
        elapsed = time.monotonic() - started
    finally:
        subprocess.run(["ip", "-n", cluster.netns("node2"), "link", "set", "hsn0", "up"], check=False)
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        job.kill()
    assert job.nodes[0].returncode != 0
    errors = "".join(job.stderr)
    assert "node 1 (node2) went silent" in errors or "node 1 (node2) never reached the watchdog's store" in errors, errors[-2000:]
    assert not any(_alive(pid) for pid, host in workers.values() if host == "node1")
    print(f"silent node noticed, job ended after {elapsed:.1f} s")

"""Hostfile mode: one hpctorch per node namespace, started by the test, no scheduler."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from .conftest import PYTHON, TOY, assert_trained_across_nodes
from .harness import Cluster, fabric_addr

pytestmark = pytest.mark.cluster


def run_everywhere(cluster: Cluster, argv: list[str]) -> list[subprocess.CompletedProcess]:
    started = [
        subprocess.Popen(cluster.on(node, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
        for node in cluster.names
    ]
    deadline = time.monotonic() + 180  # a hang guard for the whole job
    results: list[subprocess.CompletedProcess] = []
    for process in started:
        try:
            out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in started:
                other.kill()
            # Every node's output, not only the one that hung: the cause is often on another.
            errors = [r.stderr for r in results] + [p.communicate()[1] for p in started[len(results):]]
            pytest.fail("a node still ran after 180 s\n" + "\n".join(
                f"--- {node}: exit {p.returncode}\n{(err or '')[-3000:]}" for node, p, err in zip(cluster.names, started, errors)))
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return results


@pytest.mark.parametrize("by", ["name", "address"])
def test_hostfile_on_every_node(cluster: Cluster, job_dir: Path, by: str) -> None:
    hostfile = job_dir / "hosts"
    entries = cluster.names if by == "name" else [fabric_addr(i) for i in range(1, cluster.count + 1)]
    hostfile.write_text("".join(f"{entry} slots=2\n" for entry in entries))
    # Names resolve to the unreachable management net: node1 hands its fabric
    # address to the others through the shared directory. Addresses need no exchange.
    results = run_everywhere(cluster, [PYTHON, "-m", "hpctorch", "run", "--hostfile", str(hostfile), "--rendezvous-dir", str(job_dir), TOY, "--steps", "6"])
    assert [r.returncode for r in results] == [0] * len(results), "\n".join(r.stderr[-3000:] for r in results)
    assert_trained_across_nodes("".join(r.stdout for r in results))
    assert bool(list(job_dir.glob(".hpctorch/*.master.json"))) == (by == "name")


def test_a_node_forced_onto_another_port_fails_fast_with_the_difference(cluster: Cluster, job_dir: Path) -> None:
    hostfile = job_dir / "hosts"
    hostfile.write_text("".join(f"{fabric_addr(i)} slots=1\n" for i in range(1, cluster.count + 1)))
    argv = [PYTHON, "-m", "hpctorch", "run", "--hostfile", str(hostfile), "--rendezvous-dir", str(job_dir), "--master-port"]
    processes = [
        subprocess.Popen(cluster.on(node, [*argv, str(29400 + (index == cluster.count - 1)), TOY]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
        for index, node in enumerate(cluster.names)
    ]
    # A hang guard far below the rendezvous timeout (300 s): only the agreement ends it in time.
    errors = [p.communicate(timeout=60)[1] for p in processes]
    assert [p.returncode for p in processes] == [2] * cluster.count, errors
    for err in errors:
        line = err.strip().splitlines()[-1]
        assert "the nodes planned different jobs: master address:port:" in line, err
        assert f"{fabric_addr(1)}:29400" in line and f"{fabric_addr(1)}:29401" in line, line

"""hpctorch doctor on the 2-node cluster: healthy, then one planted fault at a time.

Each fault must end in under 60 s with its own verdict line, never a hang.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from .conftest import PYTHON
from .harness import Cluster, fabric_addr

pytestmark = [pytest.mark.cluster, pytest.mark.serial]  # judges CPU and link measures against the other nodes: alone (scripts/run-tests)
DOCTOR = (PYTHON, "-m", "hpctorch", "doctor")
LIMIT_S = 60  # the doctor's own budget is 30 s; past this, a hang guard stops the test
SHORT = ("--timeout", "15")
"""A planted fault's budget: the doctor waits 0.4 of it for a peer's hello that cannot come (12 s
at the default 30 s); the verdict is the same at any budget, only sooner."""


def _srun_doctor(cluster: Cluster, job_dir: Path, *args: str) -> subprocess.CompletedProcess:
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", "--ntasks-per-node=1",
                                 *DOCTOR, *args], timeout=LIMIT_S + 30)
    return done


def _doctor_on_each_node(cluster: Cluster, job_dir: Path, per_node: Sequence[Sequence[str]] = ()) -> list[subprocess.CompletedProcess]:
    """Hostfile mode (by fabric address), one doctor per node namespace, as ssh would start them."""
    hosts = job_dir / "hosts"
    hosts.write_text("".join(f"{fabric_addr(i)} slots=2\n" for i in range(1, cluster.count + 1)))
    processes = [
        subprocess.Popen(cluster.on(node, [*DOCTOR, "--hostfile", str(hosts), "--rendezvous-dir", str(job_dir),
                                           *(per_node[index] if index < len(per_node) else ())]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
        for index, node in enumerate(cluster.names)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=LIMIT_S + 30)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return results


def _verdicts(output: str) -> list[str]:
    return [line.strip() for line in output.split("verdicts:", 1)[-1].splitlines() if line.strip().startswith(("FAIL", "WARN"))]


def test_healthy_cluster_passes_with_the_screen_s_figures(cluster: Cluster, job_dir: Path) -> None:
    done = _srun_doctor(cluster, job_dir, "--json", str(job_dir / "report.json"))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "gloo: init" in done.stdout and "all_reduce sum correct on 2 processes" in done.stdout
    assert "screen: 2 node(s) in " in done.stdout and "fabric to node 1 " in done.stdout, done.stdout
    assert "ok: every check passed" in done.stdout
    # The harness's names resolve to the management network: a warning, since hpctorch avoids it.
    assert any("resolves to 198.19.0.1 on mgmt0, not on hsn0" in v for v in _verdicts(done.stdout)), done.stdout
    report = json.loads((job_dir / "report.json").read_text())
    assert report["exit"] == 0 and sorted(report["reports"]) == ["0", "1"]
    assert report["reports"]["1"]["reach"]["master"]["ok"] is True


def test_master_named_by_a_name_on_the_management_net_is_reached_on_the_fabric(cluster: Cluster, job_dir: Path) -> None:
    # node1 names node 0, but resolves to the management network: its fabric address is used.
    done = _srun_doctor(cluster, job_dir, "--master-addr", "node1")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "ok: every check passed" in done.stdout


def test_master_address_on_the_management_net(cluster: Cluster, job_dir: Path) -> None:
    # An address is used as given: here one node 2 cannot reach, and the doctor says what works.
    done = _srun_doctor(cluster, job_dir, "--master-addr", "198.19.0.1", *SHORT)
    assert done.returncode != 0
    fails = [v for v in _verdicts(done.stdout) if v.startswith("FAIL")]
    assert any("node 1 (node2) cannot reach the master at" in v and "198.19.0.1" in v and "--iface hsn0" in v
               and "198.18.0.1" in v for v in fails), done.stdout + done.stderr[-2000:]


def test_master_port_already_bound(cluster: Cluster, job_dir: Path) -> None:
    port = 29555
    holder = subprocess.Popen(cluster.on("node1", [PYTHON, "-c", f"import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('', {port})); s.listen(); print('held', flush=True); time.sleep(120)"]),
                              stdout=subprocess.PIPE, text=True, env=cluster.env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = _srun_doctor(cluster, job_dir, "--master-port", str(port))
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0
    assert any(v.startswith(f"FAIL node 0 (node1): master port {port} is already in use, held by pid {holder.pid} (python")
               for v in _verdicts(done.stdout)), done.stdout + done.stderr[-2000:]


@contextmanager
def _in_namespace(cluster: Cluster, node: str, up: Sequence[str], down: Sequence[str]) -> Iterator[None]:
    subprocess.run(["ip", "netns", "exec", cluster.netns(node), *up], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", cluster.netns(node), *down], check=False)


def test_a_peers_fabric_link_down(cluster: Cluster, job_dir: Path) -> None:
    with _in_namespace(cluster, "node2", ["ip", "link", "set", "hsn0", "down"], ["ip", "link", "set", "hsn0", "up"]):
        results = _doctor_on_each_node(cluster, job_dir, [SHORT] * 2)
    assert [r.returncode for r in results] == [1, 1], [r.stderr[-2000:] for r in results]
    assert "FAIL node 1 (node2): hsn0, the interface node 0 talks on, is down" in results[0].stdout, results[0].stdout


def test_a_firewall_dropping_the_master_port(cluster: Cluster, job_dir: Path) -> None:
    port = "29556"
    rule = ["INPUT", "-i", "hsn0", "-p", "tcp", "--dport", port, "-j", "DROP"]  # the fabric side only
    with _in_namespace(cluster, "node1", ["iptables", "-A", *rule], ["iptables", "-D", *rule]):
        results = _doctor_on_each_node(cluster, job_dir, [["--master-port", port, *SHORT]] * 2)
    assert [r.returncode for r in results] == [1, 1], [r.stderr[-2000:] for r in results]
    assert any(f"cannot reach the master at {fabric_addr(1)}:{port}" in v and "a firewall drops the master port" in v
               for v in _verdicts(results[0].stdout)), results[0].stdout


def test_nodes_disagreeing_on_the_world_size(cluster: Cluster, job_dir: Path) -> None:
    results = _doctor_on_each_node(cluster, job_dir, [["--nproc-per-node", "2"], ["--nproc-per-node", "4"]])
    assert [r.returncode for r in results] == [1, 1], [r.stderr[-2000:] for r in results]
    assert any(v.startswith("FAIL the nodes planned different jobs") and "world size: node 0 (node1) 4, node 1 (node2) 8" in v
               for v in _verdicts(results[0].stdout)), results[0].stdout


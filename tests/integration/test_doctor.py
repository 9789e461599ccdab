"""hpctorch doctor on simulated nodes: a healthy run, a busy master port, a node that cannot plan."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ..conftest import clean_env, hpctorch

pytestmark = pytest.mark.serial  # the doctor's budgets are seconds: never beside another test (scripts/run-tests)


def test_simulated_nodes_pass_with_a_gloo_all_reduce(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = hpctorch("doctor", "--simulate-nodes", "2", "--json", str(report), env=clean_env(), timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all_reduce sum correct on 2 processes" in done.stdout
    assert "ok: every check passed" in done.stdout
    data = json.loads(report.read_text())
    assert data["exit"] == 0 and sorted(data["reports"]) == ["0", "1"]
    assert data["reports"]["1"]["gloo"]["ok"]
    # The screen measured both simulated nodes and their ring links; on one machine their speeds
    # are not compared (they share its CPUs), so nobody is named.
    screen = data["reports"]["0"]["screen"]
    assert sorted(screen["figures"]) == ["0", "1"] and screen["findings"] == []
    assert all(r["fabric"]["mbs"] > 0 and r["figures"]["compute_gflops"] > 0 for r in screen["figures"].values())
    assert "screen: 2 node(s) in " in done.stdout and "; medians: compute " in done.stdout


def test_a_busy_master_port_is_named_with_its_holder() -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        done = hpctorch("doctor", "--simulate-nodes", "2", "--master-port", str(port), env=clean_env(), timeout=90)  # hang guard
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL node 0 (" in done.stdout and f"master port {port} is already in use" in done.stdout, done.stdout
    assert "ok: every check passed" not in done.stdout


def test_a_store_that_is_not_this_jobs_node_0_is_named_not_trusted() -> None:
    """Another user's store holds node 0's port: node 0 cannot serve, and node 1, which reaches
    that store, does not take its records as the job's (guard/authority): it says so."""
    import datetime

    from torch.distributed import TCPStore

    squatter = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    done = hpctorch("doctor", "--simulate-nodes", "2", "--master-port", str(squatter.port), "--timeout", "40",
                    env=clean_env(), timeout=120)  # hang guard
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL node 1 (" in done.stdout and "node 0's port answers, and does not authenticate: " in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_node_that_cannot_plan_says_why() -> None:
    done = hpctorch("doctor", "--nnodes", "2", "--node-rank", "1", "--master-port", "1234", "--iface", "nosuch0", env=clean_env(), timeout=60)
    assert done.returncode == 1
    assert "cannot plan the job" in done.stderr and "nosuch0" in done.stderr
    assert "Traceback" not in done.stderr


def test_json_to_stdout_is_json_alone() -> None:
    """--json - is for a program: stdout holds the report and nothing else, the table goes to stderr."""
    done = hpctorch("doctor", "--json", "-", "--timeout", "40", env=clean_env(), timeout=90)  # hang guard
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["nnodes"] == 1 and report["exit"] == 0
    assert "hpctorch doctor: 1 node(s)" in done.stderr

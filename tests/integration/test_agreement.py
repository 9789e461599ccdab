"""Nodes that planned different jobs fail at once with the differing values (not at the rendezvous timeout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctorch.host.network import free_port

from ..conftest import ROOT, clean_env

SCRIPT = str(ROOT / "tests" / "fixtures" / "report.py")


def _two_nodes(node_args: list[list[str]]) -> list[subprocess.CompletedProcess]:
    # --init: where hpctorch starts the workers itself the check runs as they call
    # init_process_group (before any collective), not before they start.
    # A rendezvous timeout far above the hang guard: a node that only failed at the
    # rendezvous would hang the test, not pass it; the message says the agreement caught it.
    common = ["--nnodes", str(len(node_args)), "--master-addr", "127.0.0.1", "--rdzv-timeout", "600"]
    processes = [
        subprocess.Popen([sys.executable, "-m", "hpctorch", "run", *common, "--node-rank", str(rank), *args, SCRIPT, "--init"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        for rank, args in enumerate(node_args)
    ]
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=120)  # hang guard (the agreement takes seconds)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    finally:
        for process in processes:
            process.kill()
    return results


def _assert_both_name(results: list[subprocess.CompletedProcess], *words: str) -> None:
    for result in results:
        assert result.returncode == 2, result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("hpctorch: error: the nodes planned different jobs"), result.stderr
        for word in words:
            assert word in line, line
        assert "Traceback" not in result.stderr


def test_a_node_with_another_port_fails_fast_through_the_shared_directory(tmp_path: Path) -> None:
    port = free_port()
    shared = ["--rendezvous-dir", str(tmp_path), "--nproc-per-node", "1"]
    results = _two_nodes([["--master-port", str(port), *shared], ["--master-port", str(port + 1), *shared]])
    _assert_both_name(results, f"127.0.0.1:{port},", f"127.0.0.1:{port + 1}")


def test_a_node_with_another_world_size_fails_fast_through_the_store() -> None:
    port = str(free_port())
    results = _two_nodes([["--master-port", port, "--nproc-per-node", "1"], ["--master-port", port, "--nproc-per-node", "2"]])
    _assert_both_name(results, "world size: node 0 (", ") 2, node 1 (", ") 4")


def test_a_node_that_agrees_with_node_0_learns_of_a_third_that_does_not(tmp_path: Path) -> None:
    """Node 2 cannot reach node 0's store (another port): node 0 alone reads its file, and its
    own file carries the verdict to node 1, which reads node 0's file only."""
    port = free_port()
    shared = ["--rendezvous-dir", str(tmp_path), "--nproc-per-node", "1"]
    results = _two_nodes([["--master-port", str(port), *shared]] * 2 + [["--master-port", str(port + 1), *shared]])
    _assert_both_name(results, f"127.0.0.1:{port},", f"127.0.0.1:{port + 1}")


@pytest.mark.parametrize("rdzv_dir", [True, False])
def test_agreeing_nodes_run(tmp_path: Path, rdzv_dir: bool) -> None:
    import os
    import time

    port = str(free_port())
    extra = ["--rendezvous-dir", str(tmp_path)] if rdzv_dir else []
    leftovers = tmp_path / ".hpctorch"
    leftovers.mkdir(mode=0o700)
    old, fresh = leftovers / "slurm-7.0.agreement", leftovers / "slurm-9.0.agreement"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "node1.json").write_text("{}")
    (leftovers / "slurm-7.0.master.json").write_text("{}")
    for path in (old, leftovers / "slurm-7.0.master.json"):
        os.utime(path, (time.time() - 2 * 86400,) * 2)
    results = _two_nodes([["--master-port", port, "--nproc-per-node", "1", *extra]] * 2)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr + results[1].stderr
    if rdzv_dir:
        # Each node beat a record file there, and removed it once the nodes agreed.
        assert (tmp_path / ".hpctorch").is_dir(), "no node wrote its record to the shared directory"
        assert not list((tmp_path / ".hpctorch").glob("local*/node*.json")), "records are removed once agreed"
        # Node 0 removed what runs of over a day ago left there, and nothing newer.
        assert not old.exists() and not (leftovers / "slurm-7.0.master.json").exists() and fresh.exists()

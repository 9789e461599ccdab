"""Preemption signals reach every worker's handler; SIGTERM stops everything."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from ..conftest import ROOT, clean_env

PREEMPTIBLE = str(ROOT / "tests" / "fixtures" / "preemptible.py")


def _start(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpctorch", "run", "--simulate-nodes", "2", "--nproc-per-node", "2", PREEMPTIBLE, "--markers", str(tmp_path)],
        env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_ready(process: subprocess.Popen, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    ready = 0
    while ready < count:
        assert time.monotonic() < deadline, "workers never became ready"
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line, process.stderr.read()  # type: ignore[union-attr]
        ready += "READY rank=" in line


def test_sigusr1_reaches_every_rank_on_every_simulated_node(tmp_path: Path) -> None:
    process = _start(tmp_path)
    try:
        _wait_ready(process, 4)
        process.send_signal(signal.SIGUSR1)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, process.stderr.read()  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank{r}.preempted" for r in range(4)]


def test_sigterm_stops_every_worker_with_128_plus_signal(tmp_path: Path) -> None:
    process = _start(tmp_path)
    try:
        _wait_ready(process, 4)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)  # hang guard: the workers would sleep far longer
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []  # nobody finished: all were stopped

"""Preemption signals reach every worker's handler, and only the worker; SIGTERM, SIGHUP and
SIGQUIT stop everything, in both start paths."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, clean_env

PREEMPTIBLE = str(ROOT / "tests" / "fixtures" / "preemptible.py")


SIMULATED = ("--simulate-nodes", "2", "--nproc-per-node", "2")  # torch's agent on each simulated node
OWN_STARTER = ("--nproc-per-node", "2")  # one node: hpctorch starts the workers itself


def _start(tmp_path: Path, how: tuple[str, ...] = SIMULATED, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpctorch", "run", *how, PREEMPTIBLE, "--markers", str(tmp_path), *extra],
        env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_ready(process: subprocess.Popen, count: int, timeout: float = 120) -> list[int]:
    """The workers' pids, once every one said READY."""
    deadline = time.monotonic() + timeout
    pids: list[int] = []
    while len(pids) < count:
        assert time.monotonic() < deadline, "workers never became ready"
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line, process.stderr.read()  # type: ignore[union-attr]
        if "READY rank=" in line:
            pids.append(int(line.split("pid=")[1].split()[0]))
    return pids


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


@pytest.mark.parametrize("how", [SIMULATED, OWN_STARTER], ids=["torch-agent", "hpctorch-starter"])
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=["SIGHUP", "SIGQUIT"])
def test_a_dropped_session_or_sigquit_stops_the_workers_too(tmp_path: Path, how: tuple[str, ...], sig: int) -> None:
    """Reproduced before: kill -HUP of hpctorch's own starter left the workers running with PPID 1."""
    import psutil

    process = _start(tmp_path, how)
    try:
        pids = _wait_ready(process, 4 if how == SIMULATED else 2)
        process.send_signal(sig)
        process.wait(timeout=30)  # hang guard
    finally:
        process.kill()
    assert process.returncode == 128 + sig, process.stderr.read()  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"workers outlived {signal.Signals(sig).name}: {pids}"
        time.sleep(0.1)


@pytest.mark.parametrize("how", [SIMULATED, OWN_STARTER], ids=["torch-agent", "hpctorch-starter"])
def test_a_preemption_notice_reaches_the_worker_and_spares_its_data_loaders(tmp_path: Path, how: tuple[str, ...]) -> None:
    process = _start(tmp_path, how, "--child")
    count = 4 if how == SIMULATED else 2
    try:
        _wait_ready(process, count)
        process.send_signal(signal.SIGUSR1)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, process.stderr.read()  # type: ignore[union-attr]
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {f"rank{r}.preempted": "child alive\n" for r in range(count)}


_FLAGGING = """
import sys, time
from hpctorch.start.initialize import Context, _watch_preemption
_watch_preemption()
ctx = Context(0, 0, 1, 1, 0, "gloo", None)
print("ready", flush=True)
sys.stdin.readline()  # the notices are over
print("preempted" if ctx.preempted() else "missed", flush=True)
"""


def test_notices_arriving_inside_the_handler_do_not_hang_the_worker() -> None:
    """Slurm signals every process of the step and the starter forwards the notice too: two arrive
    at once. A handler taking a lock (threading.Event.set) waited forever on itself, the rank never
    checkpointed and the others hung in their closing barrier (seen in CI; a burst reproduces it)."""
    process = subprocess.Popen([sys.executable, "-c", _FLAGGING], env=clean_env(), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "ready\n"  # type: ignore[union-attr]
        for _ in range(20000):
            process.send_signal(signal.SIGUSR1)
        out, _ = process.communicate("\n", timeout=30)  # hang guard: it answers at once
    finally:
        process.kill()
    assert out == "preempted\n"

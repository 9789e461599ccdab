"""A rank that reaches init_process_group before rank 0 serves the store waits for it
without torch's retry sleep (``storewait``): real torch processes, real gloo."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hpctorch.host.network import free_port
from hpctorch.start import storewait
from hpctorch.start.workers import WORKER_ENTRY

from ..conftest import clean_env

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    print("calling init", flush=True)
    INIT
    value = torch.ones(1)
    dist.all_reduce(value)
    print("sum", int(value.item()), flush=True)
    dist.destroy_process_group()
""")
# torch's client logs each refused connection at this level ("is not yet listening ... will retry").
TRACE = {"TORCH_CPP_LOG_LEVEL": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
REFUSED = "is not yet listening"


def _late_rank_0(tmp_path: Path, through_worker: bool, init: str = 'dist.init_process_group("gloo")') -> tuple[str, str]:
    """Rank 1 first, rank 0 a second after rank 1 called init_process_group: rank 1's output."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("INIT", init))
    port = str(free_port("127.0.0.1"))
    entry = [sys.executable, "-u", WORKER_ENTRY] if through_worker else [sys.executable, "-u"]

    def start(rank: int, into: Path | None = None) -> subprocess.Popen:
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **TRACE)
        if into is None:
            return subprocess.Popen([*entry, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # To a file: rank 0's trace is not read while rank 1's is, and a full pipe would stop it mid-collective.
        with open(into, "w") as sink:
            return subprocess.Popen([*entry, str(script)], env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)

    rank_1 = start(1)
    rank_0 = None
    try:
        assert rank_1.stdout is not None
        assert rank_1.stdout.readline().strip() == "calling init"
        time.sleep(1.0)  # rank 0 comes late: how late does not matter, rank 1 is already waiting
        rank_0 = start(0, tmp_path / "rank0.txt")
        out_1, err_1 = rank_1.communicate(timeout=120)
        rank_0.wait(timeout=120)
        out_0 = err_0 = (tmp_path / "rank0.txt").read_text()
    finally:
        for process in (rank_1, rank_0):
            if process is not None and process.poll() is None:
                process.kill()
    assert rank_1.returncode == 0 and rank_0.returncode == 0, err_1[-2000:] + err_0[-2000:]
    assert "sum 2" in out_1 and "sum 2" in out_0
    return out_1, err_1


def test_a_rank_ahead_of_rank_0_is_never_refused_by_its_store(tmp_path: Path) -> None:
    _, err = _late_rank_0(tmp_path, through_worker=True)
    assert REFUSED not in err


def test_hpctorch_init_waits_too(tmp_path: Path) -> None:
    """A script started by srun or mpirun itself, calling hpctorch.init(): no worker entry."""
    _, err = _late_rank_0(tmp_path, through_worker=False, init="import hpctorch; hpctorch.init()")
    assert REFUSED not in err


def test_without_the_wait_torch_is_refused_and_retries(tmp_path: Path) -> None:
    """The control: what the test above would see without hpctorch's worker entry."""
    _, err = _late_rank_0(tmp_path, through_worker=False)
    assert REFUSED in err


def test_needed_only_where_env_rendezvous_races_rank_0() -> None:
    base = {"RANK": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert storewait.needed(base)
    assert not storewait.needed({**base, "RANK": "0"})
    assert not storewait.needed({**base, "TORCHELASTIC_USE_AGENT_STORE": "True"})  # torch's agent: up already
    assert storewait.needed({**base, "TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert not storewait.needed({**base, "HPCTORCH_AGREED": "/tmp/x/agreed"})  # the agreement waited
    assert not storewait.needed({**base, "HPCTORCH_FILE_STORE": "/shared/store"})
    assert not storewait.needed({k: v for k, v in base.items() if k != "MASTER_PORT"})
    assert not storewait.needed({**base, "MASTER_PORT": "0"})  # no port to wait for


def test_wait_ends_when_a_listener_appears_and_says_why_when_none_does() -> None:
    port = free_port("127.0.0.1")
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.5)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=listen_later, daemon=True).start()
    try:
        assert storewait.wait("127.0.0.1", port, 2, timeout_s=60) == "listening"
    finally:
        server.close()
    assert storewait.wait("127.0.0.1", free_port("127.0.0.1"), 2, timeout_s=0.3) == "timed out"
    assert storewait.wait("no-such-host.invalid", 29500, 2, timeout_s=5) == "unresolved"


@pytest.mark.parametrize("world_size", [2, 512, 80_000, 1_000_000])
def test_refused_probes_at_rank_0_stay_bounded(world_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many ranks wait, rank 0's node is asked at most PROBES_PER_S times a second
    once the pauses reached their cap (or each rank every CAP_MAX_S)."""
    pauses: list[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(storewait.time, "sleep", sleep)
    monkeypatch.setattr(storewait.time, "monotonic", lambda: clock[0])
    assert storewait.wait("127.0.0.1", 1, world_size, timeout_s=120, connect=lambda target, timeout: False) == "timed out"
    cap = storewait.interval_cap(world_size)
    assert pauses[0] <= storewait.FIRST_S * 1.25
    assert max(pauses) <= cap * 1.25
    settled = pauses[len(pauses) // 2:]
    rate_at_rank_0 = world_size / (sum(settled) / len(settled))
    assert rate_at_rank_0 <= max(storewait.PROBES_PER_S, world_size / storewait.CAP_MAX_S) * 1.4


def test_a_rank_0_that_never_listens_is_named_once_the_timeout_passed(tmp_path: Path) -> None:
    """One line naming the store and what to check, after the timeout given to init_process_group
    (not that timeout again inside torch's client)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("INIT", 'import datetime; dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))'))
    port = str(free_port("127.0.0.1"))
    env = clean_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    done = subprocess.run([sys.executable, "-u", WORKER_ENTRY, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"DistNetworkError: rank 1: nothing listened at 127.0.0.1:{port}, where rank 0 serves the job's store, for 3 s" in done.stderr
    assert "check that rank 0 started" in done.stderr

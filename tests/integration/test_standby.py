"""Warm restarts (``start.standby``) under torch's real agent: after the first attempt trained,
each local rank has a standby that imported torch ahead; the restart's workers are those
processes (their command line is still the standby's, their start before the failure), with the
new attempt's ranks, world size and environment, hpctorch's hooks in place; a standby never
needed is gone with the job."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from ..conftest import WAIT_FOR_STANDBYS, clean_env, hpctorch, standbys_of

pytest.importorskip("torch")

SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
""" + WAIT_FOR_STANDBYS + """
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open("/proc/self/cmdline", "rb") as source:
    standby = b"--standby" in source.read().split(b"\\0")
with open("/proc/self/stat") as source:
    started = float(source.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
with open("/proc/uptime") as source:
    now = float(source.read().split()[0])
with open(f"/proc/{os.getppid()}/comm") as source:
    parent = source.read().strip()
print(f"attempt={attempt} rank={dist.get_rank()} world={dist.get_world_size()} sum={total.item():.0f} standby={standby} "
      f"started={started:.2f} now={now:.2f} job={os.environ.get('JOB_MARK')} parent={parent} ppid={os.getppid()} "
      f"threads={torch.get_num_threads()}", flush=True)
if attempt == "0":
    if dist.get_rank() == 1:
        if os.environ.get("HPCTORCH_STANDBY") != "0":
            wait_for_standbys(2)  # made once the ranks trained (the straggler watch's files)
        with open("/proc/uptime") as source:
            print(f"dies at {float(source.read().split()[0]):.2f}", flush=True)
        os._exit(7)
    time.sleep(60)  # in no collective: torch's agent stops it
dist.destroy_process_group()
"""


def _lines(output: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in output.splitlines() if "attempt=" in line]


def test_the_restart_runs_in_the_standbys_with_the_new_attempt_s_ranks(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    mark, summary = uuid.uuid4().hex, tmp_path / "summary.json"
    done = hpctorch("run", "--max-restarts", "1", "--nproc-per-node", "2", "--summary-json", str(summary), str(script),
                    env=clean_env(JOB_MARK=mark), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = _lines(done.stdout)
    first = [r for r in seen if r["attempt"] == "0"]
    again = [r for r in seen if r["attempt"] == "1"]
    assert sorted(r["rank"] for r in again) == ["0", "1"] and {(r["world"], r["sum"]) for r in again} == {("2", "2")}, done.stdout
    assert {r["standby"] for r in seen} == {"True"}, done.stdout  # the standby's own command line, its process
    # Every worker, both attempts', forked from one process of the node that imported torch once (the
    # first attempt's told to go at once, the second's waiting ahead); with the thread count the
    # worker entry gave each local rank, as a new process would have it.
    assert {r["parent"] for r in seen} == {"hpctorch-zygote"} and len({r["ppid"] for r in seen}) == 1, seen
    assert {r["threads"] for r in again} == {r["threads"] for r in first}, (first, again)
    died = float(re.search(r"dies at (\S+)", done.stdout).group(1))  # type: ignore[union-attr]
    assert all(float(r["started"]) < died for r in again), (died, again)  # started before the failure: ahead
    assert "hpctorch: 2 of 2 worker(s) of this attempt run in their warm standby" in done.stderr
    assert standbys_of(mark) == []  # the standbys made for a next failure went with the job
    # hpctorch's hooks work in a standby too (torch.distributed was imported ahead): the straggler
    # watch saw the restarted attempt's first collective, so the goodput knows it trained.
    attempts = json.loads(summary.read_text())["goodput"]["attempts"]
    assert len(attempts) == 2 and all(a["first_s"] is not None for a in attempts), attempts


def test_with_standbys_off_the_restart_forks_its_workers_once_the_first_died(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = hpctorch("run", "--max-restarts", "1", "--nproc-per-node", "2", str(script), env=clean_env(HPCTORCH_STANDBY="0"), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = _lines(done.stdout)
    again = [r for r in seen if r["attempt"] == "1"]
    assert {r["parent"] for r in seen} == {"hpctorch-zygote"} and len({r["ppid"] for r in seen}) == 1, seen
    died = float(re.search(r"dies at (\S+)", done.stdout).group(1))  # type: ignore[union-attr]
    assert len(again) == 2 and all(float(r["started"]) >= died - 0.02 for r in again), (died, again)  # nothing waited ahead
    assert "warm standby" not in done.stderr


def test_with_standbys_and_forks_off_every_worker_is_a_process_of_its_own(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = hpctorch("run", "--max-restarts", "1", "--nproc-per-node", "2", str(script),
                    env=clean_env(HPCTORCH_STANDBY="0", HPCTORCH_FORK_WORKERS="0"), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = _lines(done.stdout)
    assert len(seen) == 4 and {r["standby"] for r in seen} == {"False"}, done.stdout
    assert "hpctorch-zygote" not in {r["parent"] for r in seen} and len({r["ppid"] for r in seen}) == 1, seen  # the node's agent
    assert "warm standby" not in done.stderr


def test_standbys_started_as_their_own_processes_when_asked(tmp_path: Path) -> None:
    """HPCTORCH_STANDBY=spawn: no zygote; each standby an interpreter of its own, as the agent's child."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = hpctorch("run", "--max-restarts", "1", "--nproc-per-node", "2", str(script),
                    env=clean_env(HPCTORCH_STANDBY="spawn", JOB_MARK=uuid.uuid4().hex), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    again = [r for r in _lines(done.stdout) if r["attempt"] == "1"]
    assert {r["standby"] for r in again} == {"True"} and "hpctorch-zygote" not in {r["parent"] for r in again}, again
    assert len({r["ppid"] for r in again}) == 1  # the node's agent

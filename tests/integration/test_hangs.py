"""Hangs with every process alive, on this machine with real torch workers: ``hpctorch
stacks`` by each method, ``--stall-timeout`` (dump and kill), and the survivors' stacks
when a rank dies. The 2-node versions are in tests/cluster/test_hangs_cluster.py."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from hpctorch.guard.timeline import render

from ..conftest import ROOT, clean_env, hpctorch

HANG = str(ROOT / "tests" / "fixtures" / "hang.py")
HANG_GUARD_S = 120  # far above the ~10 s these runs take: a failure here means it hung


class Job:
    """``hpctorch run ... hang.py`` in the background, its stderr read as it comes."""

    def __init__(self, *args: str, **env: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "hpctorch", "run", *args, HANG], cwd=ROOT, env=clean_env(**env),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def finish(self, timeout: float = HANG_GUARD_S) -> int:
        """The exit code, once the job ended and its output was read to the end: its last lines
        (the closing summary, the reason it stopped) come after the workers' end, and on a loaded
        machine the reading thread may still be behind when the exit comes."""
        code = self.process.wait(timeout=timeout)
        self._pumping.join(timeout=timeout)
        assert not self._pumping.is_alive(), "the job's output never ended (a process of the job holds it open)"
        return code

    def wait_for(self, pattern: str, count: int = 1) -> None:
        deadline, seen = time.monotonic() + HANG_GUARD_S, 0
        while seen < count:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"hung: {pattern!r} never came; output:\n{''.join(self.output)[-3000:]}") from None
            seen += bool(re.search(pattern, line))

    def quiet_for(self, seconds: float) -> None:
        """No line for ``seconds`` (by this test's clock): a line fails at once. On a loaded
        machine the job's watch polls less often, never more: load cannot bring a line here."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return
            raise AssertionError(f"{line!r} came; output:\n{''.join(self.output)[-3000:]}")

    def stop(self) -> None:
        # SIGTERM: the agent stops its workers (they lead their own process groups; a
        # SIGKILL of the agent alone would leave them behind).
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture
def job_factory():  # type: ignore[no-untyped-def]
    jobs: list[Job] = []
    yield lambda *args, **env: jobs.append(Job(*args, **env)) or jobs[-1]
    for job in jobs:
        job.stop()


@pytest.mark.parametrize("method", ["py-spy", "faulthandler"])
def test_stacks_names_the_stuck_rank_and_the_waiting_ones(job_factory, method: str) -> None:  # type: ignore[no-untyped-def]
    # Its own run id: other tests' jobs may run on this machine at the same time (pytest-xdist).
    run_id = f"stacks-{method}-{os.getpid()}"
    job = job_factory("--nproc-per-node", "3", "--run-id", run_id)
    job.wait_for(r"rank \d of 3 ready", 3)
    deadline = time.monotonic() + HANG_GUARD_S
    while True:  # until the ranks are in their hang (a moment after "ready"): asked again, not waited for
        done = hpctorch("stacks", "--method", method, "--run-id", run_id, env=clean_env(), timeout=HANG_GUARD_S)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        if "2 different" in lines[0] or time.monotonic() > deadline:
            break
    assert lines[0] == f"hpctorch: stacks: 3 rank(s) on 1 node(s), by {method}; 2 different:", done.stdout
    assert re.fullmatch(r"  rank 2 \(\S+\): stuck_here hang\.py:\d+", lines[1]), done.stdout
    assert re.fullmatch(r"  ranks 0-1 \(\S+\): all_reduce ← train_step hang\.py:\d+", lines[2]), done.stdout
    dump = lines[3].split(": ", 1)[1]
    assert "=== rank 2" in open(dump, encoding="utf-8").read()
    assert job.process.poll() is None, "taking the stacks must not stop the job"


def test_no_job_here_is_one_line_and_exit_2() -> None:
    done = hpctorch("stacks", "--run-id", "no-such-run", env=clean_env(), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("hpctorch: error: no workers of run id no-such-run") and "; fix: " in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_stall_is_dumped_once_and_the_job_goes_on(job_factory) -> None:  # type: ignore[no-untyped-def]
    # One dump per stall: a stall is the silence after the last output. Under load the ranks may
    # reach their hang one by one, each "ready" line ending a stall: the dump that counts is the one
    # showing the hang, and no other follows it while the silence lasts (three more timeouts).
    # torch's C++ warnings (e.g. gloo's late socket notices) are output too: kept out of this count.
    job = job_factory("--simulate-nodes", "2", "--nproc-per-node", "2", "--stall-timeout", "3", TORCH_CPP_LOG_LEVEL="ERROR")
    job.wait_for(r"ranks 0-2 \(.*\): all_reduce ← train_step hang\.py")
    job.wait_for(r"rank 3 \(.*\): stuck_here hang\.py:\d+|every thread of every rank")
    job.quiet_for(9)
    text = "".join(job.output)
    hang = text.rindex("no rank wrote any output for 3 s (--stall-timeout); the job goes on")
    assert text[hang:].count("--stall-timeout") == 1, text
    assert re.search(r"  rank 3 \(.*\): stuck_here hang\.py:\d+", text[hang:]), text
    assert text[:hang].count("rank ") >= 4  # every rank's "ready" came before: no dump during the start
    assert job.process.poll() is None


@pytest.mark.parametrize("nodes", [(), ("--simulate-nodes", "2")], ids=["one-node", "two-nodes"])
def test_a_stall_that_ends_is_said_in_the_goodput_and_drawn(job_factory, tmp_path: Path, nodes: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    # The hang ends once the stall was said (an event, not a window): the job finishes, and its
    # goodput takes the stall out of training (one node: the watch beside the workers; several:
    # node 0's judge), says it, and the figures still add up to the wall time.
    summary, go_on = tmp_path / "summary.json", tmp_path / "go-on"
    job = job_factory(*nodes, "--nproc-per-node", "2", "--stall-timeout", "3", "--summary-json", str(summary),
                      HANG_UNTIL_FILE=str(go_on), TORCH_CPP_LOG_LEVEL="ERROR")
    job.wait_for(r"no rank wrote any output for 3 s \(--stall-timeout\); the job goes on")
    go_on.touch()
    assert job.finish(HANG_GUARD_S) == 0, "".join(job.output)[-3000:]
    goodput = json.loads(summary.read_text())["goodput"]
    assert goodput["stalls"] and all(s["to_s"] > s["from_s"] for s in goodput["stalls"]), goodput
    assert goodput["stalled_s"] >= 3.0, goodput  # the stall said lasted the timeout, at least, after training began
    added = goodput["start_s"] + goodput["training_s"] + goodput["stalled_s"] + sum(goodput["lost_s"])
    assert abs(added - goodput["wall_s"]) < 1.0, goodput
    # Node 0's stages on the way (one node: from its plan; a simulated node 0 plans nothing itself).
    assert goodput["start_stages"] and all(0 <= s["at_s"] <= goodput["start_s"] for s in goodput["start_stages"]), goodput
    text = "".join(job.output)
    assert re.search(r"^hpctorch: goodput \d+%: .* to the first collective \(.+ at [\d.]+ s\); [\d.]+ s stalled in training \(\d+ stalls?\)",
                     text, re.M), text[-3000:]
    rows = len(json.loads(summary.read_text())["nodes"])
    assert render(json.loads(summary.read_text())).count('class="stall"') == rows * len(goodput["stalls"])


@pytest.mark.parametrize("starter", [(), ("--max-restarts", "1")], ids=["hpctorch-starter", "torch-agent"])
def test_one_node_stall_with_kill_ends_the_job_with_the_stacks(job_factory, starter: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    # One node has no watchdog store (torch's agent may pick its port): the stall is watched beside the workers.
    job = job_factory("--nproc-per-node", "2", *starter, "--stall-timeout", "5", "--stall-action", "kill")
    assert job.finish(HANG_GUARD_S) == 1
    text = "".join(job.output)
    assert "where the other ranks were when the job was stopped: 2 rank(s) on 1 node(s)" in text, text
    assert re.search(r"  rank 1 \(.*\): stuck_here hang\.py:\d+", text), text
    assert re.search(r"  rank 0 \(.*\): all_reduce ← train_step hang\.py:\d+", text), text
    assert text.rstrip().endswith("hpctorch: stopped: no rank wrote any output for 5 s (--stall-timeout)"), text[-2000:]


def test_a_stall_after_a_warm_restart_shows_the_stacks_of_the_standbys_that_became_workers(job_factory) -> None:  # type: ignore[no-untyped-def]
    # The restart's workers were standbys, forked from the node's zygote (not the agent's children)
    # and started before their ranks were known (not in their /proc environ): still every rank's stacks.
    job = job_factory("--nproc-per-node", "2", "--max-restarts", "1", "--stall-timeout", "5", "--stall-action", "kill",
                      HANG_AFTER_RESTART="1", JOB_MARK=uuid.uuid4().hex)
    assert job.finish(HANG_GUARD_S + 180) == 1
    text = "".join(job.output)
    assert "hpctorch: 2 of 2 worker(s) of this attempt run in their warm standby" in text, text[-3000:]
    assert "where the other ranks were when the job was stopped: 2 rank(s) on 1 node(s)" in text, text[-3000:]
    assert re.search(r"  rank 1 \(.*\): stuck_here hang\.py:\d+", text), text[-3000:]
    assert re.search(r"  rank 0 \(.*\): all_reduce ← train_step hang\.py:\d+", text), text[-3000:]


def test_one_node_stall_is_dumped_and_the_job_goes_on(job_factory) -> None:  # type: ignore[no-untyped-def]
    job = job_factory("--nproc-per-node", "2", "--stall-timeout", "3")
    job.wait_for(r"no rank wrote any output for 3 s \(--stall-timeout\); the job goes on; stacks")
    job.wait_for(r"rank 1 \(.*\): stuck_here hang\.py:\d+")
    assert job.process.poll() is None


def test_a_stall_with_kill_ends_the_job_with_the_stacks(job_factory) -> None:  # type: ignore[no-untyped-def]
    job = job_factory("--simulate-nodes", "2", "--nproc-per-node", "2", "--stall-timeout", "6", "--stall-action", "kill")
    assert job.finish(HANG_GUARD_S) != 0
    text = "".join(job.output)
    assert "where the other ranks were when the job was stopped: 4 rank(s) on 2 node(s)" in text, text
    assert re.search(r"  rank 3 \(.*\): stuck_here hang\.py:\d+", text), text
    assert "no rank wrote any output for 6 s (--stall-timeout)" in text


def test_when_a_rank_dies_the_survivors_stacks_come_first(job_factory) -> None:  # type: ignore[no-untyped-def]
    # Without ptrace (HPCTORCH_STACKS_METHOD=faulthandler): the fallback every worker registered.
    job = job_factory("--simulate-nodes", "2", "--nproc-per-node", "2", HANG_EXIT_RANK="2", HANG_RANK="3",
                      HPCTORCH_STACKS_METHOD="faulthandler")
    assert job.finish(HANG_GUARD_S) != 0
    text = "".join(job.output)
    assert re.search(r"where the other ranks were when the job was stopped: \d rank\(s\) on 2 node\(s\), by faulthandler", text), text
    assert re.search(r"  rank 3 \(.*\): stuck_here hang\.py:\d+", text), text
    assert text.index("where the other ranks were") < text.index("hpctorch: failed after")


def test_one_node_without_torchs_agent_shows_the_survivors_too(job_factory) -> None:  # type: ignore[no-untyped-def]
    # One node: hpctorch starts the workers itself (supervisor.py); the same teardown summary.
    job = job_factory("--nproc-per-node", "3", HANG_EXIT_RANK="0", HANG_RANK="2")
    assert job.finish(HANG_GUARD_S) == 1
    text = "".join(job.output)
    assert "started by hpctorch (no torch agent)" in text
    assert re.search(r"  rank 2 \(\S+\): stuck_here hang\.py:\d+", text), text
    assert re.search(r"hpctorch: rank 0 \(local rank 0\) exited with code 3", text), text

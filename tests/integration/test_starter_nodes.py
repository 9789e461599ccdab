"""hpctorch's own starter on several nodes (no torch agent): two nodes on loopback, each an
``hpctorch run --nnodes 2 --node-rank N``; the workers meet at rank 0's store after the nodes'
agreement, and the helpers' watchdog ends the whole job when one node's rank fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctorch.host.network import free_port

from ..conftest import ROOT, clean_env

pytest.importorskip("torch")
SCRIPT = str(ROOT / "tests" / "fixtures" / "report.py")


def _nodes(*script_args: str, timeout: float = 120, options: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, "-m", "hpctorch", "run", "--nnodes", "2", "--node-rank", str(rank),
                                   "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "2", *options,
                                   SCRIPT, "--init", "--brief", *script_args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
                 for rank in (0, 1)]
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout)  # a hang guard
            # Decoded as is: text mode would turn a progress bar's carriage returns into newlines.
            results.append(subprocess.CompletedProcess(process.args, process.returncode, out.decode(), err.decode()))
    except subprocess.TimeoutExpired:
        # What every node said, not only the one waited on: the node that hung is often the other.
        for process in processes:
            process.kill()
        said = [process.communicate()[1].decode(errors="replace")[-3000:] for process in processes]
        pytest.fail(f"the nodes did not end within {timeout:.0f} s\n" + "\n".join(f"--- node {n}:\n{e}" for n, e in enumerate(said)))
    finally:
        for process in processes:
            process.kill()
    return results


def _wait_for_line(process: subprocess.Popen, text: str, timeout: float = 120) -> None:
    """Read ``process``'s output until a line holds ``text`` (a hang guard, not a pace)."""
    import select
    import time

    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"{text!r} never came"
        ready, _, _ = select.select([process.stdout], [], [], 1.0)
        if ready:
            line = process.stdout.readline()  # type: ignore[union-attr]
            assert line, f"the node ended before {text!r}"
            if text in line:
                return


def _beating(port: str, nodes: int) -> None:
    """Until every node's helper beats in the watchdog's store (whose port and keys the plan says)."""
    import datetime
    import time

    import torch

    shown = subprocess.run([sys.executable, "-m", "hpctorch", "plan", "--json", "--nnodes", "2", "--node-rank", "0",
                            "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1", SCRIPT],
                           capture_output=True, text=True, env=clean_env(), timeout=60)
    plan = json.loads(shown.stdout)
    store = torch.distributed.TCPStore("127.0.0.1", plan["watch_port"], is_master=False, timeout=datetime.timedelta(seconds=60))
    keys = [f"hpctorch/{plan['run_id']}/beat/{n}" for n in range(nodes)]
    deadline = time.monotonic() + 120
    while not store.check(keys):
        assert time.monotonic() < deadline, "the helpers never beat"
        time.sleep(0.2)


def test_plan_says_hpctorch_starts_the_workers_on_several_nodes() -> None:
    shown = subprocess.run([sys.executable, "-m", "hpctorch", "plan", "--json", "--nnodes", "2", "--node-rank", "1",
                            "--master-addr", "127.0.0.1", "--master-port", "29400", "--nproc-per-node", "2", SCRIPT],
                           capture_output=True, text=True, env=clean_env(), timeout=60)
    plan = json.loads(shown.stdout)
    assert plan["starter"] == "hpctorch", plan["reasons"]["starter"]
    assert plan["watch_port"] not in (0, 29400)


def test_two_nodes_train_without_torchs_agent() -> None:
    results = _nodes()
    assert [r.returncode for r in results] == [0, 0], results[0].stderr + results[1].stderr
    reports = [json.loads(line.split("REPORT ", 1)[1]) for r in results for line in r.stdout.splitlines() if "REPORT " in line]
    assert sorted(int(r["env"]["RANK"]) for r in reports) == [0, 1, 2, 3]
    assert {r["env"]["MASTER_PORT"] for r in reports} == {results[0].args[results[0].args.index("--master-port") + 1]}
    assert all(r["rank_sum"] == 6 for r in reports), reports  # every rank's all_reduce of the ranks
    assert all(r["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "False" for r in reports)  # rank 0's store, torch's env://
    assert "hpctorch: finished in" in results[0].stderr


@pytest.mark.parametrize("failing", ["1", "3"])
def test_a_rank_failing_on_one_node_ends_the_other(failing: str) -> None:
    # Rank 1 (node 0, whose hpctorch serves the watchdog's store) or rank 3 (node 1) exits at once,
    # while the others wait in the agreement or in init_process_group: that node's helper says so
    # and the other node's stops its workers; both name the rank. Rank 1's node puts the failure in
    # the store before it stops its survivors, rank 0 with the store of init_process_group among
    # them: node 1's ranks, forked with torch imported, are often inside it already and break on it
    # (their own tracebacks, prefixed), and node 1 still names rank 1, the earlier failure.
    results = _nodes("--fail-rank", failing, "--sleep", "120")
    assert all(r.returncode != 0 for r in results), results[0].stderr + results[1].stderr
    node = 0 if failing == "1" else 1
    cause = f"rank {failing} on node {node}"
    for result in results:
        assert cause in result.stderr.splitlines()[-1], result.stderr
        assert "Traceback" not in "".join(line for line in result.stderr.splitlines(True) if not line.startswith("[node ")), result.stderr


def test_a_node_stopped_by_a_signal_is_named_on_the_others() -> None:
    import signal

    port = str(free_port())
    processes = [subprocess.Popen([sys.executable, "-m", "hpctorch", "run", "--nnodes", "2", "--node-rank", str(rank),
                                   "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1",
                                   SCRIPT, "--init", "--brief", "--ready", "--sleep", "120"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
                 for rank in (0, 1)]
    try:
        _wait_for_line(processes[1], "READY rank=1")  # the workers met and are in their sleep
        processes[1].send_signal(signal.SIGTERM)
        errors = [p.communicate(timeout=90)[1] for p in processes]  # a hang guard
    finally:
        for process in processes:
            process.kill()
    assert processes[1].returncode == 128 + signal.SIGTERM, errors[1]
    assert "hpctorch: stopped by SIGTERM" in errors[1]
    assert processes[0].returncode != 0
    assert "hpctorch: stopped: node 1 was stopped by SIGTERM" in errors[0], errors[0]


def test_a_busy_watchdog_port_is_one_line_and_exit_2() -> None:
    import socket

    port = str(free_port())
    args = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1", SCRIPT]
    shown = subprocess.run([sys.executable, "-m", "hpctorch", "plan", "--json", *args], capture_output=True, text=True, env=clean_env(), timeout=60)
    watch = json.loads(shown.stdout)["watch_port"]
    with socket.socket() as other:  # another job listening there
        other.bind(("127.0.0.1", watch))
        other.listen()
        done = subprocess.run([sys.executable, "-m", "hpctorch", "run", *args], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hpctorch: error: the watchdog's port {watch} (") and "is already in use on this node; fix: pass another --master-port" in last, last
    assert "Traceback" not in done.stderr


@pytest.mark.serial  # its helpers' store must answer within a minute: never beside another test (scripts/run-tests)
def test_the_watchdog_helper_outlives_the_signals_a_launcher_sends_the_step() -> None:
    # slurmstepd signals every process of a step (scancel --signal=USR1, Slurm's --signal, SIGTERM
    # on cancel): the helper must survive them, or a later failure would go unreported.
    import signal
    import time

    import psutil

    port = str(free_port())
    compute = str(ROOT / "tests" / "fixtures" / "compute.py")
    processes = [subprocess.Popen([sys.executable, "-m", "hpctorch", "run", "--nnodes", "2", "--node-rank", str(rank),
                                   "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1",
                                   compute, "--seconds", "120", "--die-rank", "1", "--die-after", "12"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
                 for rank in (0, 1)]
    try:
        def is_helper(child: psutil.Process) -> bool:
            # A short-lived child (a probe the start runs) may have exited, unreaped, by the time
            # its command line is read (ci63: psutil.ZombieProcess): it is not the helper.
            try:
                return "hpctorch.guard.nodewatch" in " ".join(child.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
                return False

        helpers: list[psutil.Process] = []
        deadline = time.monotonic() + 60
        while len(helpers) < 2 and time.monotonic() < deadline:  # a hang guard
            time.sleep(0.2)
            helpers = [c for p in processes for c in psutil.Process(p.pid).children() if is_helper(c)]
        assert len(helpers) == 2
        _beating(port, 2)  # the helpers are watching
        # Node 1's helper reaches node 0's store with hpctorch's own client: no torch in it (about
        # 3 s of CPU and 300 MB a node); node 0's serves the store, with torch's.
        torch_in = [any("libtorch" in m.path for m in helper.memory_maps()) for helper in helpers]
        assert torch_in == [True, False], torch_in
        for helper in helpers:
            for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
                helper.send_signal(sig)
        errors = [p.communicate(timeout=90)[1] for p in processes]  # a hang guard: rank 1 dies at 12 s
    finally:
        for process in processes:
            process.kill()
    # Rank 1 (node 1) was SIGKILLed after the signals; node 0 heard it through the helpers.
    assert "hpctorch: stopped: rank 1 on node 1 (local rank 0) was killed by signal 9" in errors[0], errors[0][-3000:]


def test_a_shared_log_dir_keeps_every_nodes_files_and_every_run(tmp_path: Path) -> None:
    """Every node's local rank k wrote the same <log dir>/<run id>/attempt_0/k/stdout.log, and a
    requeued run (same run id) truncated the last one's."""
    for _run in range(2):
        results = _nodes(options=("--log-dir", str(tmp_path)))
        assert [r.returncode for r in results] == [0, 0], results[0].stderr + results[1].stderr
    kept = sorted(tmp_path.rglob("stdout.log"))
    ranks = sorted(json.loads(p.read_text().split("REPORT ", 1)[1])["env"]["RANK"] for p in kept)
    assert ranks == ["0", "0", "1", "1", "2", "2", "3", "3"], kept
    assert {p.parent.parent.parent.name.split("_node")[1][0] for p in kept} == {"0", "1"}  # <run id>_node<N>_...


def test_a_progress_bar_is_progress_to_the_stall_watch_and_redraws_in_place(tmp_path: Path) -> None:
    """A tqdm-like bar (carriage returns, no newline) for 8 s with --stall-timeout 2 and
    --stall-action kill: reproduced before, no byte was counted and the healthy job was killed."""
    results = _nodes("--bar", "8", options=("--stall-timeout", "2", "--stall-action", "kill"))
    assert [r.returncode for r in results] == [0, 0], results[0].stderr + results[1].stderr
    assert "--stall-timeout" not in results[0].stderr + results[1].stderr
    out = results[0].stdout
    assert re.search(r"\[[^\]\n]*rank 0\]: bar 1/32\r", out) and re.search(r"\[[^\]\n]*rank 0\]: bar 32/32\n", out), out[-2000:]

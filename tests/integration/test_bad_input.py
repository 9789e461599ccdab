"""Bad input: one line naming cause and fix, exit status 2, no traceback, no hang."""

from __future__ import annotations

import socket

import pytest

from ..conftest import ROOT, clean_env, hpctorch

SCRIPT = str(ROOT / "tests" / "fixtures" / "report.py")


def _assert_one_line(args: tuple[str, ...], env: dict[str, str], *words: str) -> None:
    done = hpctorch(*args, env=env, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hpctorch: error: ") and "; fix: " in lines[0]
    assert lines[0].count("error:") == 1 and not lines[0].startswith("hpctorch: error: hpctorch"), lines[0]
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (("run", "--iface", "nosuch0", "--nnodes", "2", "--node-rank", "0", "--master-port", "1234", SCRIPT), ("nosuch0", "lo (127.0.0.1/8")),
        (("run", "--nnodes", "2", SCRIPT), ("--nnodes 2", "--node-rank")),
        (("run", "missing_script.py"), ("missing_script.py", "not found")),
        (("run", "/bin/true"), ("'/bin/true' is a program", "--no-python")),
        (("run", str(ROOT / ".ci" / "run")), ("is a script for /usr/bin/env bash", "--no-python")),
        (("run", "--nnodes", "1:4", SCRIPT), ("--nnodes 1:4", "--rdzv-backend c10d")),
        (("run", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:x", SCRIPT), ("--rdzv-endpoint 'head:x'",)),
        (("run", "--nproc-per-node", "0", SCRIPT), ("starts nothing",)),
        # Checked before the plan is printed or anything starts: the only line is the error.
        (("run", "--console-ranks", "zero", SCRIPT), ("--console-ranks 'zero'",)),
        (("run", "--console-ranks", "5", "--nproc-per-node", "2", SCRIPT), ("--console-ranks 5: no such rank in a world of 2", "0 to 1")),
        (("run", "--console-ranks", "1", "--quiet-ranks", SCRIPT), ("--quiet-ranks and --console-ranks",)),
        (("run", "--quiet", "--verbose", SCRIPT), ("--quiet and --verbose",)),
        (("run", str(ROOT / "src" / "hpctorch")), ("is a folder, not a script", "-m ")),
        (("run", "--rdzv-timeout", "-5", SCRIPT), ("--rdzv-timeout -5",)),
        (("run", "--max-restarts", "-1", SCRIPT), ("--max-restarts -1",)),
        (("run", "--simulate-nodes", "2", "--nnodes", "3", SCRIPT), ("--nnodes", "--simulate-nodes")),
        (("run", "--stall-timeout", "0", SCRIPT), ("--stall-timeout 0",)),
        (("run", "--stall-timeout", "30", "--no-prefix", SCRIPT), ("--no-prefix", "--tee")),
        (("run", "--mode", "per-task", "--stall-timeout", "30", SCRIPT), ("per-task", "hpctorch stacks")),
        (("run", "--screen-threshold", "1.5", SCRIPT), ("'1.5' is not a fraction between 0 and 1",)),
        (("run", "--screen-threshold", "0", SCRIPT), ("'0' is not a fraction",)),
        (("run", "--screen=maybe", SCRIPT), ("--screen", "'maybe'")),
        (("run", "--screen", "--simulate-nodes", "2", SCRIPT), ("--simulate-nodes", "--screen")),
        (("run", "--spare-nodes", "-1", SCRIPT), ("'-1' is not a count of nodes",)),
        (("run", "--straggler-threshold", "1.5", SCRIPT), ("'1.5' is not a fraction between 0 and 1",)),
        (("run", "--stragglers", "loud", SCRIPT), ("invalid choice: 'loud'",)),
        (("run", "--spare-nodes", "1", SCRIPT), ("--spare-nodes 1 on a single node",)),
        (("run", "--spare-nodes", "2", "--nnodes", "2", "--node-rank", "0", "--master-port", "1234", SCRIPT), ("--spare-nodes 2 of 2 nodes", "at most 1")),
        (("run", "--spare-nodes", "1", "--max-restarts", "1", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1234", SCRIPT),
         ("hot spares", "not with --nnodes 1:2")),
        (("run", "--spare-nodes", "1", "--max-restarts", "1", "--rdzv-backend", "file", "--rdzv-endpoint", "/tmp", "--nnodes", "2", "--node-rank", "0",
          "--master-port", "1234", SCRIPT), ("hot spares", "not with --rdzv-backend file")),
        (("run", "--spare-nodes", "1", "--simulate-nodes", "2", SCRIPT), ("--spare-nodes measures real nodes",)),
        (("run", "--stage-env", "--stage-dir", "/nonexistent/scratch", SCRIPT), ("--stage-dir /nonexistent/scratch: no such folder",)),
        (("run", "--stage-env=/nonexistent/libs", SCRIPT), ("--stage-env /nonexistent/libs: no such folder",)),
        (("stacks", "--timeout", "-1"), ("--timeout -1",)),
        (("plan", "--master-port", "70000"), ("70000",)),
        # Was a traceback under torch's agent ("Not a directory" under hpctorch's starter).
        (("run", "--log-dir", SCRIPT, "--nproc-per-node", "2", SCRIPT), (f"--log-dir {SCRIPT} is a file", "give --log-dir a folder")),
        (("run", "--log-dir", SCRIPT, "--max-restarts", "1", SCRIPT), (f"--log-dir {SCRIPT} is a file", "give --log-dir a folder")),
        (("hostlist", "expand", "n[1-"), ("never closed",)),
        (("run",), ("script",)),
        (("submit", "--nodes", "0", "--time", "1:00", "--scheduler", "slurm", "--dry-run", SCRIPT), ("--nodes 0",)),
        (("submit", "--nodes", "2", "--time", "soon", "--scheduler", "slurm", "--dry-run", SCRIPT), ("--time 'soon'",)),
        (("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "moab", "--dry-run", SCRIPT), ("moab",)),
        (("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--account", "a\nb", "--dry-run", SCRIPT), ("newline",)),
        (("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--dry-run", "nope.py"), ("not found",)),
        (("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--job-name", "my job", "--dry-run", SCRIPT),
         ("--job-name 'my job' holds a space", "--job-name my_job")),
        (("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--dry-run", "/bin/true"), ("is a program", "hpctorch run --no-python")),
        (("submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--job-script", SCRIPT, SCRIPT), ("not a job script hpctorch wrote",)),
    ],
)
def test_bad_command_lines(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    _assert_one_line(args, clean_env(), *words)


def test_nested_launch_names_the_process_count() -> None:
    env = clean_env(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    _assert_one_line(("run", "--nproc-per-node", "2", SCRIPT), env, "2 x 2 = 4 processes")


def test_a_screen_under_torchrun_s_agent_says_there_is_nothing_to_renumber() -> None:
    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999",
                    TORCHELASTIC_RUN_ID="job7")  # as torchrun's agent sets them
    _assert_one_line(("run", "--screen", SCRIPT), env, "--screen needs one hpctorch per node", "unchanged")
    _assert_one_line(("run", "--spare-nodes", "1", SCRIPT), env, "--spare-nodes")
    _assert_one_line(("run", "--stage-env", SCRIPT), env, "--stage-env needs hpctorch to start the workers", "unchanged")


def test_hot_spares_per_task_ask_for_one_hpctorch_per_node() -> None:
    # srun starting every rank (2 nodes x 2 tasks), as Slurm's srun sets it in each task.
    env = clean_env(SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_NTASKS="4", SLURM_NNODES="2", SLURM_NODEID="0", SLURM_PROCID="0",
                    SLURM_LOCALID="0", SLURM_STEP_NODELIST="n[1-2]", SLURM_JOB_NODELIST="n[1-2]", SLURM_STEP_TASKS_PER_NODE="2(x2)",
                    SLURM_TASKS_PER_NODE="2(x2)", SLURM_STEP_NUM_NODES="2", SLURM_STEP_NUM_TASKS="4")
    _assert_one_line(("run", "--spare-nodes", "1", "--max-restarts", "1", "--master-addr", "127.0.0.1", SCRIPT), env,
                     "hot spares", "needs one hpctorch per node", "per-task")


@pytest.mark.parametrize("variable, value, words", [
    ("HPCTORCH_STRAGGLERS", "loud", ("HPCTORCH_STRAGGLERS=loud is neither off nor warn",)),
    ("HPCTORCH_STRAGGLER_THRESHOLD", "x", ("HPCTORCH_STRAGGLER_THRESHOLD=x is not a number",)),
    ("HPCTORCH_STRAGGLER_WINDOW_S", "0", ("shorter than a second",)),
    ("HPCTORCH_STAGE_FANOUT", "0", ("HPCTORCH_STAGE_FANOUT='0' is not a number of at least 1",)),
])
def test_bad_straggler_settings_in_the_environment(variable: str, value: str, words: tuple[str, ...]) -> None:
    flags = ("--stage-env",) if variable.startswith("HPCTORCH_STAGE_") else ()
    _assert_one_line(("run", *flags, "--nproc-per-node", "1", SCRIPT), clean_env(**{variable: value}), *words)


def test_contradictory_launcher_variables() -> None:
    _assert_one_line(("plan",), clean_env(RANK="5", WORLD_SIZE="4"), "RANK=5", "WORLD_SIZE=4")
    _assert_one_line(("plan",), clean_env(RANK="x", WORLD_SIZE="4"), "RANK='x'")
    batch = clean_env(SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node[1-2]", SLURM_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="3",
                      SLURM_NNODES="3", SLURM_TASKS_PER_NODE="1(x2)")
    _assert_one_line(("plan",), batch, "SLURM_JOB_NUM_NODES=3", "names 2 node(s)")


def test_busy_explicit_port_on_the_master() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = str(held.getsockname()[1])
        _assert_one_line(("run", "--nproc-per-node", "1", "--master-port", port, SCRIPT), clean_env(), port, "already in use")


def test_a_full_dev_shm_is_one_line_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """hpctorch's own starter on several nodes keeps node-local files in /dev/shm: full, it was a
    traceback. Here a private, tiny /dev/shm (unshare --mount), filled before hpctorch starts."""
    import os
    import shutil
    import subprocess
    import sys

    from ..conftest import require

    require(hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("unshare") is not None, "needs root and unshare")
    fill = "mount -t tmpfs -o size=64k tmpfs /dev/shm && (dd if=/dev/zero of=/dev/shm/fill bs=4k 2>/dev/null; true) && exec \"$0\" \"$@\""
    argv = [sys.executable, "-m", "hpctorch", "run", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
            "--master-port", "29911", "--nproc-per-node", "1", SCRIPT]
    done = subprocess.run(["unshare", "--mount", "--", "sh", "-c", fill, *argv], capture_output=True, text=True, env=clean_env(),
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2, (done.returncode, done.stderr)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctorch: error: No space left on device: /dev/shm/") and "; fix: free space there" in last, done.stderr
    assert "Traceback" not in done.stderr

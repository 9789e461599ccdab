"""Grouping and reading stacks (pure), and the worker entry's promise: a script runs as
``python script.py`` would run it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from hpctorch.stacks import groups
from hpctorch.stacks.dump import Frame, RankStack, Thread, Worker, parse_faulthandler
from hpctorch.start.workers import WORKER_ENTRY, worker_command

SITE = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"

FAULTHANDLER = """\
Thread 0x00007f2a1b7fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2a1c9a3740 (most recent call first):
  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/home/u/train.py", line 42 in train_step
  File "/home/u/train.py", line 50 in <module>
"""


def stack(rank: int, host: str, frames: list[tuple[str, str, int]], note: str = "", method: str = "py-spy") -> RankStack:
    thread = Thread("MainThread", tuple(Frame(*f) for f in frames), main=True)
    return RankStack(Worker(1000 + rank, rank, rank % 2, rank // 2, host), (thread,) if frames else (), method, note)


def test_faulthandler_dump_is_read_with_the_main_thread_last() -> None:
    threads = parse_faulthandler(FAULTHANDLER)
    assert [t.main for t in threads] == [False, True]
    assert threads[1].frames[0] == Frame("all_reduce", SITE, 3252)
    assert threads[1].frames[1] == Frame("train_step", "/home/u/train.py", 42)


def test_identical_stacks_collapse_and_the_odd_one_comes_first() -> None:
    waiting = [("all_reduce", SITE, 3252), ("train_step", "/home/u/train.py", 42)]
    node1 = [stack(0, "n1", waiting), stack(1, "n1", waiting)]
    node2 = [stack(2, "n2", waiting), stack(3, "n2", [("stuck_here", "/home/u/train.py", 16), ("main", "/home/u/train.py", 30)])]
    merged = groups.merge([groups.groups(node1), groups.groups(node2)])
    lines = groups.summary(merged, 2, "/tmp/d.txt")
    assert lines[0] == "hpctorch: stacks: 4 rank(s) on 2 node(s), by py-spy; 2 different:"
    assert lines[1] == "  rank 3 (n2): stuck_here train.py:16"
    assert lines[2] == "  ranks 0-2 (n[1-2]): all_reduce ← train_step train.py:42"
    assert lines[3].endswith("/tmp/d.txt (on each node)")


def test_an_exited_worker_is_reported_as_exited() -> None:
    merged = groups.merge([groups.groups([stack(5, "n3", [], note="exited")])])
    assert groups.summary(merged, 1, None)[1] == "  rank 5 (n3): exited"


def test_ranks_are_written_as_ranges() -> None:
    assert groups.ranks_text([0, 1, 2, 5, 7, 8]) == "ranks 0-2,5,7-8"
    assert groups.ranks_text([4]) == "rank 4"


def test_full_dump_names_every_rank_and_thread() -> None:
    text = groups.full_text([stack(1, "n1", [("f", "/a.py", 3)]), stack(0, "n1", [("g", "/b.py", 4)])])
    assert text.index("=== rank 0") < text.index("=== rank 1")
    assert 'File "/b.py", line 4, in g' in text


def test_python_workers_start_through_the_entry_and_others_only_for_lists() -> None:
    python = sys.executable
    assert worker_command((python, "-u", "train.py", "--lr", "1"), False) == (python, "-u", WORKER_ENTRY, "train.py", "--lr", "1")
    assert worker_command((python, "-u", "-m", "pkg.train"), False) == (python, "-u", WORKER_ENTRY, "-m", "pkg.train")
    assert worker_command(("./train.sh", "x"), False) == ("./train.sh", "x")
    assert worker_command(("./train.sh", "x"), True) == (python, WORKER_ENTRY, "--exec", "./train.sh", "x")


def test_the_entry_runs_a_script_as_python_would(tmp_path: Path) -> None:
    # A module of the user's named like one of hpctorch's must win: sys.path[0] is the script's directory.
    (tmp_path / "plan.py").write_text("WHO = 'user'\n")
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import sys, plan
        print(__name__, plan.WHO, "|".join(sys.argv), sys.path[0])
        """))
    done = subprocess.run([sys.executable, "-u", WORKER_ENTRY, str(tmp_path / "train.py"), "--lr", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["__main__", "user", f"{tmp_path / 'train.py'}|--lr|1", str(tmp_path)]


def test_the_entry_runs_a_module_as_python_m_would(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit(4)\n")
    done = subprocess.run([sys.executable, "-u", WORKER_ENTRY, "-m", "mypkg.train", "a"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    assert done.stdout.split() == ["__main__", "['a']"]


def test_native_frames_stay_in_the_dump_but_do_not_name_the_stack() -> None:
    # py-spy --native: C/C++ frames (a shared library, line 0) around the Python ones.
    native = ("c10d::ProcessGroupGloo::allreduce", "/site-packages/torch/lib/libtorch_cpu.so", 0)
    plain = stack(0, "n1", [("all_reduce", SITE, 3252), ("train_step", "/home/u/train.py", 42)])
    mixed = stack(1, "n1", [native, ("all_reduce", SITE, 3252), ("train_step", "/home/u/train.py", 42)])
    (group,) = groups.merge([groups.groups([plain, mixed])])
    assert group["ranks"] == [0, 1] and group["text"] == "all_reduce ← train_step train.py:42"
    assert "libtorch_cpu.so" in groups.full_text([mixed])



TEARING_DOWN = """
import os, signal, sys, time
from hpctorch.host.folders import stack_file
from hpctorch.host.signals import STACK_SIGNAL
path = stack_file(sys.argv[1], os.getpid())
open(path, "w").close()
signal.signal(STACK_SIGNAL, lambda *_: (os.remove(path), os._exit(1)))  # exiting: its atexit removes the file
open(sys.argv[2], "w").close()
time.sleep(60)
"""


def test_a_worker_whose_stack_file_goes_at_teardown_is_an_exited_rank_not_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Reproduced before: the capture's FileNotFoundError escaped, and hpctorch's starter said
    "cannot start '.../python': No such file or directory" instead of naming the failed rank."""
    import subprocess
    import sys
    import time

    from hpctorch.host.signals import STACK_SIGNAL
    from hpctorch.stacks.dump import Worker, capture

    if STACK_SIGNAL is None:
        return  # no faulthandler fallback on this platform
    ready = tmp_path / "ready"
    process = subprocess.Popen([sys.executable, "-c", TEARING_DOWN, str(tmp_path), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and process.poll() is None, "the worker never got ready"
            time.sleep(0.01)
        [stack] = capture([Worker(process.pid, 1, 1, 0, "n1", str(tmp_path))], method="faulthandler", budget_s=5)
        assert (stack.method, stack.note) == ("faulthandler", "exited")
    finally:
        process.kill()
        process.wait()


def test_a_warm_workers_rank_comes_from_its_own_file_and_a_file_others_could_write_is_not_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import os

    from hpctorch.host.folders import rank_file
    from hpctorch.stacks.job import rank_variables

    started = {"TORCHELASTIC_RUN_ID": "run", "LOCAL_RANK": "0", "HPCTORCH_STACKS_DIR": str(tmp_path)}  # a standby's, before its go
    assert rank_variables(4242, {**started, "RANK": "5"})["RANK"] == "5"  # started with its rank: as it was
    assert rank_variables(4242, started) is None  # a standby still waiting, or the zygote
    told = Path(rank_file(str(tmp_path), 4242))
    told.write_text(json.dumps({"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "HOME": "/elsewhere"}))
    told.chmod(0o600)
    seen = rank_variables(4242, started)
    assert seen is not None and (seen["RANK"], seen["LOCAL_RANK"], seen["GROUP_RANK"]) == ("3", "1", "1")
    assert "HOME" not in seen  # the rank's variables alone
    told.chmod(0o644)  # not the private file the worker wrote
    assert rank_variables(4242, started) is None
    told.unlink()
    os.symlink(tmp_path / "elsewhere", told)
    (tmp_path / "elsewhere").write_text(json.dumps({"RANK": "9"}))
    (tmp_path / "elsewhere").chmod(0o600)
    assert rank_variables(4242, started) is None  # never through a link

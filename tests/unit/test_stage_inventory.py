"""This user's environment copies on a node (stage.inventory, `hpctorch stage list|clean`):
copies in use by a live process are kept; of the others, the few used last within a week;
half copies of processes gone are removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hpctorch.stage import inventory

from ..conftest import clean_env


def gone_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def copy(folder: Path, key: str, used: float, size: int = 4096) -> Path:
    """A finished copy as unpack leaves it: its folder, a file, and its mark (whose time is its last use)."""
    made = folder / key
    (made / "0" / "bin").mkdir(parents=True)
    (made / "0" / "bin" / "python").write_bytes(b"x" * size)
    mark = made / inventory.MARK
    mark.write_text(json.dumps({"key": key, "roots": {"/shared/venv": str(made / "0")}, "made": used}))
    os.utime(mark, (used, used))
    return made


def test_in_use_copies_stay_and_the_few_used_last_stay_a_week(tmp_path: Path) -> None:
    now = time.time()
    day = 86400.0
    for n, key in enumerate(["a", "b", "c", "d", "e"]):  # a: used last
        copy(tmp_path, key, now - n * day)
    old = copy(tmp_path, "old", now - 30 * day)
    os.utime(old / inventory.MARK, (now - 30 * day, now - 30 * day))
    inventory.hold(str(tmp_path), "e")  # this process runs from e, the fifth used
    gone = {c.key for c in inventory.prune(str(tmp_path), keep=3, now=now)}
    assert gone == {"d", "old"}  # beyond the 3 used last and unused; e is in use
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a", "b", "c", "e"]
    # Within the 3 used last, a copy unused for over a week goes too.
    os.utime(tmp_path / "c" / inventory.MARK, (now - 8 * day, now - 8 * day))
    assert {c.key for c in inventory.prune(str(tmp_path), keep=3, now=now)} == {"c"}


def test_a_half_copy_goes_once_its_maker_is_gone_and_markers_of_the_dead_are_dropped(tmp_path: Path) -> None:
    dead = gone_pid()
    (tmp_path / f".k1.{dead}.tmp" / "0").mkdir(parents=True)  # a job cancelled while it unpacked
    (tmp_path / f".k2.{os.getpid()}.tmp" / "0").mkdir(parents=True)  # this process, unpacking now
    copy(tmp_path, "k3", time.time())
    (tmp_path / inventory.USERS).mkdir(mode=0o700)
    (tmp_path / inventory.USERS / f"k3.{dead}").touch()
    found = {c.key: c for c in inventory.copies(str(tmp_path))}
    assert found["k1"].partial and found["k1"].users == () and found["k2"].users == (os.getpid(),)
    assert found["k3"].users == () and not (tmp_path / inventory.USERS / f"k3.{dead}").exists()
    assert {c.key for c in inventory.prune(str(tmp_path))} == {"k1"}
    gone, freed, kept = inventory.clean(str(tmp_path))
    assert {c.key for c in gone} == {"k3"} and freed > 4096 and [c.key for c in kept] == ["k2"]  # clean: every copy no process uses
    assert [c.key for c in inventory.copies(str(tmp_path))] == ["k2"]


def test_stage_list_and_clean_on_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "scratch"
    root.mkdir()
    env = clean_env()
    run = lambda *args: subprocess.run([sys.executable, "-m", "hpctorch", "stage", *args, "--stage-dir", str(root)],  # noqa: E731
                                       capture_output=True, text=True, env=env, timeout=60)
    listed = run("list")
    assert listed.returncode == 0 and listed.stdout == "", listed.stderr
    where = next(root.glob("hpctorch-stage-*/*/copies"))
    assert listed.stderr.startswith(f"0 copies, 0.0 MiB, in {where}; 0 in use"), listed.stderr
    copy(where, "f00d" * 16, time.time(), size=1 << 20)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (where / inventory.USERS).mkdir(mode=0o700, exist_ok=True)
        copy(where, "beef" * 16, time.time() - 60)
        (where / inventory.USERS / f"{'beef' * 16}.{holder.pid}").touch()
        listed = run("list")
        rows = [line.split("\t") for line in listed.stdout.splitlines()]
        assert rows[0] == ["key", "size", "last used", "in use by", "copies of"], listed.stdout
        assert [(r[0], r[3], r[4]) for r in rows[1:]] == [("f00d" * 4, "-", "/shared/venv"), ("beef" * 4, f"pid {holder.pid}", "/shared/venv")]
        assert "2 copies" in listed.stderr and "1 in use; hpctorch stage clean removes the 1 no process runs from" in listed.stderr
        cleaned = run("clean")
        assert cleaned.returncode == 0 and cleaned.stderr.startswith(f"removed 1 copy (1.0 MiB) from {where}; kept 1"), cleaned.stderr
        assert sorted(p.name for p in where.iterdir() if not p.name.startswith(".")) == ["beef" * 16]
    finally:
        holder.kill()
        holder.wait()
    assert run("list").stderr.startswith("1 copy, ")
    assert run("clean").stderr.startswith("removed 1 copy ")  # its process gone: nothing keeps it


def test_a_missing_stage_dir_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "hpctorch", "stage", "list", "--stage-dir", "/no/such/folder"],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("hpctorch: error: --stage-dir /no/such/folder: no such folder") and "Traceback" not in done.stderr


def test_a_stop_signal_while_unpacking_removes_the_half_copy_then_stops(tmp_path: Path) -> None:
    # scancel's SIGTERM used to leave the half copy for a week (21 MB seen).
    code = ("import os, signal, sys\n"
            "from hpctorch.stage.node import _half_copy_removed_if_stopped\n"
            "folder = sys.argv[1]\n"
            "with _half_copy_removed_if_stopped(folder):\n"
            "    os.makedirs(os.path.join(folder, f'.k.{os.getpid()}.tmp', '0'))\n"
            "    open(os.path.join(folder, '.k.1.tmp.other'), 'w').close()\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    signal.pause()\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == -15, done.stderr  # stopped by the signal, as without the handler
    assert [p.name for p in tmp_path.iterdir()] == [".k.1.tmp.other"]  # its own half copy gone, nothing else touched

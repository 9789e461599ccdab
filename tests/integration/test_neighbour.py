"""Another user on the same machine (a second real user, made with useradd when root): /tmp,
/dev/shm and TMPDIR are shared, and hpctorch's folder names there are predictable. What the
neighbour prepares is refused in one line, never read, written into or put on a path."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.host import folders
from hpctorch.plan.rendezvous import read_master, write_master
from hpctorch.stacks.job import write_dump

from ..conftest import require
from ..unit.test_rendezvous import task_plans

NEIGHBOUR = "hpctorch-nb"


@pytest.fixture(scope="module")
def neighbour() -> tuple[int, int]:
    require(hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None,
            "needs root and useradd, to create a second user")
    try:
        entry = pwd.getpwnam(NEIGHBOUR)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", NEIGHBOUR], check=True, timeout=60)
        entry = pwd.getpwnam(NEIGHBOUR)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture()
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp or /dev/shm (mode 1777) that both users reach."""
    path = Path(tempfile.mkdtemp(prefix="hpctorch-test-shm-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_neighbour(ids: tuple[int, int], *argv: str) -> None:
    subprocess.run(list(argv), user=ids[0], group=ids[1], extra_groups=[], check=True, timeout=30)


MINE = f"hpctorch-{os.getuid()}"  # the name of this user's folder, which anyone can predict


def planted_relay(ids: tuple[int, int], shm: Path, run_id: str) -> Path:
    """The neighbour's folder under this user's name, world-writable, with a master record."""
    folder = shm / MINE
    as_neighbour(ids, "mkdir", "-m", "0777", str(folder))
    record = shm / "record.json"
    record.write_text(json.dumps({"run_id": run_id, "addr": "6.6.6.6", "port": 29500, "host": "node1"}))
    record.chmod(0o644)
    as_neighbour(ids, "cp", str(record), str(folder / f"{run_id}.master.json"))
    return folder


def test_a_relay_folder_another_user_made_first_is_refused(neighbour: tuple[int, int], shared_tmp: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Reproduced before: per task, local rank 1 took the neighbour's 6.6.6.6 as its master."""
    monkeypatch.setattr(folders, "polling_root", lambda: str(shared_tmp))
    master, _, second = task_plans(tmp_path, timeout=5)
    folder = planted_relay(neighbour, shared_tmp, second.run_id)
    write_master(master)
    with pytest.raises(HpctorchError) as caught:
        read_master(second)
    line = caught.value.line()
    assert str(folder) in line and f"belongs to user {NEIGHBOUR}" in line and "fix: remove it" in line
    assert "\n" not in line
    assert sorted(p.name for p in folder.iterdir()) == [f"{second.run_id}.master.json"]  # nothing written there


def test_a_symbolic_link_in_place_of_the_folder_is_refused(neighbour: tuple[int, int], shared_tmp: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folders, "polling_root", lambda: str(shared_tmp))
    target = shared_tmp / "neighbours-own"
    as_neighbour(neighbour, "mkdir", "-m", "0777", str(target))
    as_neighbour(neighbour, "ln", "-s", str(target), str(shared_tmp / MINE))
    master, first, _ = task_plans(tmp_path, timeout=5)
    write_master(master)
    with pytest.raises(HpctorchError, match="is a symbolic link"):
        read_master(first)
    with pytest.raises(HpctorchError, match="is a symbolic link"):
        folders.faulthandler_dir()
    assert list(target.iterdir()) == []  # nothing written through the link


def test_stack_dumps_and_the_library_shim_never_go_into_the_neighbours_folder(neighbour: tuple[int, int], shared_tmp: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folders, "polling_root", lambda: str(shared_tmp))
    as_neighbour(neighbour, "mkdir", "-m", "0777", str(shared_tmp / MINE))
    assert folders.node_dir() == str(shared_tmp / MINE)
    assert write_dump([], "test") is None
    with pytest.raises(HpctorchError, match=f"belongs to user {NEIGHBOUR}"):
        folders.private_dir(os.path.join(folders.private_dir(folders.node_dir()), "mpich-abi"))
    assert list((shared_tmp / MINE).iterdir()) == []


def test_a_shared_rendezvous_folder_of_another_user_is_not_believed(neighbour: tuple[int, int], shared_tmp: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The submit directory's .hpctorch made by someone else (a group project folder): node 0
    does not write there, and no node reads a record from it."""
    monkeypatch.setattr(folders, "polling_root", lambda: str(shared_tmp))
    master, first, _ = task_plans(tmp_path, timeout=5)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".hpctorch").mkdir()
    os.chown(shared / ".hpctorch", *neighbour)  # as if the neighbour made it
    with pytest.raises(HpctorchError, match=r"\.hpctorch belongs to user"):
        write_master(master)
    record = {"run_id": first.run_id, "addr": "6.6.6.6", "port": 29500, "host": "node1"}
    (shared / ".hpctorch" / f"{first.run_id}.master.json").write_text(json.dumps(record))
    with pytest.raises(HpctorchError, match="the master's address was found in .*, which belongs to user"):
        read_master(first)


def test_own_folders_are_made_private_and_loose_ones_refused(shared_tmp: Path) -> None:
    made = folders.private_dir(str(shared_tmp / "made"))
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700
    readable = shared_tmp / "readable"
    readable.mkdir(mode=0o755)
    readable.chmod(0o755)
    folders.private_dir(str(readable))
    assert stat.S_IMODE(os.lstat(readable).st_mode) == 0o700  # narrowed: ours alone
    writable = shared_tmp / "writable"
    writable.mkdir()
    writable.chmod(0o777)
    with pytest.raises(HpctorchError, match="can be written by others"):
        folders.private_dir(str(writable))
    fd = folders.create_private_file(str(Path(made) / "dump.txt"))
    os.close(fd)
    assert stat.S_IMODE(os.stat(Path(made) / "dump.txt").st_mode) == 0o600

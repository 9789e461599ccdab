"""This user's environment copies on this node (``--stage-env``): which there are, which a live
process runs from, and which go.

A node that runs from a copy marks it in use (``hold``: an empty file named after the copy and
the process, in ``<copies>/.users``) for as long as that process lives, which a job of any length
keeps. Staging then keeps every copy in use and, of the others, the ``KEEP_COPIES`` used last
if used within ``KEEP_S``; a half-made copy goes once the process making it is gone (a job
cancelled while it unpacked). ``hpctorch stage list`` shows them, ``hpctorch
stage clean`` removes every one no process uses.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field

from ..host.folders import create_private_file, file_system_of, private_dir
from .pack import KEEP_S

MARK = "staged.json"
"""The finished copy's mark (``unpack``): its key and the folders it copies."""
USERS = ".users"
KEEP_COPIES = 3
"""Copies kept past a new one whatever their age: a user switching between a few environments
does not pay for a copy each time."""
MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})


@dataclass(frozen=True)
class Copy:
    """One copy (or one being made) in a node's copies folder."""

    key: str
    path: str
    used: float
    """When a job last started from it (its mark's time); when it was begun, for a half copy."""
    roots: dict[str, str] = field(default_factory=dict)
    users: tuple[int, ...] = ()
    """Live processes that run from it (or, for a half copy, the one making it)."""
    partial: bool = False

    def size(self) -> int:
        """Bytes allocated under it (hard links once, links not followed): a walk of every file,
        for what is shown, never for staging's own rule."""
        total, seen = 0, set()
        for folder, dirs, files in os.walk(self.path):
            for name in (*dirs, *files):
                try:
                    facts = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                if facts.st_nlink > 1 and not stat.S_ISDIR(facts.st_mode):
                    if (facts.st_dev, facts.st_ino) in seen:
                        continue
                    seen.add((facts.st_dev, facts.st_ino))
                total += facts.st_blocks * 512
        return total


def half_copy(copies_dir: str, key: str, pid: int) -> str:
    """Where process ``pid`` makes the copy of ``key`` (renamed to ``key`` once whole)."""
    return os.path.join(copies_dir, f".{key}.{pid}.tmp")


def remove_half_copies_of(copies_dir: str, pid: int) -> None:
    """The copies ``pid`` was making, removed (it is being stopped: never an error of its own)."""
    try:
        names = os.listdir(copies_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(".") and name.endswith(f".{pid}.tmp"):
            shutil.rmtree(os.path.join(copies_dir, name), ignore_errors=True)


def hold(copies_dir: str, key: str) -> None:
    """This process runs from the copy ``key``: it is kept while the process lives."""
    folder = private_dir(os.path.join(copies_dir, USERS))
    try:
        os.close(create_private_file(os.path.join(folder, f"{key}.{os.getpid()}")))
    except FileExistsError:
        pass


def copies(copies_dir: str) -> list[Copy]:
    """Every copy in ``copies_dir``, the one used last first; markers of processes gone are removed."""
    users = _users(copies_dir)
    found = []
    try:
        entries = list(os.scandir(copies_dir))
    except OSError:
        return []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False) or entry.name == USERS:
            continue
        if entry.name.startswith(".") and entry.name.endswith(".tmp"):  # half_copy's name: being made
            key, _, pid = entry.name[1:-len(".tmp")].rpartition(".")
            maker = (int(pid),) if pid.isdigit() and _alive(int(pid)) else ()
            found.append(Copy(key, entry.path, _mtime(entry.path), users=maker, partial=True))
            continue
        try:
            with open(os.path.join(entry.path, MARK), encoding="utf-8") as handle:
                roots = dict(json.load(handle).get("roots") or {})
        except (OSError, ValueError, AttributeError):
            roots = {}
        found.append(Copy(entry.name, entry.path, _mtime(os.path.join(entry.path, MARK)) or _mtime(entry.path),
                          roots, tuple(sorted(users.get(entry.name, ())))))
    return sorted(found, key=lambda c: c.used, reverse=True)


def prune(copies_dir: str, keep: int = KEEP_COPIES, max_age_s: float = KEEP_S, now: float | None = None) -> list[Copy]:
    """Staging's rule: every copy no live process uses goes once it is not among the ``keep``
    used last, or unused for ``max_age_s``; a half copy goes once its maker is gone. What was removed."""
    now = time.time() if now is None else now
    present = copies(copies_dir)
    finished = [c for c in present if not c.partial]
    gone = [c for rank, c in enumerate(finished) if not c.users and (rank >= keep or now - c.used > max_age_s)]
    gone += [c for c in present if c.partial and not c.users]
    for copy in gone:
        shutil.rmtree(copy.path, ignore_errors=True)
    return gone


def clean(copies_dir: str) -> tuple[list[Copy], int, list[Copy]]:
    """``hpctorch stage clean``: every copy no live process uses, half copies of processes gone.
    What was removed, the bytes it held, and what was kept."""
    present = copies(copies_dir)
    gone = [c for c in present if not c.users]
    freed = sum(c.size() for c in gone)
    for copy in gone:
        shutil.rmtree(copy.path, ignore_errors=True)
    return gone, freed, [c for c in present if c.users]


def in_memory(copies_dir: str) -> bool:
    """Whether the copies live in memory (a tmpfs such as /dev/shm): they count against the
    node's RAM, the jobs' own."""
    return file_system_of(copies_dir) in MEMORY_FILE_SYSTEMS


def _users(copies_dir: str) -> dict[str, set[int]]:
    """Per key, the live processes whose markers say they run from it."""
    folder = os.path.join(copies_dir, USERS)
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found: dict[str, set[int]] = {}
    for name in names:
        key, _, pid = name.rpartition(".")
        if not (key and pid.isdigit()):
            continue
        if _alive(int(pid)):
            found.setdefault(key, set()).add(int(pid))
        else:
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass
    return found


def _alive(pid: int) -> bool:
    """A process with this pid runs, as this user (a pid another user got since is not ours)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def _mtime(path: str) -> float:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0

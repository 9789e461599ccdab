"""Node 0's hot set: what the jobs that ran from its copy of the environment read (their records,
``hotrecord``), for a pack that carries those files whole and the rest as links to the shared
path (``pack``): a node then holds what jobs import on its own disk and reads anything else
from the shared path on demand, through the link, as it would without staging.

Whatever the records say, a file the copy's mending rewrites is carried whole (``forced``): the
scripts in ``bin/``, ``pyvenv.cfg``, ``.pth`` files, and a library whose run path names a staged
folder (a link would leave it naming the shared path, so a library could be loaded twice); and
so is the source of every recorded bytecode file (Python checks it before using the bytecode).
Records are read from this node's own copy (a private folder: ``unpack``), each name checked to
stay inside the copy.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Sequence

from ..host.folders import why_unsafe
from . import runpath
from .hotrecord import RECORDS

MAX_NAMES = 1_000_000
"""Lines read from records at most: an environment has tens of thousands of files."""


def recorded(copy: str) -> frozenset[str]:
    """The names the records in the copy ``copy`` (``<copies>/<key>``) hold, or none."""
    folder = os.path.join(copy, RECORDS)
    if why_unsafe(copy) is not None or why_unsafe(folder) is not None:
        return frozenset()
    names: set[str] = set()
    for entry in sorted(os.listdir(folder)):
        try:
            fd = os.open(os.path.join(folder, entry), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            for line in handle:
                name = line.decode(errors="surrogateescape").rstrip("\n")
                if _inside(name):
                    names.add(name)
                if len(names) >= MAX_NAMES:
                    return frozenset(names)
    return frozenset(names)


def _inside(name: str) -> bool:
    parts = name.split("/")
    return len(parts) > 1 and parts[0].isdigit() and not any(p in ("", ".", "..") for p in parts)


def with_sources(names: Iterable[str]) -> frozenset[str]:
    """``names`` and the source of each bytecode file among them (``pkg/__pycache__/mod.cpython-311.pyc``
    -> ``pkg/mod.py``)."""
    every = set(names)
    for name in names:
        folder, _, file = name.rpartition("/")
        if file.endswith(".pyc") and folder.endswith("/__pycache__"):
            every.add(f"{folder[: -len('/__pycache__')]}/{file.split('.', 1)[0]}.py")
    return frozenset(every)


def digest(names: Iterable[str]) -> str:
    """A short name for one hot set: the pack made for it is kept under the key and this."""
    return hashlib.sha256("\n".join(sorted(names)).encode(errors="surrogateescape")).hexdigest()[:12]


def folders_of(names: Iterable[str]) -> frozenset[str]:
    """Every folder above a name (``0/a/b/c.py`` -> ``0``, ``0/a``, ``0/a/b``): those hold hot files."""
    every: set[str] = set()
    for name in names:
        parts = name.split("/")
        every.update("/".join(parts[:end]) for end in range(1, len(parts)))
    return frozenset(every)


def holds_forced(folder: str, name: str, roots: Sequence[str]) -> bool:
    """Whether the folder ``folder`` (named ``name``) holds a file ``forced`` carries whole: then it
    is no link, its other files are (a walk of it on node 0, once per pack)."""
    for inner, dirs, files in os.walk(folder):
        within = name + inner[len(folder):]
        if any(forced(f"{within}/{file}", os.path.join(inner, file), roots) for file in files):
            return True
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(inner, d))]
    return False


def forced(name: str, path: str, roots: Sequence[str]) -> bool:
    """Whether the file ``path`` (named ``name`` in the pack) is carried whole whatever the records say."""
    folder, _, file = name.rpartition("/")
    if folder.endswith("/bin") or (folder.isdigit() and file == "pyvenv.cfg") or file.endswith(".pth"):
        return True
    if file.endswith(".so") or ".so." in file:
        return runpath.names_inside(path, roots)
    return False

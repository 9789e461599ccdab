"""What ``--stage-env`` copies, and the key that names one state of it.

The workers' interpreter runs from its prefix (a venv, a conda env, a uv-managed or pyenv
Python); a venv's base interpreter comes too unless it is the operating system's (under /usr,
already on every node's own disk). Of a conda base only what its Python imports comes: not its
package cache or its other environments. The key hashes every file's path, size, mtime, ctime, inode
and mode (and each link's target): a file replaced with the same size and mtime (``cp -p``,
``rsync -a``, an edit within the same second) has another inode or ctime, so it changes the key;
an unchanged environment keeps its key, so node 0 packs it once and a node
reuses a copy an earlier job left.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import HpctorchError

SYSTEM_PREFIXES = ("/usr", "/usr/local", "/")
"""Interpreters installed with the operating system: on every node's own disk already."""
CONDA_ASIDE = ("pkgs", "envs", "conda-bld")
"""In a conda installation's base: its package cache, its other environments and its build
folder, often tens of GB that the environment being staged never imports."""


@dataclass(frozen=True)
class Source:
    """The folders to copy (real paths, none inside another), what in them is left out, and the
    interpreter to run from them."""

    roots: tuple[str, ...]
    python: str
    skip: tuple[str, ...] = ()


@dataclass(frozen=True)
class Key:
    digest: str
    files: int
    size: int


def source(extra: Sequence[str] = (), prefix: str = sys.prefix, base_prefix: str = sys.base_prefix,
           executable: str = sys.executable) -> Source:
    """The interpreter's prefix, its base when that is not the system's, and ``extra`` folders."""
    wanted = [prefix]
    if os.path.realpath(base_prefix) != os.path.realpath(prefix) and os.path.realpath(base_prefix) not in SYSTEM_PREFIXES:
        wanted.append(base_prefix)
    for path in extra:
        if not os.path.isdir(path):
            raise HpctorchError(f"--stage-env {path}: no such folder", "give a folder the workers import from, or drop it")
        wanted.append(path)
    roots: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted}, key=len):
        if path in SYSTEM_PREFIXES:
            raise HpctorchError(f"--stage-env: {path} is the system's own folder", "stage the job's environment (a venv or conda env) instead")
        if not any(path.startswith(root + "/") for root in roots):
            roots.append(path)
    # A venv that leaves out its base's site-packages never imports from there: not copied.
    skip: list[str] = []
    if len(roots) > 1 and _isolated_venv(prefix):
        import glob  # node 0's walk alone

        skip = sorted(glob.glob(os.path.join(os.path.realpath(base_prefix), "lib*", "python*", "site-packages")))
    kept = [os.path.realpath(p) for p in (prefix, *extra)]
    for root in roots:
        skip.extend(_conda_aside(root, kept))
    # The interpreter by the name it was started with (a venv's bin/python is a link whose own
    # folder holds pyvenv.cfg), in its folder's real path.
    python = os.path.join(os.path.realpath(os.path.dirname(executable)), os.path.basename(executable))
    return Source(tuple(roots), python, tuple(skip))


def _conda_aside(root: str, kept: Sequence[str]) -> list[str]:
    """What of a conda base (``conda-meta`` in it) the staged interpreter never imports: its
    package cache and build folder, and every environment in ``envs`` but one holding a ``kept``
    folder (the environment being staged, or a folder named with ``--stage-env=DIR``)."""
    if not os.path.isdir(os.path.join(root, "conda-meta")):
        return []

    def holds(folder: str) -> bool:
        return any(path == folder or path.startswith(folder + "/") for path in kept)

    aside: list[str] = []
    for name in CONDA_ASIDE:
        folder = os.path.join(root, name)
        if not os.path.isdir(folder) or os.path.islink(folder):
            continue
        if not holds(folder):
            aside.append(folder)
            continue
        aside.extend(path for path in sorted(os.path.join(folder, entry) for entry in os.listdir(folder)) if not holds(path))
    return aside


def _isolated_venv(prefix: str) -> bool:
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as handle:
            settings = dict(line.split("=", 1) for line in handle if "=" in line)
    except OSError:
        return False
    return {k.strip(): v.strip() for k, v in settings.items()}.get("include-system-site-packages", "false").lower() != "true"


def key(roots: Sequence[str], skip: Sequence[str] = ()) -> Key:
    """The key of the folders' present state, ``skip`` left out: a walk of stat calls, no file is read."""
    digest = hashlib.sha256()
    files = size = 0
    for index, root in enumerate(roots):
        digest.update(f"root {index} {root}\n".encode())
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if os.path.join(folder, d) not in skip)
            for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue  # gone while we walked: the copy will not have it either
                target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else ""
                digest.update(f"{os.path.relpath(path, root)}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ctime_ns}\0{info.st_ino}"
                              f"\0{info.st_mode}\0{target}\n"
                              .encode(errors="surrogateescape"))
                files += 1
                size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return Key(digest.hexdigest()[:24], files, size)

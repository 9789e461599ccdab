"""Node 0's pack of the environment: one tar of every staged folder (``<index>/<path>``), its size
and SHA-256, kept on node 0's own disk under the environment's key so that an unchanged
environment is read from the shared file system once, not once per job. A pack for a hot set
(``hotset``) carries those files whole and every other file, or every folder holding none of
them, as a link to its original on the shared path; it is kept under the key and the set's digest."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..host.folders import create_private_file, private_dir, replace_file, sweep
from . import hotset

CHUNK = 1 << 20
KEEP_S = 7 * 86400.0
"""Packs and copies unused for this long are removed by the next job on that node."""


def amount(size: int) -> str:
    """``size`` bytes for a person: GiB for an environment, MiB for a small one."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


@dataclass(frozen=True)
class Pack:
    path: str
    size: int
    digest: str
    linked: int = 0
    """Files and folders carried as links to the shared path (a hot set's pack)."""

    def chunks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                yield chunk


class _Hashing:
    """A file that hashes and counts what is written through it."""

    def __init__(self, fd: int) -> None:
        self.file = os.fdopen(fd, "wb")
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.file.write(data)


def pack(roots: Sequence[str], key: str, stage_base: str, skip: Sequence[str] = (), hot: frozenset[str] | None = None) -> Pack:
    """The pack of ``roots`` (``skip`` left out) under ``key`` in ``stage_base``/packs: the kept
    one, else made now. With ``hot`` (names in the pack), only those files and what ``hotset``
    forces are carried whole, the others as links to their originals."""
    folder = private_dir(os.path.join(stage_base, "packs"))
    path = os.path.join(folder, _name(key, hot))
    kept = _kept(path)
    if kept is not None:
        for used in (path, f"{path[:-4]}.json"):  # both stay clear of the sweep while jobs use them
            os.utime(used)
        return kept
    sweep(folder, (".tar", ".json", ".tmp"), KEEP_S)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.remove(temporary)
    except FileNotFoundError:
        pass
    out = _Hashing(create_private_file(temporary))
    linked = [0]
    holding = hotset.folders_of(hot) if hot is not None else frozenset()

    def cold(name: str, original: str, folder: bool = False) -> bool:
        """A file, or a whole folder, carried as a link: none of the hot set is in it, nothing forced."""
        if hot is None or name in hot:
            return False
        if folder:
            if name in holding or any(p == original or p.startswith(original + "/") for p in skip) or hotset.holds_forced(original, name, roots):
                return False
        elif hotset.forced(name, original, roots):
            return False
        linked[0] += 1
        return True

    try:
        # Links stay links (a venv's bin/python); the receiver points those into a staged folder at its copy.
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for index, root in enumerate(roots):
                _add_tree(tar, root, str(index), [path for path in skip if path.startswith(root + "/")], cold)
        out.file.close()
    except BaseException:
        out.file.close()
        os.remove(temporary)
        raise
    made = Pack(path, out.size, out.hash.hexdigest(), linked[0])
    os.replace(temporary, path)
    replace_file(f"{path[:-4]}.json", json.dumps({"size": made.size, "digest": made.digest, "linked": made.linked, "made": time.time()}))
    return made


def _name(key: str, hot: frozenset[str] | None) -> str:
    return f"{key}.tar" if hot is None else f"{key}-hot-{hotset.digest(hot)}.tar"


def _add_tree(tar: tarfile.TarFile, root: str, arcname: str, skip: Sequence[str], cold: Callable[..., bool]) -> None:
    """``root`` into ``tar`` under ``arcname`` (``skip`` left out), as ``tar.add`` would, but from a
    live environment: a file gone between the listing and its turn (Python replaces a .pyc by a
    rename) is left out instead of failing the pack, and a file is read from the descriptor its
    entry was made from (a file replaced meanwhile is packed whole, as it was when opened). A
    file or folder ``cold`` says of is a link to itself on the shared path (a folder's link is
    one entry, not one per file: a node makes each link on its disk, a block each)."""
    for folder, dirs, names in os.walk(root):
        if folder in skip:
            dirs[:] = []
            continue
        relative = os.path.relpath(folder, root)
        here = arcname if relative == "." else os.path.join(arcname, relative)
        _add_one(tar, folder, here)
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # links stay links: never walked into
        linked = [d for d in dirs if d not in links and cold(os.path.join(here, d), os.path.join(folder, d), True)]
        for name in sorted(linked):
            _link(tar, os.path.join(folder, name), os.path.join(here, name))
        dirs[:] = sorted(d for d in dirs if d not in links and d not in linked)
        for name in sorted(names + links):
            path = os.path.join(folder, name)
            if path not in skip:
                _add_one(tar, path, os.path.join(here, name), cold)


def _link(tar: tarfile.TarFile, path: str, arcname: str) -> None:
    """``arcname`` as a link to ``path``, its original: the receiver leaves such a link as it is
    (``relocate``), and reads through it on demand."""
    try:
        mtime = os.lstat(path).st_mtime
    except FileNotFoundError:
        return
    link = tarfile.TarInfo(arcname)
    link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, path, 0o777, int(mtime)
    tar.addfile(link)


def _add_one(tar: tarfile.TarFile, path: str, arcname: str, cold: Callable[..., bool] = lambda _n, _p: False) -> None:
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and cold(arcname, path):
            _link(tar, path, arcname)
        elif stat.S_ISREG(info.st_mode):
            with open(path, "rb") as handle:
                tar.addfile(_whole_seconds(tar.gettarinfo(arcname=arcname, fileobj=handle)), handle)
        elif (info := tar.gettarinfo(path, arcname)) is not None:  # None: a socket, which tar.add skips too
            tar.addfile(_whole_seconds(info))
    except FileNotFoundError:
        return  # gone while packing: the copy lacks it, as the environment now does


def _whole_seconds(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A float mtime costs every member an extended (pax) header, which every node then parses;
    the whole second is what a .pyc records of its source (so the copy's caches stay valid)."""
    info.mtime = int(info.mtime)
    return info


def is_kept(key: str, stage_base: str, hot: frozenset[str] | None = None) -> bool:
    """Whether node 0 has the pack of ``key`` (for ``hot``) already (no folder is made to find out)."""
    return _kept(os.path.join(stage_base, "packs", _name(key, hot))) is not None


def _kept(path: str) -> Pack | None:
    try:
        with open(f"{path[:-4]}.json", encoding="utf-8") as handle:
            meta = json.load(handle)
        if os.lstat(path).st_size == meta["size"]:
            return Pack(path, int(meta["size"]), str(meta["digest"]), int(meta.get("linked", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None

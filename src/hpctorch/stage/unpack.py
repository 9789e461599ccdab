"""A node's copy: the pack's bytes, as they arrive, extracted into a folder of its own (0700),
hashed and counted; checked against node 0's size and SHA-256, mended for its place, and only
then renamed to its key's name, so a half copy is never used. A copy of the same key left by an
earlier job on this node is used as it is."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from ..host.folders import private_dir, replace_file, why_unsafe
from . import inventory
from .hotrecord import RECORDS
from .inventory import MARK
from .pack import CHUNK, amount
from .relocate import link_libpython, relocate

SPARE_BYTES = 64 << 20


class UnpackError(Exception):
    """The copy could not be made; the message says why."""


def final_paths(base: str, key: str, roots: Iterable[str]) -> dict[str, str]:
    """Each original folder's copy: ``<base>/<key>/<index>``."""
    return {root: os.path.join(base, key, str(index)) for index, root in enumerate(roots)}


def ready(base: str, key: str) -> bool:
    """A finished copy of ``key`` is here (and is ours); it is marked used now."""
    folder = os.path.join(base, key)
    mark = os.path.join(folder, MARK)
    if not os.path.isfile(mark) or why_unsafe(folder) is not None:
        return False
    os.utime(mark)
    os.utime(folder)
    return True


class _Reader(io.RawIOBase):
    """The pack's chunks as a file that tarfile reads, each chunk seen by ``on_chunk`` first."""

    def __init__(self, chunks: Iterator[bytes], on_chunk: Callable[[bytes], None]) -> None:
        self.chunks = chunks
        self.on_chunk = on_chunk
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        if not self.pending:
            chunk = next(self.chunks, b"")
            if not chunk:
                return 0
            self.on_chunk(chunk)
            self.pending = memoryview(chunk)
        count = min(len(buffer), len(self.pending))
        buffer[:count] = self.pending[:count]
        self.pending = self.pending[count:]
        return count


def receive(chunks: Iterable[bytes], base: str, key: str, roots: Iterable[str], size: int, digest: str) -> None:
    """Extract the pack's ``size`` bytes from ``chunks`` as ``<base>/<key>``, once their count and
    SHA-256 are node 0's."""
    hashed = hashlib.sha256()
    count = 0

    def seen(chunk: bytes) -> None:
        nonlocal count
        hashed.update(chunk)
        count += len(chunk)

    reader = _Reader(iter(chunks), seen)
    free = shutil.disk_usage(base).free
    if free < size + SPARE_BYTES:
        raise UnpackError(f"no space for the environment in {base}: it needs {amount(size)}, {amount(free)} free")
    inventory.prune(base)  # copies no process uses beyond the few used last, half copies of jobs gone
    temporary = inventory.half_copy(base, key, os.getpid())
    shutil.rmtree(temporary, ignore_errors=True)
    private_dir(temporary)
    try:
        with tarfile.open(fileobj=io.BufferedReader(reader, CHUNK), mode="r|") as tar:  # type: ignore[call-overload]
            _extract(tar, temporary)
        while reader.read(CHUNK):  # the tar's end padding
            pass
        _check(count, size, hashed.hexdigest(), digest)
        copies = final_paths(base, key, roots)
        relocate(copies, temporary)
        link_libpython(copies, temporary)
        os.mkdir(os.path.join(temporary, RECORDS), 0o700)  # what the workers read of this copy (hotrecord)
        replace_file(os.path.join(temporary, MARK), json.dumps({"key": key, "roots": copies, "made": time.time()}))
        try:
            os.rename(temporary, os.path.join(base, key))
        except OSError:
            if not ready(base, key):  # another job on this node finished the same copy first: theirs serves
                raise
    except (tarfile.TarError, KeyError) as exc:  # KeyError: a hard link to a member the pack lacks
        raise UnpackError(f"the pack could not be read after {count} of {size} bytes ({exc})") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _extract(tar: tarfile.TarFile, folder: str) -> None:
    """Every member into ``folder``, none outside it, by the "tar" filter's rules checked on the
    names alone: a pack is one stream into a new folder, so a path can only leave it through ``..``
    or through a link the stream made. tarfile's own filter resolves every member's path on disk
    (a dozen lstat calls each: 1.6 million for a 2 GiB environment, a third of the unpack's CPU)."""
    links: set[str] = set()
    trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}  # checked here; 3.14's default would refuse links out
    for member in tar:
        extract_checked(tar, member, folder, links, trusted)


def extract_checked(tar: tarfile.TarFile, member: tarfile.TarInfo, folder: str, links: set[str],
                    trusted: Mapping[str, str]) -> None:
    """``member`` into ``folder`` under the "tar" filter's rules: no absolute name or ``..``, no path
    through (or onto) a symbolic link extracted before (``links``, updated), no hard link to such a
    path or outside, no device; setuid, setgid, sticky and group/other write bits cleared."""
    name = _within(member.name, links, "member")
    if member.islnk():
        _within(member.linkname, links, f"hard link {member.name!r}'s target")
    if member.ischr() or member.isblk():
        raise UnpackError(f"the pack holds a device file {member.name!r}")
    if member.issym():
        links.add(name)
    member.mode &= ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
    tar.extract(member, folder, set_attrs=not member.issym(), **trusted)  # type: ignore[arg-type]


def _within(path: str, links: set[str], what: str) -> str:
    """``path`` as a relative name that stays inside the copy, or UnpackError."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if path.startswith("/") or ".." in parts or not parts:
        raise UnpackError(f"the pack's {what} {path!r} would land outside the copy")
    name = ""
    for part in parts:  # the name and each folder above it
        name = f"{name}/{part}" if name else part
        if name in links:
            raise UnpackError(f"the pack's {what} {path!r} goes through the link {name!r}")
    return name


def copies_of(base: str, key: str) -> Mapping[str, str]:
    """The original folders and their copies, as the finished copy's mark says."""
    with open(os.path.join(base, key, MARK), encoding="utf-8") as handle:
        return dict(json.load(handle)["roots"])


def _check(count: int, size: int, got: str, digest: str) -> None:
    if count != size:
        raise UnpackError(f"received {count} of {size} bytes")
    if got != digest:
        raise UnpackError(f"the pack's SHA-256 is {got[:16]}..., node 0 sent {digest[:16]}...")

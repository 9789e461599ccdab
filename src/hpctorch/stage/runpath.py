"""The run paths of a copy's programs and libraries, made relative to where they lie.

An interpreter built with a shared libpython (pyenv, a source build) names its library folder
by an absolute RUNPATH: the copy's ``bin/python`` and every extension in ``lib-dynload`` would
look for libpython, libc, libssl... on the shared path first, some 30 failed lookups per process
before the system's. Where an entry names a folder inside a staged root, it is rewritten in place
to ``$ORIGIN/<the way there>`` (padded with NULs: a string in ``.dynstr`` can shrink, never
grow), as conda does with binary prefixes. Anything this does not understand is left as it is:
64-bit little-endian ELF only, an entry that would grow, a string another entry shares.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator, Mapping, Sequence

from ..staged import map_with

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
HEADER = 64
MAX_DYNAMIC = 1 << 16
"""A dynamic section is a few hundred bytes: a bigger one is not what this reads."""


def _strings(fd: int) -> tuple[list[tuple[int, int]], dict[int, int]] | None:
    """Where the file's run path strings are: ([(file offset, tag)], {file offset: tag} of every
    dynamic entry naming a string), or None when it is no 64-bit little-endian ELF with one."""
    head = os.pread(fd, HEADER, 0)
    if len(head) < HEADER or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", head, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    table = os.pread(fd, phentsize * phnum, phoff)
    if phentsize < 56 or len(table) < phentsize * phnum:
        return None
    loads, dynamic = [], None
    for index in range(phnum):
        kind, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", table, index * phentsize)
        if kind == PT_LOAD:
            loads.append((vaddr, filesz, offset))
        elif kind == PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None or dynamic[1] > MAX_DYNAMIC:
        return None
    entries = os.pread(fd, dynamic[1], dynamic[0])
    named: list[tuple[int, int]] = []
    strtab = None
    for at in range(0, len(entries) - 15, 16):
        tag, value = struct.unpack_from("<qQ", entries, at)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
            named.append((tag, value))
    if strtab is None:
        return None
    base = next((strtab - vaddr + offset for vaddr, size, offset in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        return None
    every = {base + value: tag for tag, value in named}
    return [(at, tag) for at, tag in every.items() if tag in (DT_RPATH, DT_RUNPATH)], every


def _read_string(fd: int, at: int) -> bytes:
    data = os.pread(fd, 4096, at)
    end = data.find(b"\0")
    return data[:end] if end >= 0 else b""


def relative(value: str, where: str, copies: Mapping[str, str]) -> str:
    """A run path for the file finally at ``where``: each entry inside a staged folder as the way
    from ``where``'s folder to its copy (``$ORIGIN/...``), the others as they were."""
    parts = []
    for entry in value.split(":"):
        moved = map_with(copies, os.path.normpath(entry)) if os.path.isabs(entry) else entry
        if moved == entry or not os.path.isabs(entry):
            parts.append(entry)
            continue
        way = os.path.relpath(moved, os.path.dirname(where))
        parts.append("$ORIGIN" if way == "." else f"$ORIGIN/{way}")
    return ":".join(parts)


def names_inside(path: str, roots: Sequence[str]) -> bool:
    """Whether the program or library ``path`` has a run path entry inside one of ``roots`` (read,
    never changed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        found = _strings(fd)
        entries = [entry for at, _tag in (found[0] if found else []) for entry in os.fsdecode(_read_string(fd, at)).split(":")]
    except (OSError, struct.error):
        return False
    finally:
        os.close(fd)
    inside = [root.rstrip("/") + "/" for root in roots]
    return any(os.path.isabs(entry) and (os.path.normpath(entry) + "/").startswith(tuple(inside)) for entry in entries)


def rewrite(path: str, where: str, copies: Mapping[str, str]) -> bool:
    """Make ``path``'s run paths (the file finally at ``where``) relative; whether it changed."""
    try:
        mode = os.lstat(path).st_mode
        if not mode & stat.S_IWUSR:  # a read-only library in the pack: this copy is ours to mend
            os.chmod(path, mode | stat.S_IWUSR)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        finally:
            if not mode & stat.S_IWUSR:
                os.chmod(path, mode)
    except OSError:
        return False
    try:
        found = _strings(fd)
        if found is None:
            return False
        paths, every = found
        changed = False
        for at, _tag in paths:
            old = _read_string(fd, at)
            new = relative(os.fsdecode(old), where, copies).encode()
            shared = any(at < other < at + len(old) + 1 for other in every)  # another entry's string inside this one
            if new == old or len(new) > len(old) or shared:
                continue
            os.pwrite(fd, new + b"\0" * (len(old) - len(new)), at)
            changed = True
        return changed
    except (OSError, struct.error):
        return False
    finally:
        os.close(fd)


def candidates(here: str) -> Iterator[str]:
    """The files of a copy that may be programs or libraries: ``bin/``'s, and shared objects."""
    for folder, _dirs, names in os.walk(here):
        in_bin = os.path.basename(folder) == "bin"
        for name in names:
            if in_bin or name.endswith(".so") or ".so." in name:
                path = os.path.join(folder, name)
                if not os.path.islink(path):
                    yield path

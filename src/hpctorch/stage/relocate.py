"""Mend a copy of an environment for its new place, as conda-pack and ``venv --upgrade`` do:
links that point into a staged folder point at its copy, a venv's ``pyvenv.cfg`` names the
staged base interpreter, the scripts in ``bin/`` (shebangs, ``activate``) and the ``.pth``
files name the copy, and programs' and libraries' run paths into a staged folder are relative
(``runpath``). Paths outside the staged folders (an editable install's project, the
system's libraries) are left as they are: the project being developed stays where it is."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..staged import map_with
from . import runpath

TEXT_LIMIT = 1 << 20
"""Scripts are small; a bigger file in bin/ is a program, never rewritten."""


def relocate(copies: Mapping[str, str], top: str) -> int:
    """Mend every copy in ``copies`` (original folder -> its final path), which still lie under
    ``top`` at ``<top>/<basename of the final path>``; returns how many files changed."""
    pattern = _pattern(copies)
    changed = 0
    for original, final in copies.items():
        here = os.path.join(top, os.path.basename(final))
        changed += _links(here, copies, original)
        changed += _rewrite(os.path.join(here, "pyvenv.cfg"), pattern, copies)
        bin_dir = os.path.join(here, "bin")
        if os.path.isdir(bin_dir) and not os.path.islink(bin_dir):
            for entry in os.scandir(bin_dir):
                if entry.is_file(follow_symlinks=False):
                    changed += _rewrite(entry.path, pattern, copies)
        for folder, _dirs, names in os.walk(here):
            if folder.endswith("-packages"):  # site-packages, dist-packages
                for name in names:
                    if name.endswith(".pth"):
                        changed += _rewrite(os.path.join(folder, name), pattern, copies)
        for path in runpath.candidates(here):
            changed += runpath.rewrite(path, os.path.join(final, os.path.relpath(path, here)), copies)
    return changed


def libpython_folder(final: str) -> str:
    """Where the links to the copy ``final``'s libpython lie, beside it: ``LD_LIBRARY_PATH``
    names this folder, not the copy's whole ``lib/``, so the programs the workers start (git,
    ssh) never load the environment's own libssl or libstdc++ (a conda env holds both)."""
    return os.path.join(os.path.dirname(final), f"{os.path.basename(final)}.libpython")


def link_libpython(copies: Mapping[str, str], top: str) -> None:
    """For each copy in ``copies`` (still under ``top``) whose ``lib/`` holds a libpython (a Python
    built with --enable-shared, found by its RUNPATH on the shared path), links to it alone."""
    for final in copies.values():
        name = os.path.basename(final)
        try:
            found = sorted(n for n in os.listdir(os.path.join(top, name, "lib")) if n.startswith("libpython") and ".so" in n)
        except OSError:
            continue
        if found:
            folder = libpython_folder(os.path.join(top, name))
            os.mkdir(folder, 0o700)
            for library in found:  # relative: they hold after the copy is renamed to its key
                os.symlink(os.path.join("..", name, "lib", library), os.path.join(folder, library))


def _pattern(copies: Mapping[str, str]) -> re.Pattern[bytes]:
    # An original folder as a whole path component: /env matches /env/bin, never /env2.
    names = sorted(copies, key=len, reverse=True)
    return re.compile(b"(" + b"|".join(re.escape(os.fsencode(n)) for n in names) + rb")(?=[/'\"\s:;]|$)", re.MULTILINE)


def _links(here: str, copies: Mapping[str, str], original: str) -> int:
    """Links into a staged folder point at its copy, but a link to its own original (a hot set's
    pack: a file the jobs did not read) stays on the shared path."""
    changed = 0
    for folder, dirs, names in os.walk(here):
        for name in names + dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            if target == original + path[len(here):]:
                continue
            moved = map_with(copies, target) if os.path.isabs(target) else target
            if moved != target:
                os.remove(path)
                os.symlink(moved, path)
                changed += 1
    return changed


def _rewrite(path: str, pattern: re.Pattern[bytes], copies: Mapping[str, str]) -> int:
    try:
        if os.path.islink(path) or os.path.getsize(path) > TEXT_LIMIT:
            return 0
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return 0
    if b"\0" in data[:8192]:
        return 0  # a program, not a script
    lookup = {os.fsencode(k): os.fsencode(v) for k, v in copies.items()}
    mended = pattern.sub(lambda m: lookup[m.group(1)], data)
    if mended == data:
        return 0
    mode = os.stat(path).st_mode
    with open(path, "wb") as handle:
        handle.write(mended)
    os.chmod(path, mode)
    return 1

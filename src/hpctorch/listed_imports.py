"""Imports from folders listed once, for a node's start before its staged copy exists
(``--stage-env``): then every module hpctorch imports comes from the shared file system, and
Python's own finder asks it ~4 times a module (the folder's stat, the source's two, the cached
bytecode's open). Here each folder is listed once, a module of the interpreter's own library is
its cached bytecode's one open (that library is the interpreter's install, not edited in place),
and any other module its source's stat and its bytecode's open (Python's own check, kept).

It takes the place of Python's path finder in ``sys.meta_path`` and places a module exactly as
that would, or asks it (a zip on the path, a namespace package, a folder it cannot list); a name
no listed folder has is not found, without Python's walk of every folder again (``try: from nt
import ...`` in the library). ``uninstall`` once the copy exists: from then on the copy's paths
are imported the usual way.
"""

# No "from __future__ import annotations": that is one more import from the shared path.
import importlib.machinery as machinery
import marshal
import os
import sys
from importlib import _bootstrap_external  # type: ignore[attr-defined]  # what importlib.util re-exports, without its imports

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

_EXTENSIONS = tuple(machinery.EXTENSION_SUFFIXES)
_UNSURE = object()


class _Listing:
    __slots__ = ("files", "folders")

    def __init__(self, files: set[str], folders: set[str]) -> None:
        self.files, self.folders = files, folders


class _Bytecode(machinery.SourceFileLoader):
    """A library module's cached bytecode taken as it is (one open); Python's own check when it
    is not this interpreter's."""

    def __init__(self, fullname: str, path: str, cached: str) -> None:
        super().__init__(fullname, path)
        self.cached = cached

    def get_code(self, fullname: str):  # type: ignore[no-untyped-def]
        try:
            data = self.get_data(self.cached)
        except OSError:
            data = b""
        if data[:4] == _bootstrap_external.MAGIC_NUMBER:
            try:
                return marshal.loads(memoryview(data)[16:])  # after the magic, flags and source stamp
            except (EOFError, ValueError, TypeError):
                pass
        return super().get_code(fullname)


class ListedFinder:
    """A meta path finder in the place of Python's path finder, placing modules from listings."""

    def __init__(self, library: str) -> None:
        self._listings: dict[str, _Listing | None | object] = {}
        self._library = library.rstrip("/") + "/"
        # Beyond zipimport's and FileFinder's, a hook may serve a path entry that is no folder.
        self._other_hooks = len(sys.path_hooks) > 2

    def _listing(self, folder: str):  # type: ignore[no-untyped-def]
        """The folder's files and subfolders; None where there is no folder; _UNSURE where it
        is something else (a zip archive) or cannot be read."""
        if folder not in self._listings:
            try:
                files, folders = set(), set()
                with os.scandir(folder or ".") as entries:
                    for entry in entries:
                        (folders if entry.is_dir() else files).add(entry.name)
                self._listings[folder] = _Listing(files, folders)
            except FileNotFoundError:
                self._listings[folder] = None
            except OSError:
                self._listings[folder] = _UNSURE
        return self._listings[folder]

    def _trusted(self, folder: str) -> bool:
        """In the interpreter's library, not the packages installed under it."""
        if not (folder + "/").startswith(self._library):
            return False
        return folder[len(self._library):].split("/", 1)[0] not in ("site-packages", "dist-packages")

    def _source(self, fullname: str, folder: str, name: str, package: str | None):  # type: ignore[no-untyped-def]
        source = os.path.join(folder, name + ".py")
        loader = machinery.SourceFileLoader(fullname, source)
        if self._trusted(folder):
            cached = _bootstrap_external.cache_from_source(source)
            cache = self._listing(os.path.dirname(cached))
            if isinstance(cache, _Listing) and os.path.basename(cached) in cache.files:
                loader = _Bytecode(fullname, source, cached)
        return _spec(fullname, loader, source, package)

    def _find_in(self, fullname: str, folder: str, tail: str):  # type: ignore[no-untyped-def]
        """The spec of ``tail`` in ``folder``, None where it is not there, _UNSURE where Python's
        finder must decide (the order of Python's FileFinder: package, extension, source)."""
        listing = self._listing(folder)
        if listing is None:
            return None
        if listing is _UNSURE:
            return _UNSURE
        assert isinstance(listing, _Listing)
        if tail in listing.folders:
            package = os.path.join(folder, tail)
            inner = self._listing(package)
            if not isinstance(inner, _Listing):
                return _UNSURE
            if "__init__.py" in inner.files and not any("__init__" + suffix in inner.files for suffix in _EXTENSIONS):
                return self._source(fullname, package, "__init__", package)
            return _UNSURE  # an extension package, or a namespace package's portion: Python decides
        for suffix in _EXTENSIONS:
            if tail + suffix in listing.files:
                path = os.path.join(folder, tail + suffix)
                return _spec(fullname, machinery.ExtensionFileLoader(fullname, path), path, None)
        if tail + ".py" in listing.files:
            return self._source(fullname, folder, tail, None)
        if tail + ".pyc" in listing.files:
            return _UNSURE
        return None

    def find_spec(self, fullname: str, path: "Sequence[str] | None" = None, target: object = None):  # type: ignore[no-untyped-def]
        found = self._placed(fullname, path)
        if found is _UNSURE:
            return machinery.PathFinder.find_spec(fullname, path, target)  # type: ignore[arg-type]
        return found

    def _placed(self, fullname: str, path: "Sequence[str] | None"):  # type: ignore[no-untyped-def]
        """The spec, None where no folder has the name (Python's finder would walk them all again,
        a stat each: ``try: from nt import ...`` in the library), or _UNSURE."""
        tail = fullname.rpartition(".")[2]
        for folder in sys.path if path is None else path:
            if not isinstance(folder, str):
                return _UNSURE
            finder = sys.path_importer_cache.get(folder)
            if finder is not None and not isinstance(finder, machinery.FileFinder):
                return _UNSURE  # an entry served by another finder (a zip, an editable install's hook)
            found = self._find_in(fullname, folder, tail)
            if found is None and self._other_hooks and self._listing(folder) is None:
                return _UNSURE
            if found is not None:
                return found
        return None

    def invalidate_caches(self) -> None:
        self._listings.clear()
        machinery.PathFinder.invalidate_caches()


def _spec(fullname: str, loader: object, path: str, package: str | None) -> machinery.ModuleSpec:
    spec = machinery.ModuleSpec(fullname, loader, origin=path, is_package=package is not None)
    spec.has_location = True  # so __file__ and __cached__ are set, as Python's finder sets them
    if package is not None:
        spec.submodule_search_locations = [package]
    return spec


def _library() -> str | None:
    """The folder of the interpreter's own library (the stdlib)."""
    folder = getattr(sys, "_stdlib_dir", None) or os.path.dirname(getattr(os, "__file__", "") or "")
    return folder or None


def install() -> None:
    """This finder in the place of Python's path finder, which it asks where it cannot decide."""
    library = _library()
    if library is None or machinery.PathFinder not in sys.meta_path:
        return
    sys.meta_path[sys.meta_path.index(machinery.PathFinder)] = ListedFinder(library)


def uninstall() -> None:
    """Python's path finder back in its place."""
    sys.meta_path[:] = [machinery.PathFinder if isinstance(f, ListedFinder) else f for f in sys.meta_path]


def wanted(argv: "Sequence[str]") -> bool:
    """``hpctorch run --stage-env ...``: the start that precedes a copy."""
    return len(argv) > 1 and argv[1] == "run" and any(a == "--stage-env" or a.startswith("--stage-env=") for a in argv[2:])

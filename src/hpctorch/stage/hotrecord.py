"""A worker's record of what it reads from its node's copy of the environment (``--stage-env``):
the hot set that node 0's later packs carry whole, the rest as links to the shared path
(``hotset``).

A worker whose copy has a records folder (``<copy>/.hot``, made with the copy) and fewer than
``MAX_RECORDS`` records in it writes one: every file of the copy it opens (Python's ``open``
audit event: sources, bytecode, data files) and every file of the copy mapped into it
(``/proc/self/maps``: the interpreter, libpython, extensions and the libraries they load, which
no audit event names), as names relative to the copy (``<root index>/<path>``, the pack's own
names), one line each, appended as first seen: a worker that ends with ``os._exit`` has
written all it read. It records the modules imported before it ran (Python's own start) too, and
stops after ``RECORD_S``: start-up is what a copy is for. An audit hook stays for the process's
life; past that time it returns at its first comparison.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping

RECORDS = ".hot"
"""In a copy's folder (``<copies>/<key>/``), beside each root's copy and its mark."""
MAX_RECORDS = 16
"""Records a copy keeps: the set stops growing once the jobs' start-up has been seen this often."""
RECORD_S = 300.0
MAPS_EVERY_S = 1.0
MAPS_AT_S = (2.0, 10.0, 30.0, 120.0, RECORD_S)
"""When a thread of the recorder reads the mappings, besides the audit events' reads."""


class Recorder:
    """Names of the copy's files (``top``/<index>/...) as first seen, appended to ``fd``."""

    def __init__(self, top: str, fd: int) -> None:
        self.top = top.rstrip("/") + "/"
        self.fd = fd
        self.seen: set[str] = set()
        self.started = time.monotonic()
        self.mapped_at = 0.0
        self.lock = threading.Lock()

    def note(self, path: str) -> None:
        if not path.startswith(self.top):
            return
        name = os.path.normpath(path[len(self.top):])
        if name in self.seen or not name[:1].isdigit() or name.startswith(".."):
            return
        with self.lock:
            if name in self.seen:
                return
            self.seen.add(name)
            try:
                os.write(self.fd, (name + "\n").encode(errors="surrogateescape"))
            except OSError:
                pass  # a full disk: the record is short, the set smaller, nothing breaks

    def maps(self) -> None:
        """The copy's files mapped into this process (the dynamic loader opens them unaudited)."""
        self.mapped_at = time.monotonic()
        try:
            with open("/proc/self/maps", "rb") as handle:
                lines = handle.read().decode(errors="surrogateescape").splitlines()
        except OSError:
            return
        for line in lines:
            where = line.find(" /")
            if where > 0:
                self.note(line[where + 1:].removesuffix(" (deleted)"))

    def modules(self) -> None:
        """What Python imported before the recorder was there (its own start, site, the worker entry)."""
        for module in list(sys.modules.values()):
            for attribute in ("__file__", "__cached__"):
                value = getattr(module, attribute, None)
                if isinstance(value, str):
                    self.note(value)

    def hook(self, event: str, args: tuple) -> None:
        if event != "open" and event != "import" and event != "ctypes.dlopen":
            return
        now = time.monotonic()
        if now - self.started > RECORD_S:
            return
        if event == "open" and isinstance(args[0], str):
            self.note(args[0])
        if now - self.mapped_at > MAPS_EVERY_S and event != "open":
            self.maps()

    def later(self) -> None:
        for at in MAPS_AT_S:
            time.sleep(max(0.0, self.started + at - time.monotonic()))
            self.maps()


def _free_slot(folder: str) -> int | None:
    """The first of the ``MAX_RECORDS`` record files nobody took, made and opened here (O_EXCL: the
    ranks of a node starting at once never take one twice, nor more than there are), or None."""
    for slot in range(MAX_RECORDS):
        try:
            return os.open(os.path.join(folder, f"record-{slot:02d}"),
                           os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


def install(env: Mapping[str, str] | None = None) -> Recorder | None:
    """In a worker running from a copy whose records folder has room: start recording."""
    from .. import staged

    data = staged._read(env)
    folder = data.get("records") if data else None
    if not isinstance(folder, str) or not folder:
        return None
    fd = _free_slot(folder)
    if fd is None:
        return None
    recorder = Recorder(os.path.dirname(folder), fd)
    recorder.modules()
    recorder.maps()
    sys.addaudithook(recorder.hook)
    threading.Thread(target=recorder.later, name="hpctorch-hot-record", daemon=True).start()
    return recorder

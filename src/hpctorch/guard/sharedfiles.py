"""Records in a directory all nodes share, one file per node, kept alive by a beat, with
O(1) file-system work per node however many nodes there are.

- Each node writes its own file: its record atomically (write, then rename: a new inode) when
  the record changes, and otherwise a beat at most once per ``interval``, which only moves the
  file's modification time (one ``utime``, no data).
- A node other than 0 reads one file, node 0's, at most once per interval: what node 0 says
  for everyone (the agreement's verdict, the doctor's go and exit) is in it.
- Node 0 alone reads the others' files: one directory scan per look, a file read only when its
  inode changed (a new record), a ``stat`` only for peers not yet seen beating. While nothing
  changes and everyone beats, it looks less often, up to ``MAX_SCAN_S`` apart.

A record counts once its file was seen to change (its time moved or it was replaced) since
the first look, so files left by an earlier run of the same job are never read as this run's.
On 10,000 nodes that is 10,000 utimes and 9,999 small reads a second on the shared file system
in all, instead of 10^8 reads a second (every node reading every file).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from ..host.folders import private_dir, replace_file

INTERVAL_S = 1.0
MAX_SCAN_S = 8.0
"""Node 0's longest pause between two looks at the directory while nothing changes."""


class BeatingFiles:
    def __init__(self, directory: str | None, node: int, record: Mapping[str, object], interval_s: float = INTERVAL_S) -> None:
        self.directory = Path(directory) if directory else None
        self.node = node
        self.record = dict(record)
        self.interval_s = interval_s
        self._last_write = self._last_read = float("-inf")
        self._scan_s = interval_s
        self._written = False
        self.beat = 0
        """Times this node wrote or touched its file."""
        self.operations = 0
        """File-system calls this node made (the scale benchmark and the tests read it)."""
        self._first: dict[int, tuple[int, int]] = {}
        self._read_inode: dict[int, int] = {}
        self._beating: set[int] = set()
        self._records: dict[int, dict[str, object]] = {}
        self.live: dict[int, dict[str, object]] = {}
        """The latest record of every peer seen alive (node 0: every node; the others: node 0)."""

    @property
    def path(self) -> Path | None:
        return self.directory / f"node{self.node}.json" if self.directory else None

    def publish(self, **update: object) -> None:
        """Merge ``update`` into this node's record and write it at once when it changed;
        else beat, when ``interval_s`` has passed since the last write or beat."""
        changed = any(self.record.get(k) != v for k, v in update.items())
        self.record.update(update)
        now = time.monotonic()
        if self.path is None or (self._written and not changed and now - self._last_write < self.interval_s):
            return
        self._last_write = now
        self.beat += 1
        try:
            if not self._written:  # <shared>/.hpctorch/<key>.X: both ours alone (HpctorchError if not)
                private_dir(str(self.path.parent.parent))
                private_dir(str(self.path.parent))
                self.operations += 2
            if changed or not self._written:
                replace_file(str(self.path), json.dumps({**self.record, "node": self.node}))
                self.operations += 2
                self._written = True
            else:
                os.utime(self.path)
                self.operations += 1
        except OSError:
            self.directory = None  # not writable here: the caller's other channel remains

    def read_live(self) -> dict[int, dict[str, object]]:
        now = time.monotonic()
        pause = self._scan_s if self.node == 0 else self.interval_s
        if self.directory is None or now - self._last_read < pause:
            return self.live
        self._last_read = now
        changed = self._scan() if self.node == 0 else self._look(0, self.directory / "node0.json")
        if self.node == 0:  # nothing new and everyone seen beating: look less often
            self._scan_s = self.interval_s if changed else min(MAX_SCAN_S, self._scan_s * 1.5)
        self.live = {n: r for n, r in self._records.items() if n in self._beating}
        return self.live

    def _scan(self) -> bool:
        """Node 0: every peer's file, read only when replaced; True when anything changed."""
        changed = False
        try:
            entries = list(os.scandir(self.directory))  # type: ignore[arg-type]
        except OSError:
            return False
        self.operations += 1
        for entry in entries:
            name = entry.name
            if not (name.startswith("node") and name.endswith(".json") and name[4:-5].isdigit()):
                continue
            node = int(name[4:-5])
            if node == self.node:
                continue
            try:
                inode = entry.inode()
                if node not in self._beating:  # its time must move once: a stat until then
                    info = entry.stat()
                    self.operations += 1
                    changed |= self._saw(node, inode, info.st_mtime_ns)
                if self._read_inode.get(node) != inode and node in self._beating:
                    changed |= self._look(node, Path(entry.path))
            except OSError:
                continue
        return changed

    def _look(self, node: int, path: Path) -> bool:
        """Open one peer's file: note its beat, read it if it was replaced. True when changed."""
        try:
            with open(path, encoding="utf-8") as source:
                self.operations += 1
                info = os.fstat(source.fileno())
                changed = self._saw(node, info.st_ino, info.st_mtime_ns)
                if self._read_inode.get(node) == info.st_ino:
                    return changed
                record = json.loads(source.read())
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict) or record.get("node") != node:
            return changed
        self._records[node] = record
        self._read_inode[node] = info.st_ino
        return True

    def _saw(self, node: int, inode: int, mtime_ns: int) -> bool:
        first = self._first.setdefault(node, (inode, mtime_ns))
        if node not in self._beating and first != (inode, mtime_ns):
            self._beating.add(node)
            return True
        return False

    def linger(self, seconds: float, poll_s: float) -> None:
        """Keep beating a while, so peers reading the files see the last record."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.publish()
            time.sleep(poll_s)

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.unlink()
            except OSError:
                pass

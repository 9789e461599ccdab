"""Records in a directory all nodes share, one file per node, kept alive by a beat.

A node rewrites its file with an incremented beat while it runs; a reader counts a
peer's record only once it saw the beat move, so files left by an earlier run of the
same job are never read as this run's. Writes are atomic (write, then rename).
Writes and directory scans happen at most once per ``interval``: on a thousand nodes a
parallel file system must not see a thousand scans of a thousand files per second.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from ..host.folders import private_dir

INTERVAL_S = 1.0


class BeatingFiles:
    def __init__(self, directory: str | None, node: int, record: Mapping[str, object], interval_s: float = INTERVAL_S) -> None:
        self.directory = Path(directory) if directory else None
        self.node = node
        self.record = dict(record)
        self.interval_s = interval_s
        self._last_write = self._last_read = float("-inf")
        self.beat = 0
        self._first_beats: dict[int, int] = {}
        self.live: dict[int, dict[str, object]] = {}
        """The latest record of every peer seen alive."""

    @property
    def path(self) -> Path | None:
        return self.directory / f"node{self.node}.json" if self.directory else None

    def publish(self, **update: object) -> None:
        """Rewrite this node's record (with ``update`` merged in) and beat once: at once
        when the record changed, else when ``interval_s`` has passed since the last write."""
        self.record.update(update)
        now = time.monotonic()
        if self.path is None or (not update and now - self._last_write < self.interval_s):
            return
        self._last_write = now
        self.beat += 1
        try:
            if self.beat == 1:  # <shared>/.hpctorch/<key>.X: both ours alone (HpctorchError if not)
                private_dir(str(self.path.parent.parent))
                private_dir(str(self.path.parent))
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps({**self.record, "node": self.node, "beat": self.beat}))
            os.replace(temporary, self.path)
        except OSError:
            self.directory = None  # not writable here: the caller's other channel remains

    def read_live(self) -> dict[int, dict[str, object]]:
        now = time.monotonic()
        if self.directory is None or now - self._last_read < self.interval_s:
            return self.live
        self._last_read = now
        for path in self.directory.glob("node*.json"):
            try:
                other = json.loads(path.read_text())
                node, beat = int(other["node"]), int(other["beat"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if node == self.node:
                continue
            first = self._first_beats.setdefault(node, beat)
            if beat != first:
                self.live[node] = other
        return self.live

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

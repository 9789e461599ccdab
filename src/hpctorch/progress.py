"""A line every ~10 s while hpctorch waits on something, so a slow start on many nodes
never looks like a hang. On a terminal the line is rewritten in place; in a log file each
update is a line of its own. It only reports what the waiting code already knows: it
adds no request to the store and no file-system operation."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 10.0
enabled = True
"""Cleared by ``hpctorch run --quiet``."""


class Progress:
    def __init__(self, timeout_s: float, every_s: float = EVERY_S, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.timeout_s = timeout_s
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.next = self.started + every_s
        self.shown = False

    def tick(self, describe: Callable[[], str | None]) -> None:
        """Print ``describe()`` (if it says anything) once ``every_s`` has passed since the last line."""
        now = self.clock()
        if not enabled or now < self.next:
            return
        self.next = now + self.every_s
        text = describe()
        if not text:
            return
        line = f"hpctorch: {text} — {now - self.started:.0f} s of {self.timeout_s:.0f} s"
        if self.stream.isatty():
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        """End an in-place line on a terminal."""
        if self.shown and self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()

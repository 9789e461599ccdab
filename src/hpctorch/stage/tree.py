"""The shape of the tree that spreads node 0's pack (node i's parent is (i-1)//k, its children
k*i+1 .. k*i+k), its limits, its errors, and the spool: the pack's bytes on a node as they come."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

FANOUT = 4
CHUNK = 1 << 20
IDLE_S = 60.0
HELLO_S = 5.0
JOIN_SLACK_S = 5.0
OBSERVE_S = 5.0
"""A child's pace is judged over this many seconds of sending, never sooner."""
LAG_BYTES = 16 * CHUNK
"""Bytes a parent has that a child has not taken (well past what sockets buffer) before its pace is judged."""


class SpreadError(Exception):
    """This node could not receive the pack; the message names whom and why."""


class LateError(SpreadError):
    """The node's deadline passed: no other parent could help."""


def ancestors_of(node: int, fanout: int = FANOUT) -> list[int]:
    """``node``'s parent, grandparent, ... up to node 0."""
    found = []
    while node > 0:
        node = parent_of(node, fanout)
        found.append(node)
    return found


def parent_of(node: int, fanout: int = FANOUT) -> int:
    return (node - 1) // fanout


def children_of(node: int, nnodes: int, fanout: int = FANOUT) -> list[int]:
    first = node * fanout + 1
    return list(range(first, min(nnodes, first + fanout)))


def depth_of(nnodes: int, fanout: int = FANOUT) -> int:
    """Hops from node 0 to the last node."""
    return len(ancestors_of(nnodes - 1, fanout))


def late(got: int, size: int) -> LateError:
    return LateError(f"its staging time (HPCTORCH_STAGE_TIMEOUT_S) ran out at {got / 2**20:.1f} of {size / 2**20:.1f} MiB")


class Spool:
    """The pack's bytes on this node, read by each child's sender and by this node's own
    extraction at their own pace: node 0's pack file, or a file no other process can open
    (unnamed from the start, so nothing is left behind) that fills as the bytes arrive."""

    def __init__(self, fd: int, size: int, written: int) -> None:
        self.fd, self.size, self.written = fd, size, written
        self.problem: str | None = None
        self.changed = threading.Condition()

    @classmethod
    def whole(cls, path: str, size: int) -> Spool:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        spool = cls(fd, size, min(size, os.fstat(fd).st_size))
        if spool.written < size:
            spool.fail(f"node 0's pack {path} holds {spool.written} of {size} bytes")
        return spool

    @classmethod
    def empty(cls, folder: str | None, size: int) -> Spool:
        """``folder``: where the unnamed file lives (None: the system's temporary folder)."""
        import tempfile  # only a node with children keeps a spool: not on the way of every leaf's start

        handle = tempfile.TemporaryFile(dir=folder)  # 0600, unlinked: O_TMPFILE where the file system has it
        fd = os.dup(handle.fileno())
        handle.close()
        return cls(fd, size, 0)

    def append(self, data: memoryview) -> None:
        while data:
            wrote = os.pwrite(self.fd, data, self.written)
            data = data[wrote:]
            with self.changed:
                self.written += wrote
                self.changed.notify_all()

    def fail(self, problem: str) -> None:
        with self.changed:
            self.problem = problem
            self.changed.notify_all()

    def available(self, offset: int, deadline: float) -> int:
        """Bytes past ``offset`` that are here, waiting for some until ``deadline``; 0 at the end."""
        with self.changed:
            while self.written <= offset < self.size:
                if self.problem:
                    raise SpreadError(self.problem)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise late(offset, self.size)
                self.changed.wait(left)
            return self.written - offset

    def chunks(self, deadline: float) -> Iterator[bytes]:
        offset = 0
        while offset < self.size:
            count = self.available(offset, deadline)
            if time.monotonic() > deadline:
                raise late(offset, self.size)
            chunk = os.pread(self.fd, min(count, CHUNK), offset)
            if not chunk:
                raise SpreadError(f"the pack's {self.written} bytes kept here could not be read back")
            offset += len(chunk)
            yield chunk

    def close(self) -> None:
        os.close(self.fd)

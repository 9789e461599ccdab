"""Processes of this node."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process of this node that can still run: a zombie (exited, not
    yet reaped) is not; another user's process is."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # another user's: it exists
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): it exists


def own_environment() -> dict[str, str] | None:
    """A copy of this process's environment, for a program started from a thread. Started with
    the inherited one, the child's exec reads the C library's ``environ`` array, which another
    thread setting a variable may move at that moment: exec then fails with EFAULT ("Bad
    address"; 85 of 300 starts beside a thread that sets variables, none with a copy). None (the
    inherited one after all) only if variables kept vanishing while it was copied."""
    for _ in range(100):
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):  # a variable removed between listing and reading it
            continue
    return None

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

"""Text that other processes wrote (store values, shared files, other nodes' reports) on
this terminal: with control characters escaped, so no such text can move the cursor, set
the window title or hide a line (terminal escape injection)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str, lines: bool = True) -> str:
    """``text`` with every control character written as ``\\xNN``; newlines and tabs kept
    where ``lines`` (a multi-line report), escaped too where not (one line)."""
    pattern = _CONTROL if lines else _CONTROL_OR_NEWLINE
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)

"""Where this node's staged copy of the Python environment is (``--stage-env``), for whoever
starts a Python process: the workers, the node's watchdog helper, torch's agent.

The ``stage`` wing makes the copy and says where it is in ``HPCTORCH_STAGED`` (JSON: the
interpreter to run and each original folder's copy); every stage reads it from here, so none
needs to import the wing that made it. Without it everything runs from the original paths.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

ENV = "HPCTORCH_STAGED"


def _read(env: Mapping[str, str] | None = None) -> dict | None:
    text = (os.environ if env is None else env).get(ENV)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("roots"), dict) else None


def python(env: Mapping[str, str] | None = None) -> str:
    """The interpreter a new Python process of the job runs: the staged copy's, else this one."""
    data = _read(env)
    return str(data["python"]) if data and data.get("python") else sys.executable


def pythons(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The interpreters a plan's Python command may name: this one, and under ``--stage-env``
    the original one the plan was made with (a simulated node's agent runs from the copy)."""
    data = _read(env)
    return (sys.executable, str(data["original"])) if data and data.get("original") else (sys.executable,)


def map_path(path: str, env: Mapping[str, str] | None = None) -> str:
    """``path`` inside the staged copy when it lies under a staged folder, else ``path``."""
    data = _read(env)
    if not data:
        return path
    return map_with(data["roots"], path)


def map_with(roots: Mapping[str, str], path: str) -> str:
    """``path`` moved from the original folder it lies under to that folder's copy (the longest
    match wins: a venv inside a staged base stays the venv's)."""
    for original in sorted(roots, key=len, reverse=True):
        if path == original or path.startswith(original.rstrip("/") + "/"):
            return roots[original] + path[len(original):]
    return path

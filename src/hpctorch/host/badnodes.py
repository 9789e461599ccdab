"""The user's list of bad nodes, kept across jobs: nodes a job found broken, which the next
job asks the scheduler to leave out (``hpctorch submit``, ``run --requeue``).

One file on the shared home (``HPCTORCH_BAD_NODES`` names another), one JSON line per event:
``{"node", "reason", "time", "job", "evidence"}`` adds a node (an automatic verdict keeps what it
rests on in ``evidence``: the figures, what they were compared with, the rule), ``{"remove": node, "time"}`` takes it back,
and an entry expires ``HPCTORCH_BAD_NODES_DAYS`` (default 7) days after it was added. Lines
are appended in one write each (no lost update when two jobs end at once); the file is
rewritten, expired lines dropped, when it has grown long. ``hpctorch badnodes`` manages it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import HpctorchError

ENV = "HPCTORCH_BAD_NODES"
DAYS_ENV = "HPCTORCH_BAD_NODES_DAYS"
DEFAULT_DAYS = 7.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
COMPACT_LINES = 1000
"""Past this many lines, the next change rewrites the file with the current entries only."""


@dataclass(frozen=True)
class Entry:
    node: str
    reason: str
    time: float
    job: str | None = None
    evidence: object = None
    """An automatic verdict's figures and rule (``stragglers``, ``screen``); None when a person added it."""


def path(env: Mapping[str, str]) -> str:
    """Where the list lives: ``HPCTORCH_BAD_NODES``, else the user's state directory."""
    if env.get(ENV):
        return env[ENV]
    state = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "hpctorch", "bad-nodes.jsonl")


def days(env: Mapping[str, str]) -> float:
    """How many days an entry stays in force."""
    return _days(env)


def _days(env: Mapping[str, str]) -> float:
    raw = env.get(DAYS_ENV)
    try:
        days = float(raw) if raw else DEFAULT_DAYS
    except ValueError:
        days = -1.0
    if days <= 0:
        raise HpctorchError(f"{DAYS_ENV}={raw!r} is not a positive number of days", f"unset {DAYS_ENV} or give e.g. 7")
    return days


def current(env: Mapping[str, str], now: float | None = None) -> list[Entry]:
    """The entries in force: the latest addition of each node, unless removed or expired."""
    now = time.time() if now is None else now
    keep_s = _days(env) * 86400
    entries: dict[str, Entry] = {}
    for record in _records(path(env)):
        if "remove" in record:
            entries.pop(str(record["remove"]), None)
        elif isinstance(record.get("node"), str):
            entries[record["node"]] = Entry(record["node"], str(record.get("reason", "")), float(record.get("time", 0)),
                                            record.get("job"), record.get("evidence"))
    return sorted((e for e in entries.values() if now - e.time < keep_s), key=lambda e: e.node)


def names(env: Mapping[str, str]) -> list[str]:
    """The bad nodes in force, for the scheduler's exclusion."""
    return [entry.node for entry in current(env)]


def add(env: Mapping[str, str], nodes: Iterable[str], reason: str, job: str | None = None, evidence: object = None) -> None:
    nodes = list(nodes)
    for node in nodes:
        if not _NAME.match(node):
            raise HpctorchError(f"{node!r} is no host name", "give the node's name as the scheduler lists it (e.g. nid001234)")
    now = time.time()
    extra = {"evidence": evidence} if evidence is not None else {}
    _append(env, [{"node": node, "reason": reason, "time": now, "job": job, **extra} for node in nodes])


def remove(env: Mapping[str, str], nodes: Iterable[str]) -> None:
    now = time.time()
    _append(env, [{"remove": node, "time": now} for node in nodes])


def clear(env: Mapping[str, str]) -> None:
    _rewrite(env, [])


def _records(file: str) -> list[dict]:
    try:
        with open(file, encoding="utf-8") as source:
            lines = source.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HpctorchError(f"the bad-node list {file} cannot be read: {exc.strerror}", f"fix its permissions, or point {ENV} elsewhere") from None
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a full disk: the others still count
        if isinstance(record, dict):
            records.append(record)
    return records


def _append(env: Mapping[str, str], records: list[dict]) -> None:
    if not records:
        return
    file = path(env)
    if len(_records(file)) >= COMPACT_LINES:
        _rewrite(env, [{"node": e.node, "reason": e.reason, "time": e.time, "job": e.job} for e in current(env)])
    _folder(file)
    text = "".join(json.dumps(record) + "\n" for record in records)
    try:
        fd = os.open(file, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                text = "\n" + text  # after a line cut short (a full disk): ours starts afresh
            os.write(fd, text.encode())  # one write: appends from two jobs never interleave
        finally:
            os.close(fd)
    except OSError as exc:
        raise HpctorchError(f"the bad-node list {file} cannot be written: {exc.strerror}", f"fix its permissions, or point {ENV} elsewhere") from None


def _rewrite(env: Mapping[str, str], records: list[dict]) -> None:
    from .folders import replace_file

    file = path(env)
    _folder(file)
    try:
        replace_file(file, "".join(json.dumps(record) + "\n" for record in records))
    except OSError as exc:
        raise HpctorchError(f"the bad-node list {file} cannot be written: {exc.strerror}", f"fix its permissions, or point {ENV} elsewhere") from None


def _folder(file: str) -> None:
    folder = os.path.dirname(file) or "."
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise HpctorchError(f"the bad-node list's folder {folder} cannot be made: {exc.strerror}", f"point {ENV} elsewhere") from None

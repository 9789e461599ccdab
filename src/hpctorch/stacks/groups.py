"""Many ranks' stacks, grouped: identical main-thread stacks collapsed into one line each
(``ranks 0-2 (n1, n2): all_reduce ← train_step train.py:42``), the odd ones out first.

Pure. Between nodes only the groups travel (a few hundred bytes per distinct stack, however
many ranks share it); each node keeps its full dumps in a file of its own.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable, Sequence

from ..schedulers import hostlist
from ..terminal import printable
from .dump import Frame, RankStack

_LIBRARY_PARTS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep, "<frozen ")
_STDLIB = sysconfig.get_paths().get("stdlib", "\0")
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package, every stage


def is_library(frame: Frame) -> bool:
    """Frames that are not the user's: installed packages, Python's own library, hpctorch."""
    return (any(part in frame.file for part in _LIBRARY_PARTS) or frame.file.startswith((_STDLIB, _OWN))
            or frame.file in ("<string>", "<stdin>"))


def _python(frames: Sequence[Frame]) -> list[Frame]:
    """Python's own frames: py-spy --native adds C/C++ ones (a shared library, line 0), kept in
    the full dump but not used to group or name a stack."""
    return [f for f in frames if f.file.endswith((".py", ">")) or f.line > 0]


def where(stack: RankStack) -> str:
    """One line for a rank's main thread: the innermost call, then the user's own frame."""
    if stack.note:
        return stack.note
    main = stack.main
    frames = _python(main.frames) if main is not None else []
    if not frames:
        return "no Python frame (exiting, or not yet in Python)"
    inner = frames[0]
    own = next((f for f in frames if not is_library(f)), None)
    if own is None:
        return f"{inner.func} ({os.path.basename(inner.file)}:{inner.line})"
    text = f"{own.func} {os.path.basename(own.file)}:{own.line}"
    return text if own is inner else f"{inner.func} ← {text}"


def _key(stack: RankStack) -> str:
    main = stack.main
    if stack.note or main is None:
        return where(stack)
    return "|".join(f"{f.func}@{f.file}:{f.line}" for f in _python(main.frames))


def groups(stacks: Iterable[RankStack]) -> list[dict]:
    """Identical stacks merged: ``{"key", "text", "ranks", "hosts", "methods"}`` (JSON-able)."""
    merged: dict[str, dict] = {}
    for stack in stacks:
        group = merged.setdefault(_key(stack), {"key": _key(stack), "text": where(stack), "ranks": [], "hosts": [], "methods": []})
        group["ranks"].append(stack.worker.rank)
        for name, value in (("hosts", stack.worker.host), ("methods", stack.method)):
            if value and value not in group[name]:
                group[name].append(value)
    return list(merged.values())


def merge(parts: Iterable[Sequence[dict]]) -> list[dict]:
    """Groups from several nodes as one list, same keys merged; odd ones out first."""
    merged: dict[str, dict] = {}
    for part in parts:
        for group in part:
            into = merged.setdefault(group["key"], {**group, "ranks": [], "hosts": [], "methods": []})
            into["ranks"].extend(group["ranks"])
            for name in ("hosts", "methods"):
                into[name].extend(v for v in group.get(name, []) if v not in into[name])
    ordered = sorted(merged.values(), key=lambda g: (len(g["ranks"]), min(g["ranks"])))
    for group in ordered:
        group["ranks"].sort()
    return ordered


def ranks_text(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``ranks 0-2,5``; one rank -> ``rank 5``."""
    from ..host.cpulist import format_cpulist

    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_cpulist(ranks)}"


def summary(merged: Sequence[dict], nodes: int, dumps: str | None, missing: Sequence[str] = (), title: str = "stacks") -> list[str]:
    """The lines a user reads: a header, one line per distinct stack, where the full dumps are."""
    count = sum(len(g["ranks"]) for g in merged)
    methods = sorted({m for g in merged for m in g["methods"]}) or ["none"]
    distinct = "all the same" if len(merged) == 1 else f"{len(merged)} different"
    lines = [f"hpctorch: {title}: {count} rank(s) on {nodes} node(s), by {' and '.join(methods)}; {distinct}:"]
    for group in merged:
        lines.append(f"  {ranks_text(group['ranks'])} ({hostlist.display(group['hosts'])}): {group['text']}")
    if missing:
        lines.append(f"  no answer from: {hostlist.display(missing)}")
    if dumps:
        lines.append(f"  every thread of every rank: {dumps}" + (" (on each node)" if nodes > 1 else ""))
    return [printable(line, lines=False) for line in lines]  # other nodes' text, from the store


def full_text(stacks: Iterable[RankStack]) -> str:
    """Every thread of every rank, in the format of Python's own tracebacks."""
    out: list[str] = []
    for stack in sorted(stacks, key=lambda s: s.worker.rank):
        w = stack.worker
        out.append(f"=== rank {w.rank} (local rank {w.local_rank}, node {w.node} {w.host}, pid {w.pid}) by {stack.method or '-'}"
                   + (f": {stack.note}" if stack.note else ""))
        for thread in stack.threads:
            out.append(f"Thread {thread.name}{' (main)' if thread.main else ''}, most recent call first:")
            out.extend(f'  File "{f.file}", line {f.line}, in {f.func}' for f in thread.frames)
        out.append("")
    return printable("\n".join(out))

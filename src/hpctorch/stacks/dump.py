"""Taking one worker's Python stacks (every thread) without stopping it.

Two ways, tried in order: py-spy (reads the process's memory through ptrace: no cooperation
needed, works on a process stuck in C++; where ``kernel.yama.ptrace_scope`` forbids it, it
fails), then the faulthandler each worker registered at start (``_worker.py``: a signal makes
the worker write its own stacks to a file; needs no ptrace). A worker that exits while sampled
is reported as exited.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..host.folders import stack_file
from ..host.processes import alive, own_environment
from ..host.signals import STACK_SIGNAL

METHODS = ("auto", "py-spy", "faulthandler")
_FAULTHANDLER_LINE = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int


@dataclass(frozen=True)
class Thread:
    name: str
    frames: tuple[Frame, ...]
    """Innermost first."""
    main: bool = False


@dataclass(frozen=True)
class Worker:
    """One live training process: who it is in the job, and where its fallback dump goes."""

    pid: int
    rank: int
    local_rank: int
    node: int
    host: str
    stacks_dir: str | None = None


@dataclass(frozen=True)
class RankStack:
    worker: Worker
    threads: tuple[Thread, ...] = ()
    method: str = ""
    note: str = ""
    """"exited", or why the stack could not be read; empty when it was."""

    @property
    def main(self) -> Thread | None:
        return next((t for t in self.threads if t.main), self.threads[-1] if self.threads else None)


def py_spy() -> str | None:
    """py-spy beside this interpreter (its wheel installs it there), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def capture(workers: Sequence[Worker], method: str = "auto", budget_s: float = 2.0, native: bool = False) -> list[RankStack]:
    """Every worker's stacks, in parallel, within about ``budget_s`` seconds in all."""
    if not workers:
        return []
    deadline = time.monotonic() + budget_s
    with ThreadPoolExecutor(max_workers=min(32, len(workers))) as pool:
        return list(pool.map(lambda w: _one(w, method, deadline, native), workers))


def _one(worker: Worker, method: str, deadline: float, native: bool) -> RankStack:
    why = []
    if method in ("auto", "py-spy"):
        tool = py_spy()
        if tool is None:
            why.append("py-spy is not installed")
        else:
            stack = _by_py_spy(tool, worker, deadline, native)
            if not stack.note or stack.note == "exited" or method == "py-spy":
                return stack
            why.append(stack.note)
    if method in ("auto", "faulthandler"):
        stack = _by_faulthandler(worker, deadline)
        if not stack.note or stack.note == "exited":
            return stack
        why.append(stack.note)
    return RankStack(worker, note="; ".join(why))



def _by_py_spy(tool: str, worker: Worker, deadline: float, native: bool) -> RankStack:
    command = [tool, "dump", "--pid", str(worker.pid), "--json", *(["--native"] if native else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(0.2, deadline - time.monotonic()),
                              env=own_environment())  # from the watchdog's threads: own_environment says why
    except subprocess.TimeoutExpired:
        return RankStack(worker, method="py-spy", note="py-spy timed out")
    except OSError as exc:
        return RankStack(worker, method="py-spy", note=f"py-spy could not start: {exc.strerror}")
    if done.returncode != 0:
        if not alive(worker.pid):
            return RankStack(worker, method="py-spy", note="exited")
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return RankStack(worker, method="py-spy", note=f"py-spy: {error[:160]}")
    try:
        threads = tuple(
            Thread(t.get("thread_name") or str(t.get("os_thread_id")),
                   tuple(Frame(f["name"], f["filename"], int(f["line"])) for f in t.get("frames", [])),
                   main=t.get("os_thread_id") == worker.pid or t.get("thread_name") == "MainThread")
            for t in json.loads(done.stdout)
        )
    except (ValueError, KeyError, TypeError) as exc:
        return RankStack(worker, method="py-spy", note=f"py-spy's output could not be read ({exc})")
    return RankStack(worker, threads, method="py-spy")


def _by_faulthandler(worker: Worker, deadline: float) -> RankStack:
    import psutil

    if STACK_SIGNAL is None or not worker.stacks_dir:
        return RankStack(worker, note="no faulthandler fallback (not started through hpctorch's worker entry)")
    path = stack_file(worker.stacks_dir, worker.pid)
    try:
        # A file older than the process belongs to an earlier process with the same pid: this
        # one has no handler yet, and the signal would kill it.
        if os.stat(path).st_mtime + 1 < psutil.Process(worker.pid).create_time():
            return RankStack(worker, note="faulthandler not registered yet")
        start = os.stat(path).st_size
        os.kill(worker.pid, STACK_SIGNAL)
    except FileNotFoundError:
        return RankStack(worker, note="faulthandler not registered (no stack file)")
    except (psutil.NoSuchProcess, ProcessLookupError):
        return RankStack(worker, method="faulthandler", note="exited")
    except OSError as exc:
        return RankStack(worker, note=f"faulthandler: {exc.strerror}")
    text, stable_since, size = "", None, start
    try:  # the worker may exit meanwhile, and its file go with it (a teardown)
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now_size = os.stat(path).st_size
            if now_size != size:
                size, stable_since = now_size, time.monotonic()
            elif size > start and stable_since is not None and time.monotonic() - stable_since > 0.1:
                break
        with open(path, encoding="utf-8", errors="replace") as dump:
            dump.seek(start)
            text = dump.read()
    except FileNotFoundError:
        return RankStack(worker, method="faulthandler", note="exited")
    if not text:
        return RankStack(worker, method="faulthandler", note="exited" if not alive(worker.pid) else "faulthandler wrote nothing in time")
    return RankStack(worker, parse_faulthandler(text), method="faulthandler")


def parse_faulthandler(text: str) -> tuple[Thread, ...]:
    """faulthandler's dump: threads newest first, so the main thread is the last one."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append((line.split(" (")[0], []))
        elif threads and (match := _FAULTHANDLER_LINE.match(line)):
            threads[-1][1].append(Frame(match["func"], match["file"], int(match["line"])))
    return tuple(Thread(name, tuple(frames), main=i == len(threads) - 1) for i, (name, frames) in enumerate(threads))


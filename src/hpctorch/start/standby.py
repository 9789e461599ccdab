"""Warm restarts: under torch's agent (``--max-restarts``), each local rank has a standby process
that has already started Python, imported torch and the packages the running worker imported,
and waits; on a restart the agent's next worker for that local rank is the standby, told the new
attempt's command line and environment, instead of a new process.

- When: once an attempt trained (its rank's first collective, from the straggler watch's files;
  at once where the watch is off), a standby is started for each local rank that has none: as
  that rank's worker was started (the same interpreter, flags and environment, so its CPUs and
  thread count are the worker's), with ``--standby`` for the worker entry
  (``hpctorch/_worker.py``).
- The go: torch's ``SubprocessHandler._popen`` for that local rank writes one JSON line to the
  standby's stdin (arguments, environment, folder, the files torch opened for its output) and
  hands torch the standby's ``Popen``: its pid, its session (torch signals the group) and its
  exit are the worker's. A standby whose interpreter or flags differ from the new worker's, or
  whose environment differs in what is read as Python or torch start (``IMPORT_TIME``), is
  stopped and a new process is started as before.
- A standby never needed reads end-of-file when the agent goes, and exits.
- Forked, not started: the node's first standby starts a zygote (``start.zygote``) that imports
  ahead once; every standby after it, of any local rank and any attempt, is forked from it. A
  local rank whose environment differs in what is read as Python or torch start (bar its
  devices and LOCAL_RANK, read later) gets a zygote of its own; where none can serve, a
  standby is started as its own process as before.

Forked at once: every worker of a Python command, on every attempt (the first too) and under
either starter (torch's agent, ``SubprocessHandler._popen``; hpctorch's own, ``supervisor``), is a
standby forked from the node's zygote and told to go at once where none waits: a node imports
torch once, not once per local rank (2-3 CPU-seconds and a storm of reads of the shared file
system each). It takes the stdin, stdout and stderr a started worker would have had.

``HPCTORCH_STANDBY=0`` turns the waiting standbys off; ``HPCTORCH_STANDBY=spawn`` starts each
standby as its own process (no zygote, no worker forked); ``HPCTORCH_FORK_WORKERS=0`` starts every
worker as its own process, as torch does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ..guard.straggler_worker import modules_file
from . import zygote as zygotes

ENV = "HPCTORCH_STANDBY"
FORK_ENV = "HPCTORCH_FORK_WORKERS"
MODULES_ENV = "HPCTORCH_STANDBY_MODULES"
"""In a standby: the file of module names its local rank's worker had imported."""
FLAG = "--standby"
NAME = "hpctorch-warm"
"""A standby's name while it waits (``/proc/PID/comm``: ``ps``, ``top``); a worker has its interpreter's."""
IMPORT_TIME = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
               "PYTHONPATH", "PYTHONHASHSEED", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "LOCAL_RANK",
               "HPCTORCH_CPU_SETS", "HPCTORCH_DEVICE_SETS", "HPCTORCH_THREAD_COUNTS", "HPCTORCH_STAGED")
"""Read as the interpreter, torch or the CPU binding start: a standby started with other values is
not the process the new worker would be."""
RANK_VARS = ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "LOCAL_WORLD_SIZE",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
"""The attempt's own: a standby waits without them (a package that reads them as it is imported
fails there, and is imported again after the go)."""
PER_RANK = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "LOCAL_RANK")
"""Of ``IMPORT_TIME``, what a standby forked from a zygote may hold apart from it: read when the
device is first used and by the worker entry (its CPUs, its thread count), after the fork."""
POLL_S = 0.5
PIPE_BYTES = 60_000
"""The go must fit the pipe's buffer (64 KiB on Linux): written at once, whether or not the standby reads yet."""


class Standby:
    """One waiting process for a local rank, and the command line it was started with."""

    def __init__(self, popen: subprocess.Popen, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.popen, self.argv, self.env = popen, tuple(argv), dict(env)

    def fits(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        entry = _entry_index(argv)
        return (entry is not None and tuple(argv[:entry + 1]) == self.argv[:entry + 1] and self.popen.poll() is None
                and all(env.get(name) == self.env.get(name) for name in IMPORT_TIME))

    def go(self, argv: Sequence[str], env: Mapping[str, str], stdout: str | None, stderr: str | None) -> bool:
        entry = _entry_index(argv)
        message = {"argv": list(argv[entry + 1:]) if entry is not None else [], "env": dict(env), "cwd": os.getcwd(),
                   "stdout": stdout, "stderr": stderr}
        line = (json.dumps(message) + "\n").encode()
        if len(line) > PIPE_BYTES:
            return False  # a standby still importing would leave the agent blocked on the pipe
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.write(line)
            self.popen.stdin.close()
            return True
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        """Never needed: gone now, not when its imports end and it reads end-of-file."""
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        except OSError:
            pass
        try:
            os.killpg(self.popen.pid, 9)  # its own session: anything it started goes too
        except OSError:
            self.popen.kill()
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _entry_index(argv: Sequence[str]) -> int | None:
    """Where the worker entry (``.../hpctorch/_worker.py``) is in a worker's command line."""
    for index, arg in enumerate(argv):
        if arg.endswith(os.path.join("hpctorch", "_worker.py")):
            return index
    return None


class Standbys:
    """This node's standbys, by local rank; the command line and environment each local rank's
    worker was last started with (what its next standby is started as)."""

    def __init__(self, directory: str | None, fork: bool = True, warm: bool = True, fork_now: bool = False) -> None:
        self.directory = directory
        self.fork = fork
        self.warm = warm
        self.fork_now = fork_now and fork
        self.zygotes: dict[tuple[object, ...], zygotes.Zygote] = {}
        self.waiting: dict[int, Standby] = {}
        self.started_as: dict[int, tuple[tuple[str, ...], dict[str, str]]] = {}
        self.used: list[int] = []
        """The pids of standbys that became workers (the tests and the closing summary read it)."""
        self._lock = threading.Lock()
        self._generation = 0

    def take(self, local_rank: int, argv: Sequence[str], env: Mapping[str, str], stdout: str | None,
             stderr: str | None) -> subprocess.Popen | None:
        """The local rank's standby, told to become this worker; None to start a process as before."""
        with self._lock:
            standby = self.waiting.pop(local_rank, None)
        if standby is None:
            return None
        if not standby.fits(argv, env) or not standby.go(argv, env, stdout, stderr):
            standby.stop()
            return None
        self.used.append(standby.popen.pid)
        return standby.popen

    def note(self, local_rank: int, argv: Sequence[str], env: Mapping[str, str]) -> None:
        with self._lock:
            self.started_as[local_rank] = (tuple(argv), dict(env))

    def prepare_after_progress(self, pids: set[int]) -> None:
        """Once this attempt trained (or at once without the straggler watch), a standby for every
        local rank that has none, in a thread of its own."""
        with self._lock:
            self._generation += 1
            generation = self._generation
        threading.Thread(target=self._prepare, args=(pids, generation), name="hpctorch-standby", daemon=True).start()

    def _prepare(self, pids: set[int], generation: int) -> None:
        from ..guard.goodput import first_collective

        while self.directory is not None and first_collective(self.directory, pids) is None:
            if generation != self._generation:
                return  # a newer attempt started meanwhile
            time.sleep(POLL_S)
        with self._lock:
            started_as = sorted(self.started_as.items())
        for local_rank, (argv, env) in started_as:
            with self._lock:
                if generation != self._generation or local_rank in self.waiting:
                    continue
            modules = modules_file(self.directory, local_rank) if self.directory else None
            standby = (self._forked(argv, env, modules) if self.fork else None) or _spawn(argv, env, modules)
            if standby is None:
                continue
            with self._lock:
                if generation == self._generation and local_rank not in self.waiting:
                    self.waiting[local_rank] = standby
                    continue
            standby.stop()

    def start_now(self, argv: Sequence[str], env: Mapping[str, str], given: Sequence[int],
                  give_up: Callable[[], bool] = lambda: False) -> subprocess.Popen | None:
        """This worker, forked from the zygote and told to go at once, with ``given`` as its stdin,
        stdout and stderr; None to start a process as before (not a Python worker, no zygote, or
        ``give_up()`` while the zygote imports)."""
        entry = _entry_index(argv)
        if entry is None or list(argv[entry + 1:entry + 2]) == ["--exec"]:
            return None  # another command: torch imported for it would be imported in vain
        standby = self._forked(argv, env, None, given, give_up)
        if standby is None:
            return None
        if not standby.go(argv, env, None, None):
            standby.stop()
            return None
        return standby.popen

    def _forked(self, argv: Sequence[str], env: Mapping[str, str], modules: str | None, given: Sequence[int] = (),
                give_up: Callable[[], bool] = lambda: False) -> Standby | None:
        """A standby forked from the zygote for this interpreter and start-time environment (the
        first such standby starts it); None where no zygote can serve."""
        entry = _entry_index(argv)
        if entry is None:
            return None
        key = (tuple(argv[:entry + 1]), *(env.get(name) for name in IMPORT_TIME if name not in PER_RANK))
        with self._lock:
            zygote = self.zygotes.get(key)
            if zygote is None:
                try:
                    zygote = self.zygotes[key] = zygotes.Zygote(_command(argv, entry), _started(env, modules))
                except OSError:
                    return None
        popen = zygote.fork(_started(env, modules), given, give_up)
        return Standby(popen, argv, env) if popen is not None else None  # type: ignore[arg-type]

    def stop(self) -> None:
        """The job ends: every standby waiting goes, and none is made after; so do the zygotes."""
        with self._lock:
            self._generation += 1
            waiting, self.waiting = self.waiting, {}
            made, self.zygotes = self.zygotes, {}
        for standby in waiting.values():
            standby.stop()
        for zygote in made.values():
            zygote.close()


def _spawn(argv: Sequence[str], env: Mapping[str, str], modules: str | None) -> Standby | None:
    entry = _entry_index(argv)
    if entry is None:
        return None  # not hpctorch's worker entry (a --no-python command): nothing to start ahead
    try:
        popen = subprocess.Popen(_command(argv, entry), env=_started(env, modules), stdin=subprocess.PIPE, start_new_session=True)
    except OSError:
        return None
    return Standby(popen, argv, env)


def _command(argv: Sequence[str], entry: int) -> list[str]:
    """A standby's (or zygote's) command line: the worker's, ``--standby`` after the worker entry,
    so that ``ps`` and ``pkill -f`` still find a worker forked from it by its script's name."""
    return [*argv[:entry + 1], FLAG, *argv[entry + 1:]]


def _started(env: Mapping[str, str], modules: str | None) -> dict[str, str]:
    """A standby's environment: the worker's, without the attempt's own."""
    started = {k: v for k, v in env.items() if k not in RANK_VARS}
    if modules:
        started[MODULES_ENV] = modules
    return started


_node: Standbys | None = None


def enabled(env: Mapping[str, str], max_restarts: int) -> bool:
    """Waiting standbys, for restarts."""
    return max_restarts > 0 and env.get(ENV, "1") != "0"


def fork_enabled(env: Mapping[str, str], local_workers: int, warm: bool = False) -> bool:
    """Workers forked at once from the node's zygote: where the node starts several (one import of
    torch for them all) or keeps standbys (its zygote imports torch for them anyway). A node of one
    worker and no restarts starts it as its own process: one import either way, none for a script
    that never imports torch, and one process fewer."""
    wanted = local_workers > 1 or warm
    return wanted and env.get(FORK_ENV, "1") != "0" and env.get(ENV) != "spawn" and hasattr(os, "fork") and hasattr(socket, "send_fds")


def install(directory: str | None, warm: bool = True, fork: bool = True) -> Standbys:
    """Around torch's agent: its next worker for a local rank is that rank's standby where one
    waits, else (``fork``) one forked and told to go at once (``SubprocessHandler._popen``); after
    each attempt started (``PContext.start``), the next standbys are prepared (``warm``)."""
    global _node
    import functools

    from torch.distributed.elastic.multiprocessing.api import PContext
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

    node = _node = Standbys(directory, fork=os.environ.get(ENV) != "spawn", warm=warm, fork_now=fork)
    popen = SubprocessHandler._popen
    if not getattr(popen, "_hpctorch_standby", False):
        @functools.wraps(popen)
        def _popen(handler, args, env):  # type: ignore[no-untyped-def]
            current = _node
            if current is None:
                return popen(handler, args, env)
            rank = int(getattr(handler, "local_rank_id", -1))
            taken = current.take(rank, args, env, _name(handler, "_stdout"), _name(handler, "_stderr"))
            current.note(rank, args, env)
            if taken is None and current.fork_now:
                taken = current.start_now(args, env, (0, _fileno(handler, "_stdout", 1), _fileno(handler, "_stderr", 2)))
            return taken if taken is not None else popen(handler, args, env)

        _popen._hpctorch_standby = True  # type: ignore[attr-defined]
        SubprocessHandler._popen = _popen  # type: ignore[method-assign]
    start = PContext.start
    if not getattr(start, "_hpctorch_standby", False):
        @functools.wraps(start)
        def started(context, *args, **kwargs):  # type: ignore[no-untyped-def]
            result = start(context, *args, **kwargs)
            current = _node
            if current is not None:
                try:
                    pids = set(context.pids().values())
                    warm = len(pids & set(current.used))
                    if warm:
                        print(f"hpctorch: {warm} of {len(pids)} worker(s) of this attempt run in their warm standby (torch and the "
                              "packages imported ahead)", file=sys.stderr, flush=True)
                    if current.warm:
                        current.prepare_after_progress(pids)
                except Exception:  # noqa: BLE001 - torch's names moved: restarts start new processes
                    pass
            return result

        started._hpctorch_standby = True  # type: ignore[attr-defined]
        PContext.start = started  # type: ignore[method-assign]
    return node


def uninstall() -> None:
    global _node
    if _node is not None:
        _node.stop()
    _node = None


def _fileno(handler: object, attribute: str, inherited: int) -> int:
    """The descriptor torch opened for a worker's output, else the one a started worker inherits."""
    opened = getattr(handler, attribute, None)
    try:
        return opened.fileno() if opened is not None else inherited
    except (AttributeError, OSError, ValueError):
        return inherited


def _name(handler: object, attribute: str) -> str | None:
    opened = getattr(handler, attribute, None)
    name = getattr(opened, "name", None)
    return name if isinstance(name, str) else None


def wait_for_go() -> None:
    """In the standby (``_worker.py --standby``): import ahead, silently, then wait for the go and
    become the worker it names (environment, folder, output, arguments); end-of-file: exit. In a
    zygote (``start.zygote``): import torch, then fork standbys; this returns in each of them."""
    global _forked
    kept = (os.dup(1), os.dup(2))
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    # Not from the worker entry's own folder (hpctorch/: its progress.py, errors.py...), which
    # python put first: a package of the same name must be the installed one.
    entry_folder = sys.path.pop(0)
    given: tuple[int, ...] = ()
    if os.environ.get(zygotes.ENV):
        # torch alone before the forks: the worker's own packages may start threads or a CUDA
        # driver at import, which a forked child would lack or could not use.
        _import_ahead(None)
        given = zygotes.serve()
        _forked = True
        if "numpy.random" in sys.modules:  # its global state, seeded once in the zygote, is each rank's own again
            sys.modules["numpy.random"].seed()
    named = zygotes.rename(NAME)
    _import_ahead(os.environ.get(MODULES_ENV))
    if not given:  # forked to go at once, it makes a context when, and where, its script asks (nothing to gain ahead)
        _cuda_context()
    sys.path.insert(0, entry_folder)  # replaced by the script's folder as the worker runs it
    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(0)
    go = json.loads(line)
    zygotes.rename(named)
    os.environ.clear()
    os.environ.update(go["env"])
    os.chdir(go["cwd"])
    # Forked at once, it takes what a started worker would have had; a standby, what it was started with.
    stdin, outputs = (given[0], given[1:]) if len(given) == 3 else (os.open(os.devnull, os.O_RDONLY), kept)
    opened = []
    for fd, path, inherited in ((1, go["stdout"], outputs[0]), (2, go["stderr"], outputs[1])):
        target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else inherited
        opened += [target] if path else []
        os.dup2(target, fd)
    os.dup2(stdin, 0)
    for fd in {quiet, stdin, *kept, *given, *opened} - {0, 1, 2}:
        try:
            os.close(fd)
        except OSError:
            pass
    sys.argv = [sys.argv[0], *go["argv"]]


_forked = False


def after_go() -> None:
    """In a standby forked from a zygote, once the worker entry set this local rank's thread count:
    torch's was read as the zygote imported it."""
    count = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if _forked and torch is not None and count.isdigit() and int(count) > 0 and torch.get_num_threads() != int(count):
        torch.set_num_threads(int(count))


def _import_ahead(listed: str | None) -> None:
    import importlib

    names = ["torch", "torch.distributed"]
    if listed:
        try:
            with open(listed, encoding="utf-8") as source:
                names += [name.strip() for name in source if name.strip()]
        except OSError:
            pass
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - imported again, or not, by the worker itself after the go
            pass


def _cuda_context() -> None:
    """Its device's CUDA context made ahead (a second or more at a worker's first CUDA call), on
    the device torchrun's convention gives its local rank: LOCAL_RANK among the visible ones."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return
        device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(device)
        torch.empty(0, device=f"cuda:{device}")
    except Exception:  # noqa: BLE001 - the worker makes its own, as it would have
        pass

"""A node's part of ``--stage-env``, through the master's store before the job's own (keys
``hpctorch/<run id>/stage/...``; per node a handful of requests, whatever the node count):

1. node 0 names the environment's key (``key``); each node says whether it lacks a copy
   (``missing``, ``reported``); node 0 waits for every report;
2. when any node lacks it, node 0 packs (or takes its kept pack) and says its size, SHA-256 and
   a token (``pack``); the pack flows down the tree (``spread``; a node with children publishes
   ``addr/<node>``), each node that lacks the copy extracting it as it passes (``unpack``);
3. each node reports (``done``, ``failed``, the first failure's line); node 0 says the verdict,
   and waits a moment for everyone to read it before its store leaves the port to the job's.

A node that could not stage stops the job before any worker starts, or with ``--stage-env=try``
runs from the shared path; either way it says why in one line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import progress, staged
from ..errors import HpctorchError
from ..host import folders
from ..plan.types import Plan
from . import environment, hotrecord, hotset, inventory, pack, relocate, spread, unpack

TIMEOUT_S = 600.0
"""Default bound on a node's whole staging (``HPCTORCH_STAGE_TIMEOUT_S``)."""
ACCEPT_S = 30.0
"""How long a node waits for its children to connect: all reported before the pack was made."""
READ_S = 5.0
POLL_S = 0.05
POLL_MAX_S = 1.0


@dataclass(frozen=True)
class Settings:
    fallback: bool = False
    """``--stage-env=try``: a node that cannot stage runs from the shared path."""
    extra: tuple[str, ...] = ()
    stage_root: str = field(default_factory=folders.local_scratch)
    timeout_s: float = TIMEOUT_S
    fanout: int = spread.FANOUT
    hot: bool = True
    """``HPCTORCH_STAGE_HOT`` (1): once jobs ran from node 0's copy, a pack carries what they read
    whole and the rest as links to the shared path (``hotset``); 0: every file whole."""

    @classmethod
    def of(cls, fallback: bool, extra: Sequence[str], stage_root: str | None, env: MutableMapping[str, str]) -> Settings:
        def number(name: str, default: float, low: float) -> float:
            text = env.get(name, "")
            try:
                value = float(text) if text else default
            except ValueError:
                value = low - 1
            if value < low:
                raise HpctorchError(f"{name}={text!r} is not a number of at least {low:g}", f"unset it, or give e.g. {name}={default:g}")
            return value

        for path in extra:
            if not os.path.isdir(path):
                raise HpctorchError(f"--stage-env {path}: no such folder", "give a folder the workers import from, or drop it")
        root = stage_root or folders.local_scratch()
        if not os.path.isdir(root):
            raise HpctorchError(f"--stage-dir {root}: no such folder", "give a folder on each node's own disk, e.g. --stage-dir /tmp")
        hot = env.get("HPCTORCH_STAGE_HOT", "1")
        if hot not in ("0", "1"):
            raise HpctorchError(f"HPCTORCH_STAGE_HOT={hot!r} is neither 0 nor 1",
                                "unset it (1: a pack carries what jobs read, the rest as links to the shared path), or 0 to copy every file")
        return cls(fallback, tuple(extra), root, number("HPCTORCH_STAGE_TIMEOUT_S", TIMEOUT_S, 1.0),
                   int(number("HPCTORCH_STAGE_FANOUT", spread.FANOUT, 1.0)), hot == "1")


@dataclass(frozen=True)
class Staged:
    """Where this node's copy is: the interpreter to run, each original folder's copy."""

    python: str
    copies: dict[str, str]
    key: str

    def export(self, env: MutableMapping[str, str]) -> None:
        """What every process started from here inherits (``hpctorch.staged`` reads it)."""
        env[staged.ENV] = json.dumps({"python": self.python, "roots": self.copies, "key": self.key, "original": sys.executable,
                                      "records": self.records()})
        env["PATH"] = os.pathsep.join([os.path.dirname(self.python), *[p for p in env.get("PATH", "").split(os.pathsep) if p]])
        # A Python built with --enable-shared finds libpython by its RUNPATH, the shared path;
        # LD_LIBRARY_PATH comes first, and names libpython alone.
        libs = [folder for folder in map(relocate.libpython_folder, self.copies.values()) if os.path.isdir(folder)]
        if libs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *[p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]])
        for name in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            if env.get(name):
                env[name] = staged.map_with(self.copies, os.path.realpath(env[name]))

    def records(self) -> str | None:
        """The copy's records folder (``hotrecord``), if it has one (copies made before it lack it)."""
        folder = os.path.join(os.path.dirname(next(iter(self.copies.values()))), hotrecord.RECORDS)
        return folder if folders.why_unsafe(folder) is None else None

    def adopt(self) -> None:
        """This process imports from the copy from now on: the starter's own later imports, and
        torch's agent's torch."""
        import importlib

        def moved(path: str) -> str:  # an entry outside the staged folders stays as it was written
            as_written = staged.map_with(self.copies, path)
            if as_written != path:
                return as_written  # no realpath, which lstats every folder above the entry on the shared path
            real = os.path.realpath(path) if path else path
            copy = staged.map_with(self.copies, real)
            return copy if copy != real else path

        sys.path[:] = [moved(p) for p in sys.path]
        importlib.invalidate_caches()


class _Problem(Exception):
    pass


def open_store(plan: Plan, serve: bool):  # type: ignore[no-untyped-def]
    """The master's store for the staging: node 0 serves it with torch's TCPStore; everyone else
    reaches it without importing torch from the shared path (``storeclient``, through
    ``agreement.reach``), unless that server speaks another torch's protocol."""
    from ..screen.exchange import connect

    return connect(plan, plan.rdzv_timeout, serve=serve, what="staging the environment")


def stage(plan: Plan, settings: Settings, connect: Callable[[], object] | None = None, first: bool = True,
          listeners: int = 0) -> Staged | None:
    """This node's part; its copy, or None where it runs from the shared path (``try``).
    ``connect`` opens the master's store (several nodes, or several ranks per task); a lone
    starter or simulated nodes need none. Per task, the node's ``first`` rank takes the node's
    part and its other ranks (``listeners`` in the whole job) use the copy it made."""
    base = folders.stage_dir(settings.stage_root)
    copies_dir = folders.private_dir(os.path.join(base, "copies"))
    with _half_copy_removed_if_stopped(copies_dir):
        if connect is None or plan.simulated or (plan.nnodes == 1 and not listeners):
            return _decide(plan, settings, _alone(settings, base, copies_dir), None)
        store = connect()
        try:
            if not first:
                return _follow(plan, settings, store, copies_dir)
            return _together(plan, settings, store, base, copies_dir, listeners)
        finally:
            del store


@contextmanager
def _half_copy_removed_if_stopped(copies_dir: str) -> Iterator[None]:
    """A SIGTERM or SIGINT while this node unpacks (scancel, Ctrl-C) removes the half copy
    first, then acts as it would have (in the main thread, where Python runs handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(number: int, _frame: object) -> None:
        inventory.remove_half_copies_of(copies_dir, os.getpid())
        signal.signal(number, before[number])
        signal.raise_signal(number)

    before = {number: signal.signal(number, stopped) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _follow(plan: Plan, settings: Settings, store, copies_dir: str) -> Staged | None:  # type: ignore[no-untyped-def]
    """A node's other rank (per task): the copy its first rank made, once node 0 gave the verdict."""
    prefix = f"hpctorch/{plan.run_id}/stage/"
    deadline = time.monotonic() + settings.timeout_s
    verdict = None
    try:
        named = _given(spread.wait_for(store, prefix + "key", deadline, "node 0 to name the environment"))
        verdict = json.loads(spread.wait_for(store, prefix + "verdict", deadline + READ_S, "node 0's verdict"))
        store.add(prefix + "read", 1)
        outcome: Staged | str = _staged(copies_dir, named["key"], named["python"]) if unpack.ready(copies_dir, named["key"]) else \
            "its first rank made no copy"
    except (spread.SpreadError, _Problem, RuntimeError, OSError) as exc:
        outcome = _line(exc)
    return _decide(plan, settings, outcome, verdict, speaks=False)


def _alone(settings: Settings, base: str, copies_dir: str) -> Staged | str:
    try:
        source = environment.source(settings.extra)
        walked = environment.key(source.roots, source.skip)
        key = walked.digest
        if not unpack.ready(copies_dir, key):
            _say_packing(key, base, walked.files, walked.size, 1)
            made = pack.pack(source.roots, key, base, source.skip)
            unpack.receive(made.chunks(), copies_dir, key, source.roots, made.size, made.digest)
        return _staged(copies_dir, key, source.python)
    except (OSError, unpack.UnpackError) as exc:
        return _line(exc)


def _together(plan: Plan, settings: Settings, store, base: str, copies_dir: str,  # type: ignore[no-untyped-def]
              listeners: int = 0) -> Staged | None:
    prefix = f"hpctorch/{plan.run_id}/stage/"
    me, nnodes = plan.node_rank, plan.nnodes
    deadline = time.monotonic() + settings.timeout_s
    outcome: Staged | str
    part: spread.Part | None = None  # serving nodes below whose parent failed them, until the verdict
    try:
        if me == 0:  # node 0 acts on its own values, never on what the store gives back
            source = environment.source(settings.extra)
            walked = environment.key(source.roots, source.skip)
            named = {"key": walked.digest, "roots": source.roots, "skip": source.skip, "python": source.python,
                     "files": walked.files, "size": walked.size}
            store.set(prefix + "key", json.dumps(named))
        else:
            named = _given(spread.wait_for(store, prefix + "key", deadline, "node 0 to name the environment"))
        key = named["key"]
        have = unpack.ready(copies_dir, key)
        if not have:
            store.add(prefix + "missing", 1)
        store.add(prefix + "reported", 1)
        if me == 0:
            _count(store, prefix + "reported", nnodes, deadline, "nodes to say whether they have a copy")
            lacking = store.add(prefix + "missing", 0)
            hot = _hot_set(copies_dir, key) if lacking and have and settings.hot else None
            if lacking:
                _say_packing(key, base, named["files"], named["size"], lacking, hot)
            made = pack.pack(named["roots"], key, base, named["skip"], hot) if lacking else None
            import secrets  # node 0 alone: the other nodes import nothing they do not need before their copy is there

            sent = {"size": made.size, "digest": made.digest, "token": secrets.token_hex(16)} if made else {}
            store.set(prefix + "pack", json.dumps(sent))
        else:
            sent = _given(spread.wait_for(store, prefix + "pack", deadline, "node 0's pack"))
        if sent:
            part = _spread(plan, settings, store, prefix, sent, named, copies_dir, have, made if me == 0 else None, deadline)
        outcome = _staged(copies_dir, key, named["python"])
    except (OSError, _Problem, spread.SpreadError, unpack.UnpackError, HpctorchError) as exc:
        outcome = _line(exc)
        if me == 0:  # the others wait for these: let them go on at once, and say why
            for name in ("key", "pack"):
                store.compare_set(prefix + name, "", json.dumps({"abandoned": outcome}))
    try:
        verdict = _verdict(plan, store, prefix, outcome, deadline, listeners)
    finally:
        if part is not None:
            part.close()
    return _decide(plan, settings, outcome, verdict)


def _hot_set(copies_dir: str, key: str) -> frozenset[str] | None:
    """What the jobs that ran from node 0's copy read of it, or None before any did."""
    names = hotset.recorded(os.path.join(copies_dir, key))
    return hotset.with_sources(names) if names else None


def _say_packing(key: str, base: str, files: int, size: int, lacking: int, hot: frozenset[str] | None = None) -> None:
    """Node 0 says why this start takes longer, once per environment (the pack is kept)."""
    if progress.enabled and not pack.is_kept(key, base, hot):
        what = (f"what jobs read of the environment ({len(hot):,} of {files:,} files; the others as links to the shared path)"
                if hot else f"the environment ({files:,} files, {pack.amount(size)})")
        print(f"hpctorch: packing {what} for the {lacking} node(s) without a copy; kept for later jobs", file=sys.stderr, flush=True)


def _given(text: str) -> dict:
    """What node 0 set, unless it gave up (its own line says why)."""
    given = json.loads(text)
    if "abandoned" in given:
        raise _Problem("node 0 could not make the pack")
    return given


def _spread(plan: Plan, settings: Settings, store, prefix: str, sent: dict, named: dict, copies_dir: str,  # type: ignore[no-untyped-def]
            have: bool, made: pack.Pack | None, deadline: float) -> spread.Part:
    shown = progress.Progress(settings.timeout_s)

    def tick(count: int) -> None:
        if plan.node_rank == 0:
            shown.tick(lambda: f"staging the environment: {count / 2**20:.0f} of {sent['size'] / 2**20:.0f} MiB sent")

    def consume(chunks: Iterator[bytes]) -> None:
        unpack.receive(chunks, copies_dir, named["key"], named["roots"], sent["size"], sent["digest"])

    def say(line: str) -> None:
        print(f"hpctorch: {_host(plan)} {line}", file=sys.stderr, flush=True)

    return spread.take_part(store, prefix, plan.node_rank, plan.nnodes, plan.local_addr or plan.master_addr or socket.gethostname(),
                            sent["token"], sent["size"], None if have else consume, made.path if made is not None else None, settings.fanout,
                            deadline, ACCEPT_S, spool_dir=os.path.dirname(copies_dir), tick=tick, say=say,
                            name_of=lambda rank: f"node {rank} ({plan.nodes[rank]})" if rank < len(plan.nodes) else f"node {rank}")


def _verdict(plan: Plan, store, prefix: str, outcome: Staged | str, deadline: float, listeners: int) -> dict:  # type: ignore[no-untyped-def]
    """Every node's outcome, as node 0 sums it up: ``failed``, ``first`` (a line), ``absent``;
    node 0's store stays until every node and listener read it, or a moment passed."""
    try:
        if isinstance(outcome, str):
            store.compare_set(prefix + "first", "", f"{_host(plan)}: {outcome}")
            store.add(prefix + "failed", 1)
        store.add(prefix + "done", 1)
        if plan.node_rank == 0:
            done = _count(store, prefix + "done", plan.nnodes, deadline, "", quiet=True)
            failed = store.add(prefix + "failed", 0)
            first = store.get(prefix + "first").decode() if failed else ""
            store.set(prefix + "verdict", json.dumps({"failed": failed, "first": first, "absent": plan.nnodes - done}))
        verdict = json.loads(spread.wait_for(store, prefix + "verdict", deadline + READ_S, "node 0's verdict"))
        store.add(prefix + "read", 1)
        if plan.node_rank == 0:
            _count(store, prefix + "read", plan.nnodes + listeners, time.monotonic() + READ_S, "", quiet=True)
        return verdict
    except (_Problem, spread.SpreadError, RuntimeError) as exc:  # torch's store errors are RuntimeErrors
        return {"failed": 1, "first": f"{_host(plan)}: {exc}", "absent": 0, "lost": True}


def _decide(plan: Plan, settings: Settings, outcome: Staged | str, verdict: dict | None, speaks: bool = True) -> Staged | None:
    if isinstance(outcome, str) and not speaks:
        if settings.fallback:
            return None
        raise HpctorchError("")  # the node's first rank says why
    if isinstance(outcome, str):
        if settings.fallback:
            print(f"hpctorch: {_host(plan)} could not stage the environment ({outcome}); it runs from the shared path (--stage-env=try)",
                  file=sys.stderr, flush=True)
            return None
        raise HpctorchError(f"{_host(plan)} could not stage the environment: {outcome}", _fix(outcome))
    if verdict and (verdict["failed"] or verdict["absent"]) and not settings.fallback:
        if plan.node_rank != 0 or not speaks:
            raise HpctorchError("")  # node 0 says it for the job, the node itself why
        what = verdict["first"] or f"{verdict['absent']} node(s) did not finish within {settings.timeout_s:.0f} s"
        raise HpctorchError(f"{verdict['failed'] + verdict['absent']} of {plan.nnodes} nodes could not stage the environment (first: {what})",
                            "see that node's line; free space there or pass --stage-dir, or --stage-env=try to run such nodes from the shared path")
    return outcome


def _staged(copies_dir: str, key: str, python: str) -> Staged:
    """The copy of ``key``, whose interpreter must lie inside it: a key record naming any other
    program would have this node run it."""
    copies = dict(unpack.copies_of(copies_dir, key))
    interpreter = staged.map_with(copies, os.path.normpath(python))
    folder = os.path.join(copies_dir, key)
    if os.path.commonpath([folder, interpreter]) != folder or not os.path.isfile(interpreter):
        raise _Problem(f"the environment's interpreter {python} does not lie inside its copy {folder}")
    inventory.hold(copies_dir, key)  # kept while this process (the node's launcher, or the rank it becomes) lives
    return Staged(interpreter, copies, key)


def _line(exc: BaseException) -> str:
    if isinstance(exc, HpctorchError):
        return exc.line()
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"
    return str(exc)


def _fix(line: str) -> str:
    if "space" in line:
        return "free space there, pass --stage-dir on a larger node-local disk, or --stage-env=try"
    return "see the cause; --stage-env=try runs such a node from the shared path instead"


def _host(plan: Plan) -> str:
    return plan.nodes[plan.node_rank] if plan.node_rank < len(plan.nodes) else socket.gethostname()


def _count(store, key: str, target: int, deadline: float, what: str, quiet: bool = False) -> int:  # type: ignore[no-untyped-def]
    """Node 0 polls a counter, backing off, until it reaches ``target`` or ``deadline``."""
    pause = POLL_S
    while True:
        value = store.add(key, 0)
        if value >= target:
            return value
        if time.monotonic() >= deadline:
            if quiet:
                return value
            raise _Problem(f"waited for {what}: {value} of {target} did within the time")
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)

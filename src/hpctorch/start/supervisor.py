"""One node's workers started by hpctorch itself (``Plan.starter == "hpctorch"``).

torch's elastic agent imports torch (about a second of CPU) before it starts any worker, and
without restarts it adds nothing the workers need: they rendezvous through torch's own env://
store (rank 0's TCPStore at MASTER_ADDR:MASTER_PORT). On several nodes local rank 0 of each
node first checks that the nodes agree (``agreement_worker``; the others wait for it before
``init_process_group``), and a helper per node runs the whole-job watchdog (``nodewatch``).
This keeps everything else: torchrun's environment contract, each worker through
``_worker.py`` (CPU and device lists, the faulthandler fallback), ``[rank R]:`` prefixed
output with a copy per rank in the log directory (torch's layout), the first failure named
with the survivors' stacks, the others stopped (SIGTERM, SIGKILL after ``STOP_GRACE_S``),
signals passed on, the closing summary. A Python command's workers are forked from one process
that imported torch once for the node (``standby.Standbys.start_now``): one import per node, not
one per local rank (a node of one worker starts it as its own process: ``standby.fork_enabled``);
``HPCTORCH_FORK_WORKERS=0`` starts each as its own process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from ..errors import HpctorchError
from ..guard.agreement_worker import read as read_agreement
from ..guard.goodput import Attempt, first_collective
from ..host.signals import PREEMPT_SIGNALS, STOP_SIGNALS
from ..plan.types import Plan
from ..plan.workerenv import torch_contract
from . import masterport, standby
from .raised import raised_at
from .workers import (
    STOP_GRACE_S,
    WorkersFailed,
    failure_line,
    first_reported,
    line_prefix,
    node_host,
    process_start,
    requeue_if_preempted,
    signal_groups,
    signal_processes,
    stacks_env,
    stragglers_env,
    worker_command,
)

POLL_S = 0.05


def _reserve(address: str, port: int) -> tuple[socket.socket | None, int]:
    """The port rank 0's store will listen on, held until the job ends: bound with
    SO_REUSEADDR and never listening, so torch's store (which sets SO_REUSEADDR too) can
    take it while no other process's bind can (32 jobs started at once never share one)."""
    if port:
        return None, port
    held = _hold(address, 0)
    return held, held.getsockname()[1]


def _hold(address: str, port: int) -> socket.socket:
    """``port`` (0: any) bound with SO_REUSEADDR and never listening (see ``_reserve``)."""
    held = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        held.bind((address, port))
    except OSError:
        held.close()
        raise
    return held


def _hold_watch_port(plan: Plan) -> socket.socket:
    """Node 0: the watchdog's port, held (as ``_reserve``) until it or its helper serves it (``_serve_watch``)."""
    try:
        return _hold(plan.master_addr or "", plan.watch_port)
    except OSError:
        raise HpctorchError(f"the watchdog's port {plan.watch_port} ({plan.reasons.get('watch_port', 'derived')}) is already in use on this node",
                            "pass another --master-port or --run-id (the port is derived from both)") from None


def _serve_watch(plan: Plan):  # type: ignore[no-untyped-def]
    """Node 0, where this process imported torch already (it served the master port,
    ``masterport``): the watchdog's store, served here, so the helper need not import torch for it
    (2-3 CPU-seconds and ~300 MB); None elsewhere, or where it cannot be served here (the helper
    then tries, and says why not)."""
    if not plan.is_master or "torch" not in sys.modules:
        return None
    from ..guard.nodewatch import serve

    try:
        return serve(plan)
    except Exception:  # noqa: BLE001 - torch raises several kinds; the helper tries again and says it
        return None


def _agreement_files(plan: Plan) -> tuple[str, str, str]:
    """A node-local directory (in /dev/shm where it can be, not the log directory nor a TMPDIR that
    may be on a shared file system: the waiting ranks and the helper poll the outcome's file), the
    node's plan in it, for local rank 0's agreement check and the helper, and the outcome's file."""
    from ..guard.nodewatch import paths
    from ..host.folders import polling_root

    state = tempfile.mkdtemp(prefix="hpctorch-node-", dir=polling_root())
    plan_file, result = paths(state)
    try:
        with open(plan_file, "w", encoding="utf-8") as out:
            out.write(plan.to_json())
    except OSError as exc:  # a full /dev/shm fails the write, which names no file
        shutil.rmtree(state, ignore_errors=True)
        raise OSError(exc.errno, exc.strerror, exc.filename or plan_file) from None
    return state, plan_file, result


def _worker_env(plan: Plan, local: int, port: int, error_file: str) -> dict[str, str]:
    worker = plan.workers[local]
    env = dict(os.environ)
    env.update(worker.env)
    env.update(torch_contract(worker.rank, local, plan.node_rank, plan.nproc_per_node, plan.master_addr or "127.0.0.1", port, plan.run_id))
    env.update(TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_USE_AGENT_STORE="False",
               TORCHELASTIC_ERROR_FILE=error_file)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # as torch's agent
    return env


_LINE_ENDS = re.compile(rb"(?<=\n)|(?<=\r)(?!\n)")  # after \n, or a lone \r


def _log_root(plan: Plan, log_dir: str | None) -> str:
    """This node's own folder for this run (``<log dir>/<run id>_node<N>_<unique>/attempt_0``,
    torch's agent's layout plus the node): with a --log-dir on a shared file system, no node
    writes another's files, and a requeued run never overwrites the last one's."""
    base = log_dir or tempfile.mkdtemp(prefix="hpctorch_")
    try:
        os.makedirs(base, exist_ok=True)
        return os.path.join(tempfile.mkdtemp(prefix=f"{plan.run_id}_node{plan.node_rank}_", dir=base), "attempt_0")
    except OSError as exc:
        raise HpctorchError(f"--log-dir {base}: {exc.strerror}", "give --log-dir a folder you can write (it is made if missing)") from None


class _Output:
    """Each worker's two streams: to ``<dir>/<local rank>/stdout.log``/``stderr.log`` as the
    bytes come (the stall watch counts them), and to the console with the rank's prefix (when
    shown) a line at a time, where a line also ends at ``\\r``: a progress bar (tqdm) redraws
    in place, prefixed, as it would without hpctorch."""

    def __init__(self, root: str, prefix: str, shown: set[int] | None) -> None:
        """``prefix``: the line prefix template torch's agent would get (``workers.line_prefix``)."""
        self.root, self.prefix, self.shown = root, prefix, shown
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def follow(self, rank: int, local: int, stream: IO[bytes], console: IO[str], name: str) -> None:
        path = os.path.join(self.root, str(local))
        os.makedirs(path, exist_ok=True)
        thread = threading.Thread(target=self._copy, args=(rank, stream, console, os.path.join(path, name)), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _copy(self, rank: int, stream: IO[bytes], console: IO[str], path: str) -> None:
        head = string.Template(self.prefix).safe_substitute(rank=rank)
        show = self.shown is None or rank in self.shown
        pending = b""
        with open(path, "wb") as log:
            for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
                log.write(chunk)
                log.flush()
                if not show:
                    continue
                lines = _LINE_ENDS.split(pending + chunk)
                pending = lines.pop()  # not ended yet
                self._show(console, head, [line for line in lines if line != b"\r"])  # tqdm's leading \r: nothing to show
            if show and pending:
                self._show(console, head, [pending + b"\n"])

    def _show(self, console: IO[str], head: str, lines: list[bytes]) -> None:
        if lines:
            text = "".join(head + line.decode("utf-8", errors="replace") for line in lines)
            with self.lock:
                console.write(text)
                console.flush()

    def drain(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def run_node(plan: Plan, log_dir: str | None = None, prefix: bool = True, console_ranks: set[int] | None = None,
             local_ranks: set[int] | None = None, quiet: bool = False, summary_json: str | None = None, requeue: bool = False,
             stall: tuple[float, str] | None = None) -> None:
    """Start this node's workers, wait for them; raises WorkersFailed naming the first failure.
    ``stall`` (``--stall-timeout``) is watched by the watchdog's helper across nodes, here on one."""
    started = process_start()
    os.environ.update(plan.common_env)
    stacks_env(os.environ)  # type: ignore[arg-type]
    straggle_dir = stragglers_env(os.environ, plan)  # type: ignore[arg-type]
    held, port = _reserve(plan.master_addr or "127.0.0.1", plan.master_port)
    several = plan.nnodes > 1
    alone = None
    watch_held = _hold_watch_port(plan) if several and plan.is_master else None
    from .. import timings

    timings.mark("workers started")
    os.environ.update(timings.worker_env(plan.node_rank, node_host(plan)))
    root = _log_root(plan, log_dir)
    shown = console_ranks if console_ranks is not None else ({w.rank for w in plan.workers if w.local_rank in local_ranks} if local_ranks else None)
    files = _agreement_files(plan) if several else None
    output = _Output(root, line_prefix(plan) if prefix else "", shown)
    has_lists = any(k in plan.common_env for k in ("HPCTORCH_CPU_SETS", "HPCTORCH_DEVICE_SETS"))
    workers: list[subprocess.Popen] = []
    forks = standby.Standbys(None, warm=False, fork_now=True) if standby.fork_enabled(os.environ, len(plan.workers)) else None
    helper = stalled = watch_store = None
    attempt: Attempt | None = None
    received: list[int] = []
    preempted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: received.append(signum)) for s in STOP_SIGNALS}
    # To each worker alone, as torch's agent does: its data loaders (same group) would die of it.
    previous.update({s: signal.signal(s, lambda signum, _f: (preempted.append(signum), signal_processes(workers, signum))) for s in PREEMPT_SIGNALS})
    try:
        for worker in plan.workers:
            local = worker.local_rank
            command = [part.replace("${local_rank}", str(local)) for part in worker_command(plan.command, has_lists)]
            error_file = _error_file(root, local)
            os.makedirs(os.path.dirname(error_file), exist_ok=True)
            env = _worker_env(plan, local, port, error_file)
            if files is not None:
                from ..guard.agreement_worker import AGREEMENT_ENV, RESULT_ENV, WAIT_ENV

                env.update({RESULT_ENV: files[2], WAIT_ENV: str(plan.rdzv_timeout + 60), **({AGREEMENT_ENV: files[1]} if local == 0 else {})})
                if local == 0 and plan.is_master and masterport.held():  # rank 0 asks for the port this process serves
                    env.update(masterport.hand_over(files[0], plan.run_id, plan.rdzv_timeout + 60))
            process = _start(command, env, forks, lambda: bool(received))
            workers.append(process)
            output.follow(worker.rank, local, process.stdout, sys.stdout, "stdout.log")  # type: ignore[arg-type]
            output.follow(worker.rank, local, process.stderr, sys.stderr, "stderr.log")  # type: ignore[arg-type]
        if several:
            from ..guard.nodewatch import Helper

            watch_store = _serve_watch(plan)
            helper = Helper(root, files[0], time.time() - started, stall,  # type: ignore[index]
                            run_id=plan.run_id if plan.is_master and watch_store is None else None, served=watch_store is not None)
        else:
            alone = _watch_alone(plan, straggle_dir)
            stalled = _watch_stall_alone(plan, root, stall)
        failure, final = _wait(plan, workers, _exit_times(workers), received, root, helper, files[2] if files else "", stalled)
        attempt = Attempt(time.monotonic(), first_collective(straggle_dir))  # before the folder goes: the goodput's
        if alone is not None:
            final = {**final, **alone.stop()}
    except (OSError, HpctorchError) as exc:
        # Reported as what it is (the CLI prints an OSError's cause and path), and the other nodes
        # are told: this node's workers are stopped, and theirs must not wait for them.
        _stop(workers)
        if helper is not None:
            told = exc.line() if isinstance(exc, HpctorchError) else f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            helper.end("failed", f"node {plan.node_rank}: hpctorch failed: {told}")
        raise
    finally:
        masterport.release()  # rank 0 never asked (it failed first): the port is let go with the run
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for socket_held in (held, watch_held):
            if socket_held is not None:
                socket_held.close()
        del watch_store  # node 0: once its helper said how the job ended (every node read it, or its wait ran out)
        if files is not None:
            shutil.rmtree(files[0], ignore_errors=True)
        if alone is not None:
            alone.stop()  # a second time after the wait: at once
        if stalled is not None:
            stalled.stop()
        if straggle_dir:
            shutil.rmtree(straggle_dir, ignore_errors=True)
        if forks is not None:
            forks.stop()  # once its children's exit codes are in: the zygote relays them
    output.drain()
    logs: str | None = os.path.dirname(root)
    if log_dir is None and failure is None:  # a temporary folder nobody asked for: the console had it all
        shutil.rmtree(os.path.dirname(logs), ignore_errors=True)
        logs = None
    failure = first_reported(failure, final.get("failures"))  # node 0 reads them all; a failed node, once its own is in
    if plan.is_master and (not quiet or summary_json):
        from ..guard.summary import report

        report(plan, started, final, logs, failure.exit_code if failure else 0, failure.line if failure else None,
               [attempt] if attempt else [], stalled, quiet, summary_json)
    requeue_if_preempted(plan, preempted, requeue)  # after the summary: the requeue ends this process (its scheduler's SIGTERM)
    if failure is not None:
        raise failure


def _start(command: Sequence[str], env: dict[str, str], forks: standby.Standbys | None, stopping: Callable[[], bool]) -> subprocess.Popen:
    """A worker, its output piped here: forked from the node's zygote where it can be, else started
    (also once a stop signal came while the zygote imported: the wait then stops them at once)."""
    if forks is not None and not stopping():
        pipes = [os.pipe(), os.pipe()]
        try:
            process = forks.start_now(command, env, (0, pipes[0][1], pipes[1][1]), stopping)
        finally:
            for _, write in pipes:
                os.close(write)
        if process is not None:
            process.stdout, process.stderr = (os.fdopen(read, "rb") for read, _ in pipes)
            return process
        for read, _ in pipes:
            os.close(read)
    try:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise HpctorchError(f"cannot start {command[0]!r}: {exc.strerror}", "check the command and PATH") from None


class _ExitClock(threading.Thread):
    """Waits for one worker to exit and notes when: the first failure is the first in time,
    not the lowest rank among those one poll found dead (a rank that crashes takes its peers
    down within milliseconds, and they would be named instead)."""

    def __init__(self, process: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.exited = self.exited_wall = float("inf")

    def run(self) -> None:
        self.process.wait()
        self.exited, self.exited_wall = time.monotonic(), time.time()


def _exit_times(workers: Sequence[subprocess.Popen]) -> list[_ExitClock]:
    clocks = [_ExitClock(process) for process in workers]
    for clock in clocks:
        clock.start()
    return clocks


def _watch_alone(plan: Plan, directory: str | None):  # type: ignore[no-untyped-def]
    """A one-node job's straggler watch (several nodes: the watchdog's helper runs it)."""
    from ..guard.stragglers import Alone, for_node

    watch = for_node(plan, directory, os.environ)
    return Alone(watch).start() if watch is not None else None


def _watch_stall_alone(plan: Plan, root: str, stall: tuple[float, str] | None):  # type: ignore[no-untyped-def]
    """A one-node job's ``--stall-timeout`` (several nodes: the watchdog's helper watches it)."""
    if stall is None:
        return None
    from ..guard.stallalone import AloneStall
    from ..guard.judge import StallWatch, logged_bytes
    from ..stacks.job import NodeStacks

    stacks = NodeStacks(plan, os.environ.get("HPCTORCH_STACKS_METHOD", "auto"))
    return AloneStall(StallWatch(stall[0], stall[1] == "kill", lambda: logged_bytes(root)), stacks).start()


def _wait(plan: Plan, workers: Sequence[subprocess.Popen], exits: Sequence[_ExitClock], received: list[int], root: str,  # type: ignore[no-untyped-def]
          helper, result: str, stalled=None) -> tuple[WorkersFailed | None, dict]:
    """Until all exit 0, or the first failure, signal, (several nodes) abort from another node or
    (one node, ``stalled``) a stall to stop for: then the survivors' stacks, and stop them.
    Returns the failure and node 0's view of every node."""
    while True:
        codes = [w.poll() for w in workers]
        dead = [i for i, code in enumerate(codes) if code not in (None, 0)]
        for i in dead:
            exits[i].join(1.0)  # its time is noted a moment after its exit code is seen
        # A rank that raised may still be on its way out when the peers it broke have exited:
        # the first to fail is the first to raise, else the first to exit.
        failed = _first_failure(plan, root, codes, dead, exits) if dead else None
        aborted = (helper or stalled).poll() if (helper or stalled) is not None else None
        if received or failed is not None or aborted:
            break
        if all(code == 0 for code in codes):
            return None, (helper.end("finished").get("final", {}) if helper is not None else {})
        time.sleep(POLL_S)
    if received and plan.is_master:
        # Said at once: the launcher's SIGKILL may follow within seconds (Slurm's KillWait), before the closing line.
        print(f"hpctorch: {signal.Signals(received[0]).name} received: the workers' stacks, then the workers are stopped",
              file=sys.stderr, flush=True)
    if helper is not None and failed is not None and not received and not aborted and read_agreement(result) is None:
        # Told before the survivors stop: node 0's hold rank 0's store, and the peers elsewhere would
        # break on it first and name themselves.
        early = _failure(plan, workers, received, root, failed, aborted, exits)
        helper.failing(early.line, early.at)
    from ..stacks.job import NodeStacks

    stacks = NodeStacks(plan, os.environ.get("HPCTORCH_STACKS_METHOD", "auto"))
    stacks.take_at_teardown(None)  # sent to node 0 by the helper
    _stop(workers)
    disagreed = read_agreement(result) if helper is not None and failed is not None else None
    if disagreed is not None:
        helper.end("quit")
        raise HpctorchError(disagreed["cause"], disagreed["fix"])
    failure = _failure(plan, workers, received, root, failed, aborted, exits)
    # What the other nodes print: which node a signal stopped (this node says "stopped by").
    told = f"node {plan.node_rank} was stopped by {signal.Signals(received[0]).name}" if received else failure.line
    ended = helper.end("aborted" if aborted else "failed", told, stacks.teardown, at=failure.at) if helper is not None else {}
    lines = ended.get("teardown") or stacks.teardown_summary()
    if lines and plan.is_master:
        print("\n".join(lines), file=sys.stderr, flush=True)
    return failure, ended.get("final", {})


def _failure(plan: Plan, workers: Sequence[subprocess.Popen], received: list[int], root: str, failed: int | None,
             aborted: str | None, exits: Sequence[_ExitClock]) -> WorkersFailed:
    if aborted:
        return WorkersFailed(f"stopped: {aborted}", exit_code=1)
    if received:
        name = signal.Signals(received[0]).name
        return WorkersFailed(f"stopped by {name}", exit_code=128 + received[0])
    assert failed is not None
    worker = plan.workers[failed]
    error_file = _error_file(root, worker.local_rank)
    where = error_file if os.path.exists(error_file) else "its output above"
    return failure_line(plan, worker.rank, worker.local_rank, workers[failed].returncode, where,
                        at=raised_at(error_file) or min(exits[failed].exited_wall, time.time()))


def _first_failure(plan: Plan, root: str, codes: Sequence[int | None], dead: list[int], exits: Sequence[_ExitClock]) -> int:
    """The first to raise (it may still be on its way out), else the first to exit."""
    raised = {i: raised_at(_error_file(root, plan.workers[i].local_rank)) for i, code in enumerate(codes) if code != 0}
    candidates = dead + [i for i, at in raised.items() if at is not None and i not in dead]
    return min(candidates, key=lambda i: raised.get(i) or exits[i].exited_wall)


def _error_file(root: str, local_rank: int) -> str:
    """torch's error file of a worker (TORCHELASTIC_ERROR_FILE): where it records what it raised."""
    return os.path.join(root, str(local_rank), "error.json")


def _stop(workers: Sequence[subprocess.Popen]) -> None:
    signal_groups(workers, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(w.poll() is None for w in workers) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    signal_groups(workers, getattr(signal, "SIGKILL", signal.SIGTERM))
    for worker in workers:
        worker.wait()

"""The whole-job watchdog when hpctorch starts the workers on several nodes (``supervisor``).

The supervisor imports no torch, so the watchdog (``JobWatchdog``, the same as under torch's
agent) runs in a helper process per node, ``python -m hpctorch.nodewatch LOGS STATE STARTUP_S``. It
imports torch only once the workers have (their agreement is done: ``agreement_worker``), after
``START_AFTER_S`` at the latest, or at once when the supervisor reports an end: the workers'
imports, on the critical path, get the CPU first. The watchdog's store at ``Plan.watch_port`` is a
store apart from the workers' (rank 0's, which ends with rank 0): the watchdog outlives any
worker, as it does in torch's agent. Node 0's supervisor serves it where it has imported torch
already (it served the master port: ``start.masterport``); else node 0's helper does. Every
helper reaches it with hpctorch's own client, so only a serving helper imports torch.

Messages are JSON lines. Supervisor to helper: ``{"stacks": [groups, dump]}`` (the survivors'
stacks, taken by the supervisor before it stopped them), then one ``{"end": "failed", "line":
...}``, ``"finished"``, ``"aborted"`` (after the helper's own abort) or ``"quit"``. Helper to
supervisor: ``{"connected": true}``, ``{"abort": reason}`` (another node failed: stop the
workers), and last ``{"final": ..., "teardown": [...]}`` (node 0: every node's state and stacks).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import IO

from .. import staged
from ..plan.types import Plan

PLAN_FILE = "plan.json"
RESULT_FILE = "agreed"
START_AFTER_S = 5.0
SERVED_ENV = "HPCTORCH_WATCH_SERVED"
"""Set for node 0's helper where its supervisor serves the watchdog's store (``serve``)."""
CONNECT_WAIT_S = 30.0
"""How long a node that failed waits for its helper to reach node 0's store to say so."""
FAILING_WAIT_S = 2.0
"""How long a failed node holds its survivors for the helper to put the failure in the store first."""
POLL_S = 0.05


def paths(state: str) -> tuple[str, str]:
    """In the node's private directory: its plan (for local rank 0's agreement and the helper)
    and the agreement's outcome."""
    return os.path.join(state, PLAN_FILE), os.path.join(state, RESULT_FILE)


class Helper:
    """The supervisor's side: starts the helper and talks to it."""

    def __init__(self, logs: str, state: str, startup_s: float, stall: tuple[float, str] | None = None,
                 run_id: str | None = None, served: bool = False) -> None:
        """``logs``: the workers' captured output; ``state``: the node's private directory
        (``paths``); ``stall``: ``--stall-timeout`` and ``--stall-action``, watched by the helper;
        ``run_id``: node 0's where the helper serves the store, under that run's secret (a 0600 file in
        ``state``); ``served``: node 0's supervisor serves the store (``serve``), the helper only watches."""
        watch = [f"{stall[0]:g}", stall[1]] if stall else []
        env = {**os.environ, SERVED_ENV: "1"} if served else None
        if run_id is not None:
            from .authority import SECRET_FILE_ENV, hand_secret

            hand_secret(run_id, os.path.join(state, "watch-secret"))
            env = {**os.environ, SECRET_FILE_ENV: os.path.join(state, "watch-secret")}
        self.process = subprocess.Popen([staged.python(), "-m", "hpctorch.guard.nodewatch", logs, state, f"{startup_s:.3f}", *watch],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, env=env)
        self.inbox: queue.Queue[dict | None] = queue.Queue()
        self.connected = False
        self.recorded = False
        self.abort: str | None = None
        self.final: dict = {}
        threading.Thread(target=_read, args=(self.process.stdout, self.inbox), daemon=True).start()

    def poll(self) -> str | None:
        """The abort reason, once the helper said another node failed."""
        while self.abort is None:
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                break
            self._take(message)
        return self.abort

    def _take(self, message: dict | None) -> None:
        if message is None:
            return
        self.connected = self.connected or bool(message.get("connected"))
        self.recorded = self.recorded or "recorded" in message  # answered, whether or not it got in
        self.abort = self.abort or message.get("abort")
        if "final" in message:  # JSON keys are strings; node numbers are not
            self.final = {"final": {kind: {int(n): v for n, v in values.items()} if isinstance(values, dict) else values
                                    for kind, values in message["final"].items()},
                          "teardown": message.get("teardown") or []}

    def failing(self, line: str, at: float | None, wait_s: float = FAILING_WAIT_S) -> None:
        """Tell every node of this node's failure before its survivors are stopped: until the helper
        says it is in the store, ``wait_s`` at most (nothing to wait for where it never connected)."""
        if self.process.stdin is None or self.process.stdin.closed:
            return
        self.poll()
        try:
            self._send({"failing": line, "at": at})
        except OSError:
            return
        if self._read_until(lambda: self.recorded, time.monotonic() + wait_s) is None:
            self.inbox.put(None)  # the helper's end, for end() to see too

    def end(self, how: str, line: str = "", stacks: tuple[list[dict], str | None] | None = None, wait_s: float = 15.0,
            at: float | None = None) -> dict:
        """Say how this node ended; the helper's closing message (empty if none came). A helper
        that never reached the store has nothing to say and is not waited for. Once only: a
        second call (an error after the first) returns what the first got."""
        if self.process.stdin is None or self.process.stdin.closed:
            return self.final
        self.poll()
        if not self.connected and how in ("finished", "quit"):
            self.process.kill()  # perhaps still importing torch: nothing to say, nobody to tell
            self._stop()
            return {}
        try:
            if stacks is not None:
                self._send({"stacks": list(stacks)})
            self._send({"end": how, "line": line, "at": at})
        except OSError:  # the helper is gone
            return {}
        self._read_until(lambda: bool(self.final), time.monotonic() + wait_s + (CONNECT_WAIT_S if not self.connected else 0))
        self._stop()
        return self.final

    def _read_until(self, done: Callable[[], bool], deadline: float) -> bool | None:
        """The helper's messages, taken until ``done()`` or the deadline; None once the helper ended."""
        while not done() and time.monotonic() < deadline:
            try:
                message = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if message is None:
                return None
            self._take(message)
        return done()

    def _send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def _stop(self) -> None:
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _read(stream: IO[bytes], inbox: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        try:
            inbox.put(json.loads(raw))
        except ValueError:
            continue
    inbox.put(None)


_sending = threading.Lock()


def _send(**message: object) -> None:
    with _sending:  # the watchdog's thread and the main one
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def serve(plan: Plan):  # type: ignore[no-untyped-def]
    """Node 0: the watchdog's store, served while referenced, with the record by which every node's
    watchdog authenticates it (under this process's seal for the run: ``authority.node0_seal``)."""
    from . import authority
    from .agreement import open_store

    served = open_store(plan, plan.rdzv_timeout, serve=True, port=plan.watch_port)
    authority.publish(served, replace(plan, master_port=plan.watch_port))
    return served


def _until_needed(result: str, inbox: queue.Queue) -> dict | None:
    """Wait (without torch) until the workers have imported theirs, or the supervisor speaks."""
    deadline = time.monotonic() + START_AFTER_S
    while time.monotonic() < deadline and not os.path.exists(result):
        try:
            return inbox.get(timeout=POLL_S) or {"end": "quit"}
        except queue.Empty:
            continue
    return None


def _seen(path: str) -> Callable[[], float | None]:
    """When (monotonic) ``path`` was first seen to exist: node 0's agreement, every node up."""
    seen: list[float] = []

    def when() -> float | None:
        if not seen and os.path.exists(path):
            seen.append(time.monotonic())
        return seen[0] if seen else None

    return when


def _ignore_signals() -> None:
    """The helper ends when its supervisor says so, or is gone (its stdin closes), never by a
    signal meant for the job: a launcher signals every process of the step (slurmstepd does,
    scancel --signal=USR1, Slurm's --signal), and a helper killed by a preemption signal, or by
    the SIGTERM its supervisor is about to report, would leave the job unwatched or silent."""
    import signal

    from ..host.signals import PREEMPT_SIGNALS, STOP_SIGNALS

    for sig in (*STOP_SIGNALS, *PREEMPT_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)


def main(argv: Sequence[str]) -> int:
    from ..stacks.job import NodeStacks

    _ignore_signals()

    logs, state, startup_s = argv[0], argv[1], float(argv[2])
    stall = (float(argv[3]), argv[4]) if len(argv) > 4 else None
    plan_file, result = paths(state)
    with open(plan_file, encoding="utf-8") as source:
        plan = Plan.from_dict(json.load(source))
    inbox: queue.Queue[dict | None] = queue.Queue()
    threading.Thread(target=_read, args=(sys.stdin.buffer, inbox), daemon=True).start()
    message = _until_needed(result, inbox)
    if message is not None and message.get("end") in ("finished", "quit"):
        return 0  # over before there was anything to watch
    from . import authority
    from .judge import StallWatch, logged_bytes
    from .straggler_worker import DIR_ENV
    from .stragglers import for_node
    from .watchdog import JobWatchdog

    try:
        # Node 0, unless its supervisor serves it: under the run's secret, handed over by the supervisor.
        served = serve(plan) if plan.is_master and not os.environ.get(SERVED_ENV) else None
    except authority.AuthError as exc:
        print(f"hpctorch: the watchdog's store is not served (the job runs without it): {exc.line()}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - torch raises several kinds here
        print(f"hpctorch: cannot serve the watchdog's store on port {plan.watch_port}: {str(exc).splitlines()[0]}; "
              "the job runs without it", file=sys.stderr, flush=True)
        return 1
    stacks = NodeStacks(plan, os.environ.get("HPCTORCH_STACKS_METHOD", "auto"), parent=os.getppid())
    # The workers' captured output (supervisor._Output writes <root>/<local rank>/*.log).
    watch = StallWatch(stall[0], stall[1] == "kill", lambda: logged_bytes(logs)) if stall else None
    watchdog = JobWatchdog(plan, plan.rdzv_timeout, on_abort=lambda reason: _send(abort=reason), startup_s=startup_s,
                           stacks=stacks, stall=watch, endpoint=(plan.master_addr or "", plan.watch_port), all_up=_seen(result),
                           stragglers=for_node(plan, os.environ.get(DIR_ENV), os.environ))
    watchdog.start()
    threading.Thread(target=lambda: watchdog.connected.wait() and _send(connected=True), daemon=True).start()
    while message is None or "end" not in message:
        if message is not None and "stacks" in message:
            stacks.teardown = (message["stacks"][0], message["stacks"][1])
        if message is not None and "failing" in message:
            at = message.get("at")
            watchdog.connected.wait(FAILING_WAIT_S)
            _send(recorded=watchdog.record_failure(message["failing"], float(at) if isinstance(at, (int, float)) else None))
        message = inbox.get() or {"end": "quit"}  # None: the supervisor is gone
    how = message["end"]
    if how in ("failed", "aborted"):
        watchdog.connected.wait(CONNECT_WAIT_S)
        stacks.send_teardown(watchdog.store)
    if how == "failed":
        at = message.get("at")
        watchdog.report_failure(message["line"], float(at) if isinstance(at, (int, float)) else None)
    elif how == "finished":
        watchdog.finished()
    else:
        watchdog.close()
    _send(final=watchdog.final, teardown=watchdog.teardown_lines)
    del served  # node 0: the store goes once every node has read how the job ended (the watchdog lingered)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: the reader thread may hold stdin's lock ("Fatal Python error:
    # _enter_buffered_busy ... at interpreter shutdown", seen on 3 nodes), and torch's store may be open.
    os._exit(code)

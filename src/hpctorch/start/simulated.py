"""``--simulate-nodes N``: N node agents on this machine, each running the per-node plan a
real node would get (``launch.run_per_node``), on loopback.

The agents are forked from this process once it has imported torch's agent: the nodes of one
machine share one import of torch (2-3 CPU-seconds and ~300 MB each, where each real node, another
machine, makes its own). Started as their own processes instead where
the workers run another interpreter (``--stage-env``: the copy's), where this process already
runs threads (a fork copies their locks, not them), or with ``HPCTORCH_FORK_AGENTS=0``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .. import staged
from ..errors import HpctorchError
from ..host.signals import PREEMPT_SIGNALS, STOP_SIGNALS
from ..plan.types import Plan
from .launch import run_per_node
from .workers import STOP_GRACE_S, WorkersFailed, signal_groups

FORK_ENV = "HPCTORCH_FORK_AGENTS"
PLAN_ENV = "HPCTORCH_AGENT_PLAN"
OUTPUT_ENV = "HPCTORCH_AGENT_OUTPUT"
SIMULATED_TEARDOWN_S = 15.0
"""After one simulated node failed: how long the others get to end by themselves."""


def run_agent_from_env() -> int:
    """Entry point of one simulated node's agent: run the plan handed over in the env."""
    plan = Plan.from_dict(json.loads(os.environ.pop(PLAN_ENV)))
    log_dir = os.environ.pop("HPCTORCH_AGENT_LOG_DIR", None)
    output = json.loads(os.environ.pop(OUTPUT_ENV, "{}"))
    from .. import timings

    timings.enable_from(bool(output.get("timings")))
    from . import torchlogs

    torchlogs.shown = bool(output.get("verbose"))
    console = output.get("console_ranks")
    try:
        run_per_node(plan, log_dir=log_dir, prefix=output.get("prefix", True), console_ranks=set(console) if console is not None else None,
                     quiet=output.get("quiet", False), summary_json=output.get("summary_json"),
                     local_ranks=set(output["local_ranks"]) if output.get("local_ranks") is not None else None,
                     stall=tuple(output["stall"]) if output.get("stall") else None)  # type: ignore[arg-type]
    except (HpctorchError, WorkersFailed) as exc:
        if not isinstance(exc, WorkersFailed) or not _said(output.get("result"), exc.line):
            print(f"hpctorch node {plan.node_rank}: {exc}", file=sys.stderr, flush=True)
        return getattr(exc, "exit_code", 2)
    return 0


def _said(path: str | None, line: str) -> bool:
    """Hand this node's closing line to the parent, which says the job's (node 0's) once."""
    if not path:
        return False
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(line)
    except OSError:
        return False
    return True


def _closing_line(folder: str, failed: int) -> str | None:
    """Node 0's closing line (it names the job's first failure), else the failed node's."""
    for node in (0, failed):
        try:
            with open(os.path.join(folder, str(node)), encoding="utf-8") as handle:
                return handle.read().strip() or None
        except OSError:
            continue
    return None


def run_simulated(plan: Plan, log_dir: str | None = None, prefix: bool = True, console_ranks: set[int] | None = None,
                  quiet: bool = False, summary_json: str | None = None, local_ranks: set[int] | None = None,
                  stall: tuple[float, str] | None = None) -> None:
    """One agent process per simulated node; when one fails, stop them all."""
    from .. import timings
    from . import torchlogs

    agents: list[subprocess.Popen | _Forked] = []
    said = tempfile.mkdtemp(prefix="hpctorch-simulated-")  # 0700, ours: where each agent leaves its closing line
    forked = _can_fork()
    for node_plan in plan.node_plans:
        env = dict(os.environ)
        env[PLAN_ENV] = json.dumps(node_plan.to_dict())
        env[OUTPUT_ENV] = json.dumps({"prefix": prefix, "console_ranks": sorted(console_ranks) if console_ranks is not None else None,
                                      "quiet": quiet, "summary_json": summary_json if node_plan.is_master else None,
                                      "local_ranks": sorted(local_ranks) if local_ranks is not None else None, "stall": stall,
                                      "timings": timings.enabled, "verbose": torchlogs.shown,
                                      "result": os.path.join(said, str(node_plan.node_rank))})
        if log_dir:
            env["HPCTORCH_AGENT_LOG_DIR"] = os.path.join(log_dir, f"node{node_plan.node_rank}")
        # Each agent leads its own process group, so stopping it reaches its workers too.
        agents.append(_fork_agent(env) if forked else subprocess.Popen([staged.python(), "-m", "hpctorch.start.agent"], env=env,
                                                                       start_new_session=True))

    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        signal_groups(agents, signum)

    def pass_on(signum: int, _frame: object) -> None:
        for agent in agents:
            if agent.poll() is None:
                os.kill(agent.pid, signum)  # each agent forwards it to its workers

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    previous.update({s: signal.signal(s, pass_on) for s in PREEMPT_SIGNALS})
    try:
        failed: int | None = None
        while True:
            codes = [agent.poll() for agent in agents]  # poll every agent, every pass
            if all(code is not None for code in codes):
                break
            if failed is None:
                failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
                if failed is not None:
                    # The others' watchdogs end them and node 0 gathers their last stacks, as on
                    # real nodes; stopped from here only if they have not ended by then.
                    deadline, stopping = time.monotonic() + SIMULATED_TEARDOWN_S, signal.SIGTERM
            elif time.monotonic() > deadline:
                signal_groups(agents, stopping)
                deadline, stopping = time.monotonic() + STOP_GRACE_S, signal.SIGKILL
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        if received:
            raise WorkersFailed(f"stopped by signal {received[0]}", exit_code=128 + received[0])
        if failed is None:
            failed = next((i for i, a in enumerate(agents) if a.returncode != 0), None)
        if failed is not None:
            code = agents[failed].returncode
            line = _closing_line(said, failed) or f"simulated node {failed} failed (exit {code})"
            raise WorkersFailed(f"{line}; the other nodes were stopped", exit_code=code if code > 0 else 1)
    finally:
        shutil.rmtree(said, ignore_errors=True)


def _can_fork() -> bool:
    """Whether the agents can be forked from here (see the module's docstring); if so, what
    they import first is imported now, once."""
    import threading

    if os.environ.get(FORK_ENV, "1") == "0" or staged.python() != sys.executable or threading.active_count() > 1 or not hasattr(os, "fork"):
        return False
    import importlib

    importlib.import_module("torch.distributed.launcher.api")  # the agents' first import (launch.run_per_node), made once
    return threading.active_count() == 1  # torch's import started none


class _Forked:
    """A forked agent, as ``run_simulated`` and ``signal_groups`` use a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _fork_agent(env: dict[str, str]) -> _Forked:
    """One agent, forked: in a session of its own, with ``env`` as its environment and the signal
    dispositions a new interpreter has, it runs as ``python -m hpctorch.start.agent`` would."""
    sys.stdout.flush()
    sys.stderr.flush()  # what is buffered here would be written again by each child
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:
        os.setsid()
        for sig in (*STOP_SIGNALS, *PREEMPT_SIGNALS):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        code = run_agent_from_env()
    except BaseException:  # noqa: BLE001 - said, then this child ends: it must never return into the parent's code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as hpctorch.start.agent: no interpreter teardown of torch, nor of the parent's state

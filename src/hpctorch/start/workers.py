"""What both starters (torch's agent through ``launch``, hpctorch's own ``supervisor``) do
with a node's workers: their command line, the variables for ``hpctorch stacks``, the output
prefix, signals, the line that names a failed rank, and the requeue after a preemption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from .. import staged
from ..errors import HpctorchError
from ..plan.types import Plan, is_python

STOP_GRACE_S = 3
REQUEUE_EXCLUDE_S = 10.0
"""How long node 0 keeps trying to leave the bad nodes out of a job it just requeued."""
WORKER_ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_worker.py")  # a stable path: running jobs name it


class WorkersFailed(Exception):
    """Training processes failed; ``line`` names the first failure, ``at`` (wall clock) when a rank
    of this node raised or died, where it did."""

    def __init__(self, line: str, exit_code: int = 1, at: float | None = None) -> None:
        super().__init__(line)
        self.line = line
        self.exit_code = exit_code
        self.at = at


def first_reported(own: WorkersFailed | None, reported: object) -> WorkersFailed | None:
    """A node's closing line names the job's first failure: its own rank's, or one that another
    node reported as earlier (``watchdog`` failure records: line and time; node 0 reads them at the
    end, a failed node once its own is in). A rank broken by a peer that raised (``Connection closed
    by peer``) often dies before that peer's node has told anyone. A stop (a signal, an abort, a
    silent node) is said as it is."""
    if own is None or own.at is None or not isinstance(reported, dict):
        return own
    records = [r for r in reported.values() if isinstance(r, dict) and isinstance(r.get("at"), (int, float))
               and isinstance(r.get("line"), str) and r["line"]]
    first = min(records, key=lambda r: float(r["at"]), default=None)
    if first is None or float(first["at"]) >= own.at:
        return own
    from ..terminal import printable

    return WorkersFailed(printable(first["line"], lines=False), exit_code=own.exit_code, at=float(first["at"]))


def worker_command(command: Sequence[str], per_rank_lists: bool) -> tuple[str, ...]:
    """What each worker runs: a Python script or module through ``_worker.py`` (in the same
    process: it registers the faulthandler ``hpctorch stacks`` falls back on, and applies
    per-rank CPU and device lists); another command through it only for those lists. Under
    ``--stage-env`` the interpreter is the node-local copy's."""
    python, entry = staged.python(), staged.map_path(WORKER_ENTRY)  # the node-local copy's under --stage-env
    if is_python(command):
        return (python, "-u", entry, *command[2:])
    if per_rank_lists:
        return (python, entry, "--exec", *command)
    return tuple(command)


def stacks_env(env: dict[str, str]) -> None:
    from ..host.folders import faulthandler_dir

    try:
        env.setdefault("HPCTORCH_STACKS_DIR", faulthandler_dir())
    except OSError:
        pass  # no fallback for hpctorch stacks; py-spy still works


def stragglers_env(env: dict[str, str], plan: Plan) -> str | None:
    """The folder where this node's workers leave their time inside collectives
    (``straggler_worker``), in ``env``; None when the watch is off or the folder unsafe."""
    from ..guard.straggler_worker import DIR_ENV
    from ..guard.stragglers import Settings

    if Settings.from_env(env) is None:
        env.pop(DIR_ENV, None)
        return None
    from ..host.folders import stragglers_dir

    try:
        env[DIR_ENV] = stragglers_dir(plan.run_id, plan.node_rank)
    except (OSError, HpctorchError) as exc:
        print(f"hpctorch: no straggler watch on this node: {exc.line() if isinstance(exc, HpctorchError) else exc}", file=sys.stderr)
        env.pop(DIR_ENV, None)
        return None
    return env[DIR_ENV]


def node_host(plan: Plan) -> str:
    import socket

    return plan.nodes[plan.node_rank] if plan.nodes and plan.node_rank < len(plan.nodes) else socket.gethostname()


def line_prefix(plan: Plan) -> str:
    """torch's per-line prefix template: the global rank, and the node when there are several."""
    if plan.nnodes == 1:
        return "[rank ${rank}]: "
    if not plan.node_rank_known:
        import socket

        where = socket.gethostname()
    else:
        where = plan.nodes[plan.node_rank] if plan.nodes else f"node {plan.node_rank}"
    return f"[{where} rank ${{rank}}]: "


def process_start() -> float:
    """When this hpctorch process started (seconds since the epoch): wall time and start-up
    figures count from there, not from the launch."""
    from ..timings import start_time

    return start_time()


def signal_groups(processes: Sequence[subprocess.Popen], sig: int) -> None:
    """``sig`` to each live process's group (a worker's data loaders, an agent's workers),
    or to the process alone where there are no groups (Windows)."""
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, sig) if hasattr(os, "killpg") else process.send_signal(sig)
            except (ProcessLookupError, PermissionError):
                pass


def signal_processes(processes: Sequence[subprocess.Popen], sig: int) -> None:
    """``sig`` to each live process alone, not its group (a preemption notice: the worker's
    handler checkpoints; its data loaders would die of a SIGUSR1)."""
    for process in processes:
        if process.poll() is None:
            try:
                process.send_signal(sig)
            except (ProcessLookupError, PermissionError):
                pass


def requeue_if_preempted(plan: Plan, preempted: Sequence[int], requeue: bool) -> None:
    """After a preemption signal, node 0 asks the scheduler to requeue the job. The requeue ends
    this very job, this process with it (Slurm's SIGTERM, then SIGKILL after its KillWait): the
    signals that end it are held off until the line that says what was done is printed."""
    if not (requeue and preempted and plan.node_rank == 0 and plan.job_id):
        return
    command = list(plan.requeue)
    if not command:
        print(f"hpctorch: --requeue: {plan.scheduler} has no requeue command; not requeued", file=sys.stderr)
        return
    from ..host.signals import STOP_SIGNALS

    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        _requeue(plan, preempted, command)
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _requeue(plan: Plan, preempted: Sequence[int], command: Sequence[str]) -> None:
    nodes, note = _bad_nodes()
    refusal = _leave_out(plan, nodes) if nodes and plan.requeue_exclude else None
    try:
        done = subprocess.run([*command, plan.job_id or ""], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"hpctorch: --requeue: {command[0]} failed: {exc}", file=sys.stderr)
        return
    if done.returncode == 0 and refusal is not None:
        refusal = _leave_out_once_pending(plan, nodes)
    if nodes:
        from ..schedulers import hostlist

        shown = hostlist.compress(nodes)
        note = (f"; {plan.scheduler} cannot leave out the bad nodes {shown}" if not plan.requeue_exclude else
                f"; could not leave out the bad nodes {shown}: {refusal}" if refusal is not None else f"; bad nodes left out: {shown}")
    outcome = "requeued" if done.returncode == 0 else f"not requeued: {done.stderr.strip()}"
    print(f"hpctorch: preempted by {signal.Signals(preempted[0]).name}; job {plan.job_id} {outcome}{note}", file=sys.stderr, flush=True)


def mark_bad(plan: Plan, reason: str) -> None:
    from ..host import badnodes

    try:
        badnodes.add(os.environ, [node_host(plan)], reason, plan.job_id)
        print(f"hpctorch: {node_host(plan)} added to the bad-node list ({badnodes.path(os.environ)}): {reason}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - advice for the next job: never in the way of this one's report
        print(f"hpctorch: {node_host(plan)} not added to the bad-node list: {exc}", file=sys.stderr)


def _bad_nodes() -> tuple[list[str], str]:
    """The user's bad nodes, and what to say when the list could not be read."""
    from ..host import badnodes

    try:
        return badnodes.names(os.environ), ""
    except Exception as exc:  # noqa: BLE001 - the list is advice: a broken one must not stop the requeue
        return [], f"; the bad-node list was not read ({exc})"


def _leave_out_once_pending(plan: Plan, nodes: Sequence[str], within_s: float = REQUEUE_EXCLUDE_S) -> str | None:
    """Slurm changes the excluded nodes of a pending job only ("Job is no longer pending
    execution" while it runs): the change is tried again until the requeued job waits pending,
    for ``within_s`` at most (the caller holds off the signals that end this process)."""
    deadline = time.monotonic() + within_s
    while True:
        refusal = _leave_out(plan, nodes)
        if refusal is None or time.monotonic() > deadline:
            return refusal
        time.sleep(0.5)


def _leave_out(plan: Plan, nodes: Sequence[str]) -> str | None:
    """The scheduler's command that leaves ``nodes`` out of the requeued job; None when it
    did, else why not."""
    from ..schedulers import hostlist

    shown = hostlist.compress(list(nodes))
    command = [part.replace("{job}", plan.job_id or "").replace("{nodes}", shown) for part in plan.requeue_exclude]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def first_failure(error):  # type: ignore[no-untyped-def]
    """torch's ChildFailedError's first failure. Where no rank raised, torch's own choice. Where one
    did, by when each failed (``failed_at``): a rank that raised, when its error file says (it may
    have been stopped on its way out, after the peers its exception broke had exited), any other
    when it exited (else when torch saw it fail, in whole seconds rounded down: within the same
    second a death outranks the errors it causes); a rank stopped by SIGTERM (how torch stops
    workers) never outranks another failure."""
    from .raised import raised_at

    raised = {rank: at for rank, failure in error.failures.items() if (at := raised_at(failure.error_file)) is not None}
    if not raised:
        return error.get_first_failure()
    causes = [r for r, f in error.failures.items() if r in raised or f.exitcode != -signal.SIGTERM] or list(error.failures)
    rank = min(causes, key=lambda r: (raised.get(r) or _died_at(error.failures[r]), r in raised))
    return rank, error.failures[rank]


def failed_at(failure) -> float:  # type: ignore[no-untyped-def]
    """When a worker of torch's agent failed (wall clock): when it raised, else when it died."""
    from .raised import raised_at

    return raised_at(failure.error_file) or _died_at(failure)


def _died_at(failure) -> float:  # type: ignore[no-untyped-def]
    """When it exited (``exits``), else the whole second torch noticed it."""
    from .exits import exited_at

    return exited_at(failure.pid) or float(failure.timestamp)


def failure_line(plan: Plan, rank: int, local_rank: int, code: int, where: str, at: float | None = None) -> WorkersFailed:
    """The first failure, as every node prints it: which rank, on which node, how, where to look.
    A rank killed by SIGBUS (an uncorrectable memory error, as the kernel reports one) puts
    its node on the user's bad-node list: the next job asks the scheduler to leave it out."""
    from .raised import read

    raised = read(where) if where.endswith(".json") else None
    if raised:
        code = 1  # it raised: stopped on its way out (SIGTERM at teardown) is not how it failed
    how = f"raised {raised}" if raised else (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
    if code == -getattr(signal, "SIGBUS", 0) and plan.nnodes > 1:
        mark_bad(plan, f"rank {rank} died of SIGBUS (a memory error)")
    host = f" ({plan.nodes[plan.node_rank]})" if plan.nodes and plan.node_rank < len(plan.nodes) else ""
    node = f" on node {plan.node_rank}{host}" if plan.nnodes > 1 else ""
    return WorkersFailed(f"rank {rank}{node} (local rank {local_rank}) {how}; details: {where}", exit_code=128 - code if code < 0 else 1, at=at)

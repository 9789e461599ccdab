"""Acting on a Plan: per-node through torch's elastic launcher, per-task by exec."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence

from ..errors import HpctorchError
from ..host.signals import PREEMPT_SIGNALS
from ..plan.types import ROLE, Plan
from . import spares
from .spares import Seat
from .workers import (
    STOP_GRACE_S,
    WorkersFailed,
    failed_at,
    failure_line,
    first_failure,
    first_reported,
    line_prefix,
    mark_bad,
    node_host,
    process_start,
    requeue_if_preempted,
    stacks_env,
    stragglers_env,
    worker_command,
)


def _file_store_env(plan: Plan, env: dict[str, str]) -> None:
    """``--rdzv-backend file``: the workers' FileStore (``filestore``), and the agents' backend."""
    if plan.rdzv_backend != "file":
        return
    from ..host.folders import private_dir
    from ..plan.decide import default_file_store_dir
    from . import filestore

    directory = plan.rdzv_conf["path"]
    try:
        if directory == default_file_store_dir():  # ours, under the shared /tmp: private
            private_dir(os.path.dirname(directory))
            private_dir(directory)
        else:  # the user's own choice (--rdzv-endpoint DIR), shared by nodes
            os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise HpctorchError(f"--rdzv-backend file: cannot create {directory}: {exc.strerror}", "give a writable directory with --rdzv-endpoint DIR") from None
    env[filestore.WORKERS_ENV] = filestore.paths(directory, plan.run_id)[1]
    if plan.mode == "per-node":
        filestore.register()


def exec_per_task(plan: Plan, base_env: Mapping[str, str] | None = None) -> None:
    """Replace this process with the worker: no extra process, no torch import."""
    env = dict(os.environ if base_env is None else base_env)
    env.update(plan.workers[0].env)
    from ..host.cpulist import bind_to

    bind_to(env.get("HPCTORCH_CPUS", ""))  # the exec keeps it
    command = worker_command(plan.command, per_rank_lists=False)
    if command != tuple(plan.command):
        stacks_env(env)
        _task_stragglers_env(plan, env)
        _file_store_env(plan, env)
        from .. import timings

        timings.mark("exec of the rank")
        env.update(timings.worker_env(plan.node_rank, node_host(plan)))
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        raise HpctorchError(f"cannot start {plan.command[0]!r}: {exc.strerror}", "check the command and PATH") from None


def _task_stragglers_env(plan: Plan, env: dict[str, str]) -> None:
    """Per task: every rank of a node leaves its figures in the node's folder (left for the next
    run's sweep: no process outlives the ranks); the node's local rank 0 is its node's side of the
    watch (``straggler_worker``)."""
    from ..guard.stragglers import PER_TASK_ENV, per_task_spec

    if stragglers_env(env, plan) and plan.node_rank_known and plan.workers[0].local_rank == 0:
        env[PER_TASK_ENV] = per_task_spec(plan)
    else:
        env.pop(PER_TASK_ENV, None)


def exec_relaunch(plan: Plan, hpctorch_argv: Sequence[str]) -> None:
    """From a batch script: become ``srun ... hpctorch <same arguments>``, one per node."""
    command = [*plan.relaunch, sys.executable, "-m", "hpctorch", *hpctorch_argv]
    print(f"hpctorch: {plan.reasons['mode']}", file=sys.stderr, flush=True)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        raise HpctorchError(
            f"cannot start {command[0]!r} to launch the job step: {exc.strerror}",
            f"run '{' '.join(plan.relaunch)} hpctorch run ...' in the job script yourself",
        ) from None


def _logs_specs(plan: Plan, log_dir: str | None, tee: str | None, redirects: str | None, console_ranks: set[int] | None,  # type: ignore[no-untyped-def]
                local_ranks: set[int] | None = None):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    specs_class = DefaultLogsSpecs
    if plan.agent.get("logs_specs"):  # torchrun's --logs-specs: an entry point name
        from torch.distributed.run import _get_logs_specs_class

        specs_class = _get_logs_specs_class(str(plan.agent["logs_specs"]))
    local_filter = local_ranks
    if console_ranks is not None:
        base = sum(plan.nproc_per_node[: plan.node_rank])
        local_filter = {rank - base for rank in console_ranks if 0 <= rank - base < plan.nproc_per_node[plan.node_rank]}
        # torch reads an empty filter as "show everyone"; -1 matches no local rank.
        local_filter = local_filter or {-1}
    return specs_class(
        log_dir=log_dir,
        redirects=Std.from_str(redirects or "0"),
        tee=Std.from_str(tee or "0"),
        local_ranks_filter=local_filter,
    )


def run_per_node(
    plan: Plan,
    log_dir: str | None = None,
    tee: str | None = None,
    redirects: str | None = None,
    requeue: bool = False,
    prefix: bool = True,
    console_ranks: set[int] | None = None,
    quiet: bool = False,
    summary_json: str | None = None,
    local_ranks: set[int] | None = None,
    stall: tuple[float, str] | None = None,
    seat: Seat | None = None,
) -> None:
    """Start this node's workers with torch's elastic agent and wait for them.

    With ``prefix`` (the default) every line a worker prints reaches the terminal as
    ``[host rank R]: line`` and is also kept per rank under ``log_dir`` (a temporary
    directory unless given): torch's tee does both. Node 0 ends with a one-line summary
    (unless ``quiet``), also written as JSON to ``summary_json``. ``stall`` is
    ``--stall-timeout`` and ``--stall-action``. When the job is torn down, node 0 first prints
    the stacks the surviving workers were in. ``seat``: this node's part where hot spares wait
    (``spares``).
    """
    from torch.distributed.launcher.api import elastic_launch

    from . import exitbarrier, exits, gpurelease, raised, roundwake, torchlogs

    torchlogs.quiet()
    exits.install()
    gpurelease.install()
    roundwake.install()
    exitbarrier.install()
    raised.tolerate_torn_error_files()
    assert plan.master_addr is not None, "the exchange runs before the final plan"
    os.environ.update(plan.common_env)
    stacks_env(os.environ)  # type: ignore[arg-type]
    straggle_dir = stragglers_env(os.environ, plan)  # type: ignore[arg-type]
    from . import standby

    warm = standby.enabled(os.environ, plan.max_restarts)
    fork = standby.fork_enabled(os.environ, len(plan.workers), warm)
    standbys = standby.install(straggle_dir, warm=warm, fork=fork) if warm or fork else None
    _file_store_env(plan, os.environ)  # type: ignore[arg-type]
    specs = _logs_specs(plan, log_dir, tee or ("3" if prefix else None), redirects, console_ranks, local_ranks)
    config = _launch_config(plan, specs, prefix, seat)
    if plan.max_restarts and plan.rdzv_backend == "c10d":
        # torch's c10d rendezvous shares one store with the workers across restarts, and a
        # node restarted by a peer's failure keeps its restart count, so restarted workers
        # read the dead ones' addresses (pytorch/pytorch#135712, #167288); torch's opt-out
        # gives each round a fresh store.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousError

    from ..guard import agreement, authority
    from ..guard.judge import StallWatch, logged_bytes
    from ..guard.stallalone import AloneStall
    from ..guard.watchdog import JobWatchdog
    from ..stacks.job import NodeStacks, install_teardown_capture
    from .attempts import EXIT_NO_PROGRESS, Attempts, NoProgress, limit_from

    # Held until the launch returns: torch's static rendezvous serves through it. Under torch's
    # c10d rendezvous the store is its host's (maybe not node 0): no agreement check there.
    master_store = None  # noqa: F841
    if plan.nnodes > 1 and plan.watched and plan.rdzv_backend == "static":
        master_store = agreement.check(plan, plan.rdzv_timeout)  # noqa: F841
    elif plan.rdzv_conf.get("is_host") == "true":
        # torch's c10d rendezvous serves the store from here; opened first (multi-tenant, torch
        # reuses it) so it outlives the launch and node 0 can tell every node how the job ended.
        # With the record by which every node's watchdog authenticates it.
        served = agreement.open_store(plan, plan.rdzv_timeout, serve=True)
        master_store = authority.sealed(served, plan, plan.rdzv_timeout, serve=True)  # noqa: F841
    from .. import timings

    timings.mark("agreement done" if plan.nnodes > 1 and plan.watched and plan.rdzv_backend == "static" else "store ready")
    os.environ.update(timings.worker_env(plan.node_rank, node_host(plan)))
    started = process_start()
    stacks = NodeStacks(plan, os.environ.get("HPCTORCH_STACKS_METHOD", "auto"))
    # This node's folder of this run once torch's agent made it (DefaultLogsSpecs keeps it in
    # _run_log_dir), never the whole --log-dir: that holds every node's and every run's files.
    watch = StallWatch(stall[0], stall[1] == "kill", lambda: logged_bytes(getattr(specs, "_run_log_dir", specs.root_log_dir))) if stall else None

    def stop_workers(_reason: str) -> None:
        # SIGTERM to this process: torch's agent stops its workers. Not while it already
        # does (this node failed too): a signal then would cut its teardown short.
        if not stacks.tearing_down:
            os.kill(os.getpid(), signal.SIGTERM)

    attempts = Attempts(straggle_dir, limit_from(os.environ) if plan.max_restarts else 0)

    def attempt_ended(context: object) -> None:
        if plan.max_restarts:
            stacks.tearing_down = False  # a restart follows
        attempts.ended(context)  # NoProgress from here ends torch's agent

    from ..guard.stragglers import Alone, for_node

    straggle = for_node(plan, straggle_dir, os.environ) if seat is None or not seat.spare else None  # node 0 reads the seated nodes'
    watchdog = JobWatchdog(plan, connect_timeout_s=plan.rdzv_timeout, on_abort=stop_workers, startup_s=time.time() - started,
                           stacks=stacks, stall=watch if plan.nnodes > 1 else None, stragglers=straggle if plan.nnodes > 1 else None,
                           spares=seat.spares if seat is not None else 0)
    alone = Alone(straggle).start() if straggle is not None and plan.nnodes == 1 else None
    # One node: no store shared with other nodes to judge a stall through (its port may be torch's
    # to choose): watched here.
    stalled = AloneStall(watch, stacks, on_kill=stop_workers).start() if watch is not None and plan.nnodes == 1 else None
    install_teardown_capture(lambda: stacks.take_at_teardown(watchdog.store), after=attempt_ended,
                             failed=seat.failed if seat is not None else None)
    if seat is not None:
        spares.seat_for(seat)
        if seat.spare:
            signal.signal(signal.SIGTERM, spares.stop_waiting)
    if plan.watched:
        watchdog.start()
    preempted = _forward_preemption_to_children()
    failure: WorkersFailed | None = None
    requeue_after = False  # the workers ended, preempted or not: requeued once the summary is out (the requeue ends this process)
    try:
        command = worker_command(plan.command, any(k in plan.common_env for k in ("HPCTORCH_CPU_SETS", "HPCTORCH_DEVICE_SETS")))
        elastic_launch(config, command[0])(*command[1:])
    except ChildFailedError as exc:
        rank, first = first_failure(exc)
        where = first.error_file if os.path.exists(first.error_file) else (log_dir or "its output above")
        failure = failure_line(plan, rank, first.local_rank, first.exitcode, where, at=failed_at(first))
        watchdog.report_failure(failure.line, failure.at)
        requeue_after = True
    except NoProgress as exc:
        watchdog.report_failure(f"node {plan.node_rank}: {exc.line().removeprefix('stopped: ')}")
        failure = WorkersFailed(exc.line(), exit_code=EXIT_NO_PROGRESS)
    except SignalException as exc:
        reason = watchdog.reason or (stalled.poll() if stalled is not None else None)
        if reason:
            watchdog.close()
            failure = WorkersFailed(f"stopped: {reason}", exit_code=1)
        else:
            # The agent already stopped its workers; say so once and keep 128+signal.
            watchdog.report_failure(f"node {plan.node_rank} was stopped by {exc.sigval.name}")
            failure = WorkersFailed(f"stopped by {exc.sigval.name}", exit_code=128 + int(exc.sigval))
    except spares.Replaced as exc:
        watchdog.replaced()
        host = seat.host if seat else node_host(plan)
        print(f"hpctorch: {host} leaves the job: {exc}; a hot spare takes its place", file=sys.stderr, flush=True)
        if exc.exit_code == -getattr(signal, "SIGBUS", 0):  # a memory error, as failure_line counts one
            mark_bad(plan, f"{exc} (replaced by a hot spare)")
        return
    except spares.SpareDone as exc:
        watchdog.close()
        print(f"hpctorch: {seat.host if seat else node_host(plan)}: hot spare not needed ({exc})", file=sys.stderr, flush=True)
        return
    except RendezvousClosedError:
        # A node that used up its restarts closes torch's rendezvous; the others learn it here.
        watchdog.close()
        if watchdog.reason is None and attempts.last_failure is not None:
            # This node asked for the restart: its failure is the job's, and the others would not follow.
            failure = WorkersFailed(f"node {plan.node_rank}: {attempts.last_failure}, and no restart could follow: the other nodes' "
                                    "workers had finished or they had no restarts left (a restart needs every node's)", exit_code=1)
        else:
            failure = WorkersFailed(f"stopped: {watchdog.reason or 'another node ran out of restarts and closed the rendezvous'}", exit_code=1)
    except (DistError, RendezvousError, RuntimeError) as exc:
        watchdog.report_failure(f"node {plan.node_rank} could not join the rendezvous")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HpctorchError(
            f"rendezvous at {plan.master_addr}:{plan.master_port or '(any)'} failed: {first}",
            "check that every node runs the same job, that the master is reachable on "
            f"{plan.iface or 'the chosen interface'} (hpctorch plan shows why it was chosen), "
            "or raise --rdzv-timeout",
        ) from None
    else:
        watchdog.finished()
        requeue_after = True
    finally:
        if standbys is not None:
            standby.uninstall()
        if alone is not None:
            watchdog.final.update(alone.stop())  # type: ignore[arg-type]
        if stalled is not None:
            stalled.stop()
        if straggle_dir:
            shutil.rmtree(straggle_dir, ignore_errors=True)
    if plan.is_master and failure is not None and stacks.teardown is not None and not quiet:
        lines = watchdog.teardown_lines or stacks.teardown_summary()
        if lines:
            print("\n".join(lines), file=sys.stderr, flush=True)
    logs: str | None = specs.root_log_dir
    if log_dir is None and failure is None and os.path.basename(logs).startswith("torchelastic_"):
        shutil.rmtree(logs, ignore_errors=True)  # torch's temporary folder, nobody asked for it: the console had it all
        logs = None
    failure = first_reported(failure, watchdog.final.get("failures"))  # node 0 reads them all; a failed node, once its own is in
    if plan.is_master and (summary_json or not quiet):
        from ..guard.summary import report

        report(plan, started, watchdog.final, logs, failure.exit_code if failure else 0, failure.line if failure else None,
               attempts.history, stalled, quiet, summary_json)
    if plan.rdzv_backend == "file" and plan.is_master:
        from .filestore import remove

        remove(plan.rdzv_conf["path"], plan.run_id, workers_only=failure is None)  # a failed run's stores would confuse the next one
    if requeue_after:
        requeue_if_preempted(plan, preempted, requeue)
    if failure is not None:
        raise failure


def _launch_config(plan: Plan, specs, prefix: bool, seat: Seat | None = None):  # type: ignore[no-untyped-def]
    """torch's LaunchConfig for this node: hpctorch's choices, then torchrun's agent options as
    given; with hot spares, torch's c10d rendezvous wrapped (``spares``) for the seats alone."""
    from torch.distributed.launcher.api import LaunchConfig

    if plan.rdzv_backend in ("static", "file"):
        rdzv_configs: dict[str, object] = {"rank": plan.node_rank, "timeout": plan.rdzv_timeout}
    else:
        rdzv_configs = {"join_timeout": plan.rdzv_timeout}
    rdzv_configs.update(plan.rdzv_conf)
    settings: dict[str, object] = dict(
        min_nodes=plan.min_nodes or plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node[plan.node_rank],
        run_id=plan.run_id,
        role=ROLE,
        rdzv_endpoint=f"{plan.master_addr}:{plan.master_port}",
        rdzv_backend=plan.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=plan.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        # This node's address in torch's rendezvous (its own on the chosen interface); without
        # it torch uses getfqdn(), which on many hosts resolves to 127.0.1.1 or a management network.
        local_addr=plan.local_addr or plan.master_addr,
        logs_specs=specs,
        log_line_prefix_template=line_prefix(plan) if prefix else None,
        # Workers get SIGTERM first; a job being torn down must not wait 30 s for SIGKILL.
        shutdown_timeout=STOP_GRACE_S,
    )
    if seat is not None:
        settings.update(min_nodes=seat.seats, max_nodes=seat.seats, rdzv_backend=spares.BACKEND)
    agent = {k: v for k, v in plan.agent.items() if k != "logs_specs"}
    if agent.get("numa_options"):
        from torch.numa.binding import AffinityMode, NumaOptions

        agent["numa_options"] = NumaOptions(affinity_mode=AffinityMode(agent["numa_options"]))
    settings.update(agent)
    return LaunchConfig(**settings)


def _forward_preemption_to_children() -> list[int]:
    """Pass SIGUSR1/SIGUSR2 (Slurm's --signal, LSF's -wa) on to every worker, so their
    handlers can checkpoint; the agent itself keeps running. Returns the signals seen."""
    import psutil

    seen: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        seen.append(signum)
        for child in _workers_of(psutil.Process()):
            try:
                child.send_signal(signum)
            except psutil.Error:
                pass

    for sig in PREEMPT_SIGNALS:
        signal.signal(sig, forward)
    return seen


def _workers_of(agent):  # type: ignore[no-untyped-def]
    """The agent's children, and in place of a zygote (``start.zygote``) the workers forked from
    it; never a standby still waiting (a notice's default action would end it)."""
    import psutil

    from .standby import NAME as WAITING
    from .zygote import NAME as ZYGOTE

    found = []
    for child in agent.children():
        try:
            found += child.children() if child.name() == ZYGOTE else [child]
        except psutil.Error:
            continue
    named = []
    for process in found:
        try:
            named += [] if process.name() == WAITING else [process]
        except psutil.Error:
            continue
    return named

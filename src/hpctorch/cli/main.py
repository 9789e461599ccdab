"""Command line: ``hpctorch run | plan | doctor | submit | stacks | hostlist``. Thin: parse, plan, act."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from ..errors import HpctorchError, os_error_line
from ..plan.ports import check_master_port
from ..plan.types import Options, Plan
from . import screening, small, staging, submitting, torchrun
from .parser import EXIT_USAGE, guard_summary, parser, stage_paths, unrecognized
from .script import check_script


def _worker_command(args: argparse.Namespace) -> tuple[str, ...]:
    if getattr(args, "script", None) is None:
        return ()
    rest = [a for a in args.script_args if a != "--"] if args.script_args[:1] == ["--"] else args.script_args
    if args.no_python:
        if args.module:
            raise HpctorchError("--no-python and -m cannot be combined", "drop one of them")
        return (args.script, *rest)
    if args.module:
        return (sys.executable, "-u", "-m", args.script, *rest)
    return (sys.executable, "-u", args.script, *rest)


def _options(args: argparse.Namespace) -> Options:
    min_nodes, nnodes = args.nnodes if args.nnodes else (None, None)
    master_addr, master_port, master_flag = args.master_addr, args.master_port, "--master-addr"
    rendezvous_dir = args.rendezvous_dir
    if args.rdzv_backend == "file" and args.rdzv_endpoint:  # a directory, not HOST:PORT
        if rendezvous_dir and os.path.abspath(rendezvous_dir) != os.path.abspath(args.rdzv_endpoint):
            raise HpctorchError(f"--rdzv-endpoint {args.rdzv_endpoint} and --rendezvous-dir {rendezvous_dir} both name the directory", "give one of them")
        rendezvous_dir = args.rdzv_endpoint
    elif args.rdzv_endpoint:
        if args.master_addr or args.master_port:
            raise HpctorchError("--rdzv-endpoint and --master-addr/--master-port both name the master", "give one of them")
        (master_addr, master_port), master_flag = torchrun.endpoint(args.rdzv_endpoint), "--rdzv-endpoint"
    if args.standalone:
        for flag, value in (("--nnodes", nnodes if nnodes != 1 else None), ("--node-rank", args.node_rank if args.node_rank else None),
                            ("--hostfile", args.hostfile), ("--hosts", args.hosts), ("--simulate-nodes", args.simulate_nodes)):
            if value is not None:
                raise HpctorchError(f"--standalone contradicts {flag} {value}", "drop one of them")
    return Options(
        nproc_per_node=args.nproc_per_node,
        nnodes=nnodes,
        min_nodes=min_nodes if min_nodes != nnodes else None,
        node_rank=args.node_rank,
        master_addr=master_addr,
        master_port=master_port,
        master_flag=master_flag,
        rdzv_backend=args.rdzv_backend,
        rdzv_conf=torchrun.rdzv_conf(args.rdzv_conf),
        agent=torchrun.agent_settings(args),
        local_rank_arg=args.local_rank_arg,
        iface=args.iface,
        mode=args.mode,
        simulate_nodes=args.simulate_nodes,
        max_restarts=args.max_restarts,
        rdzv_timeout=args.rdzv_timeout,
        run_id=args.run_id,
        rendezvous_dir=rendezvous_dir,
        hostfile=args.hostfile,
        hosts=args.hosts,
        gpus_per_proc=args.gpus_per_proc,
        cpu_bind=args.cpu_bind,
        standalone=args.standalone,
        torch_agent_for=tuple(flag for flag, given in (("--tee", args.tee), ("--redirects", args.redirects),
                                                       ("--stall-timeout", getattr(args, "stall_timeout", None))) if given),
        command=_worker_command(args),
    )


def build_plan(args: argparse.Namespace, exchange: bool = True) -> Plan:
    from ..plan.discover import plan_here

    return plan_here(_options(args), os.environ, exchange=exchange)


def _local_ranks(args: argparse.Namespace) -> set[int] | None:
    """torchrun's --local-ranks-filter: the local ranks whose output reaches the console, on every node."""
    if not args.local_ranks_filter:
        return None
    if args.console_ranks is not None or args.quiet_ranks:
        raise HpctorchError("--local-ranks-filter and --console-ranks/--quiet-ranks both choose the console's ranks", "give one of them")
    try:
        return {int(rank) for rank in args.local_ranks_filter.split(",") if rank.strip()}
    except ValueError:
        raise HpctorchError(f"--local-ranks-filter {args.local_ranks_filter!r} is not a list of local ranks",
                            "write e.g. --local-ranks-filter 0,1") from None


def _console_ranks(args: argparse.Namespace) -> set[int] | None:
    if args.quiet_ranks and args.console_ranks is not None:
        raise HpctorchError("--quiet-ranks and --console-ranks both choose the ranks on the terminal", "give one of them")
    if args.quiet_ranks:
        return {0}
    if args.console_ranks is None:
        return None
    try:
        return {int(rank) for rank in args.console_ranks.split(",") if rank.strip()}
    except ValueError:
        raise HpctorchError(f"--console-ranks {args.console_ranks!r} is not a list of ranks", "write e.g. --console-ranks 0,4") from None


def _without_nproc(args: argparse.Namespace) -> list[str]:
    """``args.argv`` without hpctorch's --nproc-per-node (the script's own arguments untouched)."""
    end = len(args.argv) - len(args.script_args) - 1  # where the script's name is
    ours, theirs, kept, skip = args.argv[:end], args.argv[end:], [], False
    for word in ours:
        if skip:
            skip = False
        elif word in ("--nproc-per-node", "--nproc_per_node"):
            skip = True
        elif not word.startswith(("--nproc-per-node=", "--nproc_per_node=")):
            kept.append(word)
    return [*kept, *theirs]


def _stragglers(args: argparse.Namespace) -> None:
    """--stragglers and --straggler-threshold, for the workers and the watchdog (through the
    environment, as HPCTORCH_STRAGGLERS and HPCTORCH_STRAGGLER_THRESHOLD set them)."""
    from ..guard.stragglers import MODE_ENV, THRESHOLD_ENV, Settings

    if args.stragglers:
        os.environ[MODE_ENV] = args.stragglers
    if args.straggler_threshold is not None:
        os.environ[THRESHOLD_ENV] = f"{args.straggler_threshold:g}"
    Settings.from_env(os.environ)  # a bad value in the environment: one line now, not in every node's watchdog


def _stall(args: argparse.Namespace) -> tuple[float, str] | None:
    if args.stall_timeout is None:
        return None
    if args.stall_timeout <= 0:
        raise HpctorchError(f"--stall-timeout {args.stall_timeout:g} is not a number of seconds", "give a positive number of seconds, e.g. --stall-timeout 600")
    if args.no_prefix and not (args.tee or args.redirects):
        raise HpctorchError("--stall-timeout watches the workers' output, and --no-prefix leaves it uncaptured",
                            "drop --no-prefix, or add --tee 3 --log-dir DIR")
    return args.stall_timeout, args.stall_action


def _stacks(args: argparse.Namespace) -> int:
    from ..stacks import command

    if args.timeout <= 0:
        raise HpctorchError(f"--timeout {args.timeout:g} is not a number of seconds", "give a positive number, e.g. --timeout 20")
    code = command.run(os.environ, args.run_id, args.method, args.timeout, args.native)
    sys.stdout.flush()
    os._exit(code)  # a TCPStore client may be open: skip torch's exit-time teardown


def _run(args: argparse.Namespace) -> int:
    # The start stage's modules only once this node's environment is staged: before, every
    # import is file-system calls on the shared path, from every node.
    check_script(args)
    console = _console_ranks(args)  # every argument is checked before anything is printed or started
    if args.quiet and args.verbose:
        raise HpctorchError("--quiet and --verbose ask for opposite things", "give one of them")
    local_ranks = _local_ranks(args)
    stall = _stall(args)
    _stragglers(args)
    screening.check_args(args)
    stage_settings = staging.settings(args)
    if args.log_dir and os.path.exists(args.log_dir) and not os.path.isdir(args.log_dir):
        raise HpctorchError(f"--log-dir {args.log_dir} is a file", "give --log-dir a folder (it is made if missing)")
    from .. import timings

    timings.enable_from(args.timings)
    if args.quiet:
        from .. import progress

        progress.enabled = False
    plan = build_plan(args)
    timings.mark("plan ready")
    if console is not None and not console & set(range(plan.world_size)):
        raise HpctorchError(f"--console-ranks {args.console_ranks}: no such rank in a world of {plan.world_size}",
                            f"give ranks from 0 to {plan.world_size - 1}")
    if plan.mode == "relaunch":
        from ..start import launch

        # Per task the step starts every rank: each must not start --nproc-per-node more of its own.
        launch.exec_relaunch(plan, _without_nproc(args) if plan.relaunch_per_task else args.argv)
    check_master_port(plan)
    screening.check_spares(args, plan)
    if plan.mode in ("per-task", "unchanged"):
        if stall:
            raise HpctorchError(f"--stall-timeout needs hpctorch's per-node agent, and this is a {plan.mode} run "
                                f"({plan.reasons.get('mode', 'every rank started by the launcher')})",
                                "start one hpctorch per node (e.g. srun --ntasks-per-node=1), or run 'hpctorch stacks' on the nodes when the job hangs")
        if args.stragglers == "warn" and plan.mode == "unchanged":
            print(f"hpctorch: --stragglers needs hpctorch to start the ranks, and this is a {plan.mode} run: the job runs without it",
                  file=sys.stderr, flush=True)
        screening.check_per_task(args, plan)
        staging.check_mode(args, plan)
        if args.screen or args.spare_nodes:
            kept = screening.per_task(args, plan, _options(args))
            if kept is None:
                return 0  # a spare's rank
            plan = kept
            check_master_port(plan)
        staging.stage(args, plan, stage_settings)
        from ..start import launch

        launch.exec_per_task(plan)
    from ..start import masterport

    plan = masterport.settle(plan)  # before any store: a held derived port moves the job, not stops it
    if plan.node_rank == 0 and not args.quiet:  # one copy per job, not one per node
        from ..plan.render import banner, table

        print(table(plan) if args.verbose else banner(plan), file=sys.stderr, flush=True)
    screened = screening.screen(args, plan) if args.screen or args.spare_nodes else None
    seat, every_node = None, plan
    if args.spare_nodes:
        kept = screening.without_spares(args, plan, screened, _options(args))
        if kept is None:
            return 0  # a spare: it said why
        plan, seat = kept
    staging.stage(args, every_node if seat is not None else plan, stage_settings)  # a hot spare may run: it stages too
    from ..start import launch, simulated, torchlogs
    from ..start.workers import WorkersFailed

    torchlogs.shown = args.verbose
    try:
        if plan.simulated:
            simulated.run_simulated(plan, log_dir=args.log_dir, prefix=not args.no_prefix, console_ranks=console,
                                 quiet=args.quiet, summary_json=args.summary_json, local_ranks=local_ranks, stall=stall)
        elif plan.starter == "hpctorch":
            from ..start import supervisor

            supervisor.run_node(plan, log_dir=args.log_dir, prefix=not args.no_prefix, console_ranks=console, local_ranks=local_ranks,
                                quiet=args.quiet, summary_json=args.summary_json, requeue=args.requeue, stall=stall)
        else:
            launch.run_per_node(plan, log_dir=args.log_dir, tee=args.tee, redirects=args.redirects, requeue=args.requeue,
                                prefix=not args.no_prefix, console_ranks=console, quiet=args.quiet, summary_json=args.summary_json,
                                local_ranks=local_ranks, stall=stall, seat=seat)
    except WorkersFailed as exc:
        screening.to_summary(args, plan, screened)
        print(f"hpctorch: {exc.line}", file=sys.stderr)
        return _leave(exc.exit_code) if plan.starter == "torch" and not plan.simulated else exc.exit_code
    screening.to_summary(args, plan, screened)
    return _leave(0) if plan.starter == "torch" and not plan.simulated else 0


def _leave(code: int) -> int:
    """After torch's agent: everything is done and said; skip the interpreter's teardown of
    torch (half a second here, and it can abort the process; see examples/toy_ddp.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _plan(args: argparse.Namespace) -> int:
    from ..plan.render import table

    check_script(args)
    _stall(args)  # run's guards, checked as run checks them, and said with the plan
    if args.stragglers or args.straggler_threshold is not None or any(k.startswith("HPCTORCH_STRAGGLER") for k in os.environ):
        _stragglers(args)  # its module costs a plan 15 ms: only when there is something to check
    screening.check_args(args)
    staging.settings(args)
    plan = build_plan(args, exchange=False)
    guards = guard_summary(args)
    if args.json:
        print(json.dumps({**json.loads(plan.to_json()), "guards": guards}, indent=2, sort_keys=True))
    else:
        print(table(plan, explain=args.explain) + "\n  guards:\n" + "\n".join(f"    {name:<11}{what}" for name, what in guards.items()))
    check_master_port(plan)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from ..doctor import command

    options = replace(_options(args), rdzv_timeout=min(args.rdzv_timeout, max(1, int(args.timeout * 0.4))))
    code = command.run(options, os.environ, args.timeout, args.json, args.argv)
    # torch was imported and a process group used: skip its exit-time teardown,
    # which can abort the interpreter (see examples/toy_ddp.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _whole_lines(stream) -> None:  # type: ignore[no-untyped-def]
    """Under PYTHONUNBUFFERED, print writes a line and its newline apart, and the lines of the
    ranks of one srun or mpiexec step then meet mid-line: each line goes out in one write."""
    if getattr(stream, "write_through", False):
        try:
            stream.reconfigure(write_through=False, line_buffering=True)
        except (AttributeError, ValueError):
            pass


def _translations_looked_up_once() -> None:
    """argparse passes each of its strings through gettext, which looks for a translation anew
    each time under sys.base_prefix/share/locale: four stats a string where LANG is set, 108
    calls on the shared file system before a staged copy exists. Looked up once: where there is
    none (CPython ships none), argparse's strings are used as they are."""
    import gettext

    if gettext.find(gettext.textdomain()) is None:
        argparse._ = lambda message: message  # type: ignore[attr-defined]
        argparse.ngettext = lambda singular, plural, count: singular if count == 1 else plural  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> int:
    _whole_lines(sys.stderr)
    _translations_looked_up_once()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv[:1] in (["--version"], ["-V"]):
            print(small.version_line())
            return 0
        command = argv[0] if argv and argv[0] in ("run", "plan", "doctor", "submit", "stacks", "hostlist", "badnodes", "stage", "timeline") else None
        top = parser(command)
        args, extras = top.parse_known_args(stage_paths(top, argv))
        if extras:
            raise unrecognized(top, command, extras)
        args.argv = argv
        if getattr(args, "stage_paths", None) and not args.stage_env:
            args.stage_env = "on"  # --stage-env=DIR alone
        handler = {"run": _run, "plan": _plan, "doctor": _doctor, "submit": submitting.submit, "stacks": _stacks,
                   "hostlist": small.hostlist_command, "badnodes": small.badnodes, "stage": small.stage_command, "timeline": small.timeline}[args.command]
        return handler(args)
    except HpctorchError as exc:
        if exc.cause:  # no cause: another node said it for the job (the screen's verdict)
            print(f"hpctorch: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the machine's answer (a full /dev/shm, a file where a folder belongs): one line, no traceback
        print(f"hpctorch: error: {os_error_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

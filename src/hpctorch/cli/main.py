"""Command line: ``hpctorch run | plan | doctor | submit | stacks | hostlist``. Thin: parse, plan, act."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from ..errors import HpctorchError, os_error_line
from ..plan.types import DEFAULT_RDZV_TIMEOUT_S, MODES, Options, Plan
from ..schedulers import hostlist
from . import torchrun
from .torchrun import nnodes_range

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # Printed after "hpctorch: error: ", so the program's name is not repeated.
        where = self.prog.removeprefix("hpctorch").strip()
        raise HpctorchError(f"{where + ': ' if where else ''}{message}", f"see '{self.prog} --help'")


def _nproc(value: str) -> int | None:
    # torchrun also accepts these words; "gpu" and "auto" both mean one per GPU.
    if value in ("auto", "gpu"):
        return None
    if value == "cpu":
        return os.cpu_count() or 1
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a count, 'gpu', 'cpu' or 'auto'") from None


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--nproc-per-node", "--nproc_per_node", type=_nproc, default=None, help="workers per node: N, gpu, cpu or auto (default: visible GPUs, else 1)")
    add("--nnodes", type=nnodes_range, default=None, metavar="N|MIN:MAX", help="node count when no scheduler tells it; MIN:MAX with --rdzv-backend c10d")
    add("--node-rank", "--node_rank", type=int, default=None, help="this node's rank when no scheduler tells it")
    add("--master-addr", "--master_addr", default=None, help="address of the node holding rank 0")
    add("--master-port", "--master_port", type=int, default=None, help="rendezvous port (default: derived from the job id, else free)")
    add("--iface", default=None, help="network interface: a name, a glob (hsn*) or a CIDR")
    add("--gpus-per-proc", type=int, default=None, metavar="K", help="GPUs each process gets (default 1; local rank r uses visible devices [r*K, (r+1)*K))")
    add("--cpu-bind", choices=("none", "cores", "numa"), default=None, help="bind each worker to its share of CPUs (default: cores when more than one worker)")
    add("--mode", choices=MODES, default="auto", help="per-node: start workers here; per-task: this process is one rank")
    add("--simulate-nodes", type=int, default=None, metavar="N", help="run N node agents on this machine (loopback)")
    add("--max-restarts", "--max_restarts", type=int, default=0)
    add("--rdzv-timeout", type=int, default=DEFAULT_RDZV_TIMEOUT_S, metavar="S", help="seconds to wait for all nodes")
    add("--run-id", "--rdzv-id", "--rdzv_id", dest="run_id", default=None)
    add("--hostfile", default=None, metavar="FILE", help="no scheduler: the job's hosts, one per line ('host', 'host slots=N', 'host:N')")
    add("--hosts", default=None, metavar="A,B,...", help="no scheduler: the job's hosts, comma-separated")
    add("--rendezvous-dir", default=None, metavar="DIR", help="a directory all nodes share, to exchange the master's address (default: the job's submit directory)")
    add("--log-dir", "--log_dir", default=None, help="keep each worker's output under this directory")
    add("--tee", "-t", default=None, help="torchrun's --tee: also copy std streams to --log-dir (0-3)")
    add("--redirects", "-r", default=None, help="torchrun's --redirects (0-3)")
    add("--no-prefix", action="store_true", help="leave workers' output as it is (default: each line starts with [host rank R])")
    add("--quiet-ranks", action="store_true", help="show only rank 0's output on the terminal (every rank's is kept in --log-dir)")
    add("--console-ranks", default=None, metavar="R,R,...", help="global ranks whose output reaches the terminal")
    add("--verbose", "-v", action="store_true", help="print the whole plan (every worker's environment) before starting")
    add("--quiet", "-q", action="store_true", help="print nothing of hpctorch's own but errors (no banner, progress or summary)")
    add("--summary-json", default=None, metavar="FILE", help="node 0 writes the closing summary there as JSON")
    add("--requeue", action="store_true", help="after a preemption signal (SIGUSR1/2), requeue the job with the scheduler's command")
    add("--standalone", action="store_true", help="as torchrun: this machine alone, whatever launched it, on a free local port")
    add("-m", "--module", action="store_true", help="run the script argument as a module, like python -m")
    add("--no-python", "--no_python", action="store_true", help="run the script as an executable, not with python")
    torchrun.add_options(parser)


def _parser(only: str | None = None) -> _Parser:
    """The command line; with ``only``, just that subcommand gets its options (argparse
    spends milliseconds per option, and ``hpctorch plan`` must answer fast)."""
    parser = _Parser(prog="hpctorch", description="Run PyTorch distributed scripts under any launcher.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="start a training script", allow_abbrev=False)
    if only in (None, "run"):
        _add_launch_options(run)
        run.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                         help="when no rank wrote any output for S seconds, print every rank's stack (grouped)")
        run.add_argument("--stall-action", choices=("dump", "kill"), default="dump", help="after the stacks: go on (dump) or end the job (kill)")
        run.add_argument("--timings", action="store_true", help="rank 0 prints where startup went, stage by stage, slowest node first")
        run.add_argument("script", help="training script (or module with -m)")
        run.add_argument("script_args", nargs=argparse.REMAINDER)
    plan = sub.add_parser("plan", help="print what run would do, start nothing", allow_abbrev=False)
    if only in (None, "plan"):
        _add_launch_options(plan)
        plan.add_argument("--json", action="store_true", help="print the plan as JSON")
        plan.add_argument("--explain", action="store_true", help="show which variable each value came from")
        plan.add_argument("script", nargs="?", default=None)
        plan.add_argument("script_args", nargs=argparse.REMAINDER)
    doctor = sub.add_parser("doctor", help="run like the job on every node: find out why it would not start", allow_abbrev=False)
    if only in (None, "doctor"):
        _add_launch_options(doctor)
        doctor.add_argument("--timeout", type=float, default=30, metavar="S", help="seconds the whole check may take (default 30)")
        doctor.add_argument("--json", default=None, metavar="FILE", help="write the whole report as JSON ('-' for stdout), for a bug report")
    job = sub.add_parser("submit", help="write a job script for a scheduler and submit it", allow_abbrev=False)
    if only in (None, "submit"):
        add = job.add_argument
        add("--nodes", type=int, required=True)
        add("--time", required=True, help="wall time: 2:00:00, 90 (minutes), 1-12:00:00, 90m, 2h")
        add("--gpus-per-node", type=int, default=None)
        add("--cpus-per-node", type=int, default=None)
        add("--nproc-per-node", "--nproc_per_node", type=int, default=None, help="workers per node (default: --gpus-per-node, else hpctorch's default)")
        add("--partition", "--queue", "-p", default=None)
        add("--account", "-A", default=None)
        add("--job-name", default="hpctorch")
        add("--output", default=None, help="log file pattern (default per scheduler, e.g. hpctorch-%%x-%%j.out)")
        from ..submit.jobscript import SUBMIT_COMMANDS

        add("--scheduler", choices=sorted(SUBMIT_COMMANDS), default=None, help="default: the one whose submit command is on PATH")
        add("--preempt-signal", default=None, metavar="SIG@SECONDS", help="e.g. USR1@120: signal every rank this long before the end")
        add("--requeue", action="store_true", help="let the scheduler requeue the job")
        add("--dry-run", action="store_true", help="print the script, submit nothing")
        add("--template", default=None, metavar="FILE", help="your own template (placeholders as in the packaged ones)")
        add("--job-script", default=None, metavar="FILE", help="where to write the job script (default: hpctorch-JOBNAME.SCHEDULER.sh)")
        for flag in ("--sbatch-arg", "--qsub-arg", "--bsub-arg", "--flux-arg", "--scheduler-arg"):
            add(flag, dest="extra", action="append", default=[], metavar="ARG", help="passed to the scheduler as a directive" if flag == "--scheduler-arg" else argparse.SUPPRESS)
        add("--iface", default=None, help="passed on to hpctorch run")
        add("-m", "--module", action="store_true")
        add("script")
        add("script_args", nargs=argparse.REMAINDER)
    stacks = sub.add_parser("stacks", help="print where every rank of a running job is (grouped stacks)", allow_abbrev=False)
    if only in (None, "stacks"):
        from ..stacks.dump import METHODS

        stacks.add_argument("--run-id", default=None, help="the job's run id, when several of your jobs run here")
        stacks.add_argument("--method", choices=METHODS, default="auto", help="py-spy (ptrace), faulthandler (a signal), or auto: py-spy, then faulthandler")
        stacks.add_argument("--native", action="store_true", help="py-spy: include native (C/C++) frames in the full dump")
        stacks.add_argument("--timeout", type=float, default=20, metavar="S", help="node 0 waits this long for the other nodes (default 20)")
    hosts = sub.add_parser("hostlist", help="expand or compress Slurm hostlists", allow_abbrev=False)
    if only in (None, "hostlist"):
        hosts_sub = hosts.add_subparsers(dest="action", required=True, parser_class=_Parser)
        hosts_sub.add_parser("expand", help="EXPR -> one name per line").add_argument("expr")
        hosts_sub.add_parser("compress", help="NAMES... -> one hostlist").add_argument("names", nargs="+")
    return parser


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


def _check_script(args: argparse.Namespace) -> None:
    if args.module or args.script is None:
        return
    if getattr(args, "no_python", False):
        return  # looked up on PATH at exec time
    if not os.path.isfile(args.script):
        raise HpctorchError(f"script {args.script!r} not found", "check the path (relative to the current directory)")
    if kind := torchrun.not_python(args.script):
        fix = "add --no-python to run it as a command (as torchrun does)" if hasattr(args, "no_python") else \
            "submit writes jobs for Python scripts: write the job script yourself with 'hpctorch run --no-python'"
        raise HpctorchError(f"{args.script!r} is {kind}, not a Python script", fix)


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
    from ..start import launch, simulated
    from ..start.workers import WorkersFailed

    _check_script(args)
    console = _console_ranks(args)  # every argument is checked before anything is printed or started
    local_ranks = _local_ranks(args)
    stall = _stall(args)
    if args.log_dir and os.path.exists(args.log_dir) and not os.path.isdir(args.log_dir):
        raise HpctorchError(f"--log-dir {args.log_dir} is a file", "give --log-dir a folder (it is made if missing)")
    from .. import timings

    timings.enable_from(args.timings)
    if args.quiet:
        from .. import progress

        progress.enabled = False
    plan = build_plan(args)
    timings.mark("plan ready")
    if plan.mode == "relaunch":
        # Per task the step starts every rank: each must not start --nproc-per-node more of its own.
        launch.exec_relaunch(plan, _without_nproc(args) if plan.relaunch_per_task else args.argv)
    launch.check_master_port(plan)
    if plan.mode in ("per-task", "unchanged"):
        if stall:
            raise HpctorchError(f"--stall-timeout needs hpctorch's per-node agent, and this is a {plan.mode} run "
                                f"({plan.reasons.get('mode', 'every rank started by the launcher')})",
                                "start one hpctorch per node (e.g. srun --ntasks-per-node=1), or run 'hpctorch stacks' on the nodes when the job hangs")
        launch.exec_per_task(plan)
    if plan.node_rank == 0 and not args.quiet:  # one copy per job, not one per node
        from ..plan.render import banner, table

        print(table(plan) if args.verbose else banner(plan), file=sys.stderr, flush=True)
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
                                local_ranks=local_ranks, stall=stall)
    except WorkersFailed as exc:
        print(f"hpctorch: {exc.line}", file=sys.stderr)
        return _leave(exc.exit_code) if plan.starter == "torch" and not plan.simulated else exc.exit_code
    return _leave(0) if plan.starter == "torch" and not plan.simulated else 0


def _leave(code: int) -> int:
    """After torch's agent: everything is done and said; skip the interpreter's teardown of
    torch (half a second here, and it can abort the process; see examples/toy_ddp.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _plan(args: argparse.Namespace) -> int:
    from ..plan.render import table
    from ..start import launch

    _check_script(args)
    plan = build_plan(args, exchange=False)
    print(plan.to_json() if args.json else table(plan, explain=args.explain))
    launch.check_master_port(plan)
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


def _submit(args: argparse.Namespace) -> int:
    from ..submit import jobscript

    scheduler = args.scheduler or jobscript.default_scheduler()
    run_args = [*(["--iface", args.iface] if args.iface else []), *(["-m"] if args.module else []), args.script, *args.script_args]
    _check_script(args)
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--cpus-per-node", args.cpus_per_node), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None and value < 1:
            raise HpctorchError(f"{flag} {value} is not a count", f"give {flag} 1 or more, or leave it out")
    request = jobscript.JobRequest(
        command=tuple(run_args),
        nodes=args.nodes,
        time_s=jobscript.parse_time(args.time),
        nproc_per_node=args.nproc_per_node,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        partition=args.partition,
        account=args.account,
        job_name=args.job_name,
        output=args.output,
        preempt=jobscript.parse_signal(args.preempt_signal) if args.preempt_signal else None,
        requeue=args.requeue,
        extra=tuple(args.extra),
    )
    template = None
    if args.template:
        try:
            with open(args.template, encoding="utf-8") as source:
                template = source.read()
        except OSError as exc:
            raise HpctorchError(f"cannot read --template {args.template}: {exc.strerror}", "check the path") from None
    text = jobscript.render(request, scheduler, template)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    path = args.job_script or f"hpctorch-{args.job_name}.{scheduler}.sh"
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as existing:
            if "Written by hpctorch submit" not in existing.read(4096):
                raise HpctorchError(f"{path} exists and is not a job script hpctorch wrote", "pass --job-script with a new file name")
    with open(path, "w", encoding="utf-8") as script:
        script.write(text)
    os.chmod(path, 0o755)
    job_id = jobscript.submit(path, scheduler)
    logs = (request.output or jobscript.DEFAULT_OUTPUT[scheduler] or f"{args.job_name}.o<id>")
    logs = logs.replace("%x", args.job_name).replace("%j", job_id).replace("%J", job_id).replace("{{id}}", job_id).replace("<id>", job_id)
    print(f"submitted {scheduler} job {job_id}; script: {path}; logs: {logs}")
    return 0


def _hostlist(args: argparse.Namespace) -> int:
    if args.action == "expand":
        print("\n".join(hostlist.expand(args.expr)))
    else:
        names = [n for arg in args.names for n in arg.replace(",", " ").split()]
        print(hostlist.compress(names))
    return 0


def _whole_lines(stream) -> None:  # type: ignore[no-untyped-def]
    """Under PYTHONUNBUFFERED, print writes a line and its newline apart, and the lines of the
    ranks of one srun or mpiexec step then meet mid-line: each line goes out in one write."""
    if getattr(stream, "write_through", False):
        try:
            stream.reconfigure(write_through=False, line_buffering=True)
        except (AttributeError, ValueError):
            pass


def main(argv: Sequence[str] | None = None) -> int:
    _whole_lines(sys.stderr)
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        command = argv[0] if argv and argv[0] in ("run", "plan", "doctor", "submit", "stacks", "hostlist") else None
        args = _parser(command).parse_args(argv)
        args.argv = argv
        handler = {"run": _run, "plan": _plan, "doctor": _doctor, "submit": _submit, "stacks": _stacks, "hostlist": _hostlist}[args.command]
        return handler(args)
    except HpctorchError as exc:
        print(f"hpctorch: error: {exc.line()}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the machine's answer (a full /dev/shm, a file where a folder belongs): one line, no traceback
        print(f"hpctorch: error: {os_error_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

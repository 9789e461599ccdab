"""hpctorch's command line as argparse sees it: every subcommand's options (torchrun's among
``run``'s, from ``torchrun``), and a parser that reports a bad command line in one line."""

from __future__ import annotations

import argparse
import os

from ..errors import HpctorchError
from ..plan.types import DEFAULT_RDZV_TIMEOUT_S, MODES
from . import torchrun
from .torchrun import nnodes_range

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # Printed after "hpctorch: error: ", so the program's name is not repeated.
        where = self.prog.removeprefix("hpctorch").strip()
        raise HpctorchError(f"{where + ': ' if where else ''}{message}", f"see '{self.prog} --help'")


def unrecognized(top: argparse.ArgumentParser, command: str | None, extras: list[str]) -> HpctorchError:
    """Options no parser took: the nearest spelling of each, and the subcommand's own help."""
    import difflib

    sub = next((a.choices.get(command) for a in top._actions if isinstance(a, argparse._SubParsersAction)), None) if command else None
    parser = sub or top
    known = [o for action in parser._actions for o in action.option_strings]
    hints = []
    for token in extras:
        name = token.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) if name.startswith("-") else []
        if close:
            hints.append(f"did you mean {close[0]}{'=' + token.split('=', 1)[1] if '=' in token else ''} for {token}?")
    where = parser.prog.removeprefix("hpctorch").strip()
    return HpctorchError(f"{where + ': ' if where else ''}unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""),
                         f"see '{parser.prog} --help'")


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


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a count of nodes (0 or more)")
    return int(value)


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a fraction between 0 and 1 (e.g. 0.5)")
    return number


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument_group("launch: how many workers, which nodes, master and network (a scheduler tells most)").add_argument
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
    add("--max-restarts", "--max_restarts", type=int, default=0, help="restart every node's workers this often after a failure (torch's agent, c10d)")
    add("--rdzv-timeout", type=int, default=DEFAULT_RDZV_TIMEOUT_S, metavar="S", help="seconds to wait for all nodes")
    add("--run-id", "--rdzv-id", "--rdzv_id", dest="run_id", default=None, help="the job's run id (default: from the scheduler's job id)")
    add("--hostfile", default=None, metavar="FILE", help="no scheduler: the job's hosts, one per line ('host', 'host slots=N', 'host:N')")
    add("--hosts", default=None, metavar="A,B,...", help="no scheduler: the job's hosts, comma-separated")
    add("--rendezvous-dir", default=None, metavar="DIR", help="a directory all nodes share, to exchange the master's address (default: the job's submit directory)")
    add("--requeue", action="store_true", help="after a preemption signal (SIGUSR1/2), requeue the job with the scheduler's command")
    add("--standalone", action="store_true", help="as torchrun: this machine alone, whatever launched it, on a free local port")
    add("-m", "--module", action="store_true", help="run the script argument as a module, like python -m")
    add("--no-python", "--no_python", action="store_true", help="run the script as an executable, not with python")
    add = parser.add_argument_group("output: what reaches the terminal and the logs").add_argument
    add("--log-dir", "--log_dir", default=None, help="keep each worker's output under this directory")
    add("--tee", "-t", default=None, help="torchrun's --tee: also copy std streams to --log-dir (0-3)")
    add("--redirects", "-r", default=None, help="torchrun's --redirects (0-3)")
    add("--no-prefix", action="store_true", help="leave workers' output as it is (default: each line starts with [host rank R])")
    add("--quiet-ranks", action="store_true", help="show only rank 0's output on the terminal (every rank's is kept in --log-dir)")
    add("--console-ranks", default=None, metavar="R,R,...", help="global ranks whose output reaches the terminal")
    add("--verbose", "-v", action="store_true", help="print the whole plan (every worker's environment) before starting")
    add("--quiet", "-q", action="store_true", help="print nothing of hpctorch's own but errors (no banner, progress or summary)")
    add("--summary-json", default=None, metavar="FILE", help="node 0 writes the closing summary there as JSON")
    torchrun.add_options(parser.add_argument_group("torchrun's options (torch's agent and rendezvous; same names and meaning)"))


def _add_stage_options(add) -> None:  # type: ignore[no-untyped-def]
    # Flags, not one option with an optional value: "--stage-env train.py" must not take the
    # script for a folder; "--stage-env=DIR" becomes "--stage-path DIR" (stage_paths).
    add("--stage-env", dest="stage_env", action="store_const", const="on", default=None,
        help="run the workers from a copy of the Python environment on each node's own disk, spread from node 0 over the fabric "
             "(--stage-env=DIR stages a folder too)")
    add("--stage-env=try", dest="stage_env", action="store_const", const="try",
        help="the same, but a node that cannot stage runs from the shared path instead of stopping the job")
    add("--stage-path", dest="stage_paths", action="append", default=[], metavar="DIR", help=argparse.SUPPRESS)
    add("--stage-dir", default=None, metavar="DIR", help="where each node keeps its copy (default /tmp, /dev/shm where /tmp is not local)")


def _add_guard_options(add) -> None:  # type: ignore[no-untyped-def]
    """The guards of ``run`` (stall, screen, spares, stragglers, timings): ``plan`` shows what they
    would do, ``submit`` writes them on its run line (``guard_flags``)."""
    add("--stall-timeout", type=float, default=None, metavar="S",
        help="when no rank wrote any output for S seconds, print every rank's stack (grouped)")
    add("--stall-action", choices=("dump", "kill"), default="dump", help="after the stacks: go on (dump) or end the job (kill)")
    # Two flags, not one with an optional value: "--screen train.py" must not take the script for the value.
    add("--screen", "--screen=warn", dest="screen", action="store_const", const="warn", default=None,
        help="before the workers start, measure every node and its link; node 0 names those below the median, and the job goes on")
    add("--screen=fail", dest="screen", action="store_const", const="fail",
        help="the same, but a bad node stops the job before its workers start (exit 3)")
    add("--spare-nodes", type=_count, default=0, metavar="K",
        help="screen the nodes, then run on all but the K worst (renumbered; the spares exit 0)")
    add("--screen-threshold", type=_fraction, default=0.5, metavar="F",
        help="a node is bad below F times the job's median (default 0.5)")
    add("--stragglers", choices=("off", "warn"), default=None,
        help="while the job runs, node 0 names the rank or node the others wait for (default warn; HPCTORCH_STRAGGLERS)")
    add("--straggler-threshold", type=_fraction, default=None, metavar="F",
        help="named when the others spend F more of their time waiting inside collectives than it does (default 0.2)")
    add("--timings", action="store_true", help="rank 0 prints where startup went, stage by stage, slowest node first")


GUARD_DEFAULTS = {"max_restarts": 0, "stall_timeout": None, "stall_action": "dump", "screen": None, "spare_nodes": 0, "screen_threshold": 0.5,
                  "stragglers": None, "straggler_threshold": None, "timings": False}


def guard_flags(args: argparse.Namespace) -> list[str]:
    """The guard options given, as ``run`` reads them (``submit``'s run line)."""
    flags: list[str] = []
    for dest, default in GUARD_DEFAULTS.items():
        value = getattr(args, dest, default)
        if value == default:
            continue
        if dest == "screen":
            flags.append("--screen" if value == "warn" else "--screen=fail")
        elif dest == "timings":
            flags.append("--timings")
        else:
            flags += [f"--{dest.replace('_', '-')}", f"{value:g}" if isinstance(value, float) else str(value)]
    return flags


def guard_summary(args: argparse.Namespace) -> dict[str, str]:
    """What each guard would do in ``run`` with these options, for ``plan``."""
    said = {}
    if getattr(args, "stall_timeout", None):
        said["stall"] = (f"no output from any rank for {args.stall_timeout:g} s (after the first): every rank's stack"
                         + (", then the job ends (exit 1)" if args.stall_action == "kill" else ", and the job goes on"))
    if getattr(args, "screen", None) or getattr(args, "spare_nodes", 0):
        said["screen"] = (f"every node measured before the workers start, named below {args.screen_threshold:g} x the median; "
                          + ("a named node stops the job (exit 3)" if args.screen == "fail" else "the job goes on")
                          + (f"; the {args.spare_nodes} worst node(s) sit out as spares" if args.spare_nodes else ""))
    mode = getattr(args, "stragglers", None) or os.environ.get("HPCTORCH_STRAGGLERS", "warn")
    said["stragglers"] = "off" if mode == "off" else (
        f"node 0 names the rank or node the others wait for (threshold {getattr(args, 'straggler_threshold', None) or 0.2:g})")
    if getattr(args, "timings", False):
        said["timings"] = "rank 0 prints where startup went, stage by stage"
    if getattr(args, "stage_env", None):
        said["staging"] = (f"the workers run from a copy of the environment in {args.stage_dir or 'the node-local stage folder'}"
                           + ("; a node that cannot stage runs from the shared path" if args.stage_env == "try" else ""))
    return said


def stage_paths(top: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--stage-env=DIR`` among ``run``'s, ``plan``'s or ``submit``'s own options (never the script's) as argparse can take it."""
    if not argv or argv[0] not in ("run", "plan", "submit"):
        return argv
    subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    actions = subparsers.choices[argv[0]]._option_string_actions  # noqa: SLF001 - to skip option values as argparse will
    out: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token.startswith("--stage-env=") and token not in actions:
            out += ["--stage-path", token.split("=", 1)[1]]  # implies --stage-env (main), without undoing =try
            continue
        out.append(token)
        if token == "--" or not token.startswith("-"):
            if token in ("run", "plan", "submit") and len(out) == 1:
                continue
            break  # the script: the rest is its own
        action = actions.get(token)
        if action is not None and action.nargs != 0 and index < len(argv):
            out.append(argv[index])
            index += 1
    return out + argv[index:]


RUN_EXAMPLES = """examples:
  hpctorch run train.py --lr 0.1                          one node: one worker per GPU, else 1
  srun hpctorch run --nproc-per-node 4 train.py           every node of a Slurm job (any launcher alike)
  hpctorch run --simulate-nodes 2 --nproc-per-node 2 train.py   the multi-node logic on a laptop
  hpctorch run --max-restarts 3 --stall-timeout 600 train.py    restarts, and stacks when output stops
  hpctorch plan --nproc-per-node 4 train.py               what run would do, starting nothing
"""


def parser(only: str | None = None) -> _Parser:
    """The command line; with ``only``, just that subcommand gets its options (argparse
    spends milliseconds per option, and ``hpctorch plan`` must answer fast)."""
    parser = _Parser(prog="hpctorch", description="Run PyTorch distributed scripts under any launcher.", allow_abbrev=False)
    parser.add_argument("--version", "-V", action="store_true", help="print hpctorch's version, torch's and Python's, and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="start a training script", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Start a PyTorch distributed script on every node of the job, as torchrun would, with the node "
                                     "rank, master, port and network worked out from the launcher.", epilog=RUN_EXAMPLES)
    if only in (None, "run"):
        _add_launch_options(run)
        _add_guard_options(run.add_argument_group("guards: before and while the job runs").add_argument)
        _add_stage_options(run.add_argument_group("staging: the Python environment on each node's own disk").add_argument)
        run.add_argument("script", help="training script (or module with -m)")
        run.add_argument("script_args", nargs=argparse.REMAINDER)
    plan = sub.add_parser("plan", help="print what run would do, start nothing", allow_abbrev=False)
    if only in (None, "plan"):
        own = plan.add_argument_group("plan").add_argument
        own("--json", action="store_true", help="print the plan as JSON")
        own("--explain", action="store_true", help="show which variable each value came from")
        _add_launch_options(plan)
        _add_guard_options(plan.add_argument_group("guards (said, not run)").add_argument)
        _add_stage_options(plan.add_argument_group("staging (said, not run)").add_argument)
        plan.add_argument("script", nargs="?", default=None)
        plan.add_argument("script_args", nargs=argparse.REMAINDER)
    doctor = sub.add_parser("doctor", help="run like the job on every node: find out why it would not start", allow_abbrev=False)
    if only in (None, "doctor"):
        own = doctor.add_argument_group("doctor").add_argument
        own("--timeout", type=float, default=30, metavar="S", help="seconds the whole check may take (default 30)")
        own("--json", default=None, metavar="FILE", help="write the whole report as JSON ('-' for stdout), for a bug report")
        _add_launch_options(doctor)
    job = sub.add_parser("submit", help="write a job script for a scheduler and submit it", allow_abbrev=False)
    if only in (None, "submit"):
        add = job.add_argument
        add("--nodes", type=int, required=True, help="nodes to ask the scheduler for")
        add("--time", required=True, help="wall time: 2:00:00, 90 (minutes), 1-12:00:00, 90m, 2h")
        add("--gpus-per-node", type=int, default=None, help="GPUs to ask for on each node")
        add("--cpus-per-node", type=int, default=None, help="CPUs to ask for on each node (shared among its ranks)")
        add("--nproc-per-node", "--nproc_per_node", type=int, default=None, help="workers per node (default: --gpus-per-node, else hpctorch's default)")
        add("--partition", "--queue", "-p", default=None, help="the scheduler's partition or queue")
        add("--account", "-A", default=None, help="the account the job is charged to")
        add("--job-name", default="hpctorch", help="the job's name (one word; default hpctorch)")
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
        add("--max-restarts", "--max_restarts", type=int, default=0, help="passed on to hpctorch run")
        _add_guard_options(add)
        _add_stage_options(add)
        add("-m", "--module", action="store_true", help="run the script argument as a module, like python -m")
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
        hosts_sub.add_parser("compress", help="NAMES... (or stdin) -> one hostlist").add_argument("names", nargs="*")
    bad = sub.add_parser("badnodes", help="the nodes your next jobs ask the scheduler to leave out", allow_abbrev=False)
    if only in (None, "badnodes"):
        bad_sub = bad.add_subparsers(dest="action", parser_class=_Parser)
        bad_sub.add_parser("list", help="the nodes in force, why, since when (the default)")
        added = bad_sub.add_parser("add", help="NODES (hostlists too) -> the list")
        added.add_argument("names", nargs="+")
        added.add_argument("--reason", default="added by hand", help="why (shown by list)")
        bad_sub.add_parser("remove", help="NODES -> off the list").add_argument("names", nargs="+")
        bad_sub.add_parser("clear", help="empty the list")
    timeline = sub.add_parser("timeline", help="draw a run's --summary-json as an HTML page: a row per node, start, training, restarts",
                              allow_abbrev=False)
    if only in (None, "timeline"):
        timeline.add_argument("summary", help="the file run --summary-json wrote")
        timeline.add_argument("-o", "--output", default=None, metavar="HTML", help="where to write the page (default: SUMMARY with .html)")
    staging = sub.add_parser("stage", help="your copies of Python environments on this node (run --stage-env)", allow_abbrev=False)
    if only in (None, "stage"):
        stage_sub = staging.add_subparsers(dest="action", parser_class=_Parser)
        for name, text in (("list", "each copy here: its size, when a job last started from it, the processes running from it (the default)"),
                           ("clean", "remove every copy no process runs from")):
            one = stage_sub.add_parser(name, help=text)
            one.add_argument("--stage-dir", default=None, metavar="DIR", help="the folder run was given (default /tmp, /dev/shm where /tmp is not local)")
    return parser

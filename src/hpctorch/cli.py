"""Command line: ``hpctorch run | plan | hostlist``. Thin: parse, plan, act."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from . import hostlist
from .errors import HpctorchError
from .plan import DEFAULT_RDZV_TIMEOUT_S, MODES, Options, Plan

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise HpctorchError(f"{self.prog}: {message}", f"see '{self.prog} --help'")


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


def _nnodes(value: str) -> int:
    if ":" in value:
        raise argparse.ArgumentTypeError(f"elastic node ranges ({value}) are not supported; give a fixed count")
    return int(value)


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--nproc-per-node", "--nproc_per_node", type=_nproc, default=None, help="workers per node: N, gpu, cpu or auto (default: visible GPUs, else 1)")
    add("--nnodes", type=_nnodes, default=None, help="node count when no scheduler tells it")
    add("--node-rank", "--node_rank", type=int, default=None, help="this node's rank when no scheduler tells it")
    add("--master-addr", "--master_addr", default=None, help="address of the node holding rank 0")
    add("--master-port", "--master_port", type=int, default=None, help="rendezvous port (default: derived from the job id, else free)")
    add("--iface", default=None, help="network interface: a name, a glob (hsn*) or a CIDR")
    add("--mode", choices=MODES, default="auto", help="per-node: start workers here; per-task: this process is one rank")
    add("--simulate-nodes", type=int, default=None, metavar="N", help="run N node agents on this machine (loopback)")
    add("--max-restarts", "--max_restarts", type=int, default=0)
    add("--rdzv-timeout", type=int, default=DEFAULT_RDZV_TIMEOUT_S, metavar="S", help="seconds to wait for all nodes")
    add("--run-id", "--rdzv-id", "--rdzv_id", dest="run_id", default=None)
    add("--hostfile", default=None, metavar="FILE", help="no scheduler: the job's hosts, one per line ('host', 'host slots=N', 'host:N')")
    add("--hosts", default=None, metavar="A,B,...", help="no scheduler: the job's hosts, comma-separated")
    add("--rendezvous-dir", default=None, metavar="DIR", help="a directory all nodes share, to exchange the master's address (default: the job's submit directory)")
    add("--log-dir", "--log_dir", default=None, help="keep each worker's output under this directory")
    add("--tee", default=None, help="torchrun's --tee: also copy std streams to --log-dir (0-3)")
    add("--redirects", "-r", default=None, help="torchrun's --redirects (0-3)")
    add("--standalone", action="store_true", help="accepted for torchrun compatibility: one node")
    add("-m", "--module", action="store_true", help="run the script argument as a module, like python -m")
    add("--no-python", "--no_python", action="store_true", help="run the script as an executable, not with python")


def _parser() -> _Parser:
    parser = _Parser(prog="hpctorch", description="Run PyTorch distributed scripts under any launcher.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="start a training script", allow_abbrev=False)
    _add_launch_options(run)
    run.add_argument("script", help="training script (or module with -m)")
    run.add_argument("script_args", nargs=argparse.REMAINDER)
    plan = sub.add_parser("plan", help="print what run would do, start nothing", allow_abbrev=False)
    _add_launch_options(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--explain", action="store_true", help="show which variable each value came from")
    plan.add_argument("script", nargs="?", default=None)
    plan.add_argument("script_args", nargs=argparse.REMAINDER)
    hosts = sub.add_parser("hostlist", help="expand or compress Slurm hostlists", allow_abbrev=False)
    hosts_sub = hosts.add_subparsers(dest="action", required=True, parser_class=_Parser)
    hosts_sub.add_parser("expand", help="EXPR -> one name per line").add_argument("expr")
    hosts_sub.add_parser("compress", help="NAMES... -> one hostlist").add_argument("names", nargs="+")
    return parser


def _worker_command(args: argparse.Namespace) -> tuple[str, ...]:
    if args.script is None:
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
    if args.no_python:
        return  # looked up on PATH at exec time
    if not os.path.isfile(args.script):
        raise HpctorchError(f"script {args.script!r} not found", "check the path (relative to the current directory)")


def _options(args: argparse.Namespace) -> Options:
    nnodes = args.nnodes
    if args.standalone:
        if nnodes not in (None, 1):
            raise HpctorchError(f"--standalone contradicts --nnodes {nnodes}", "drop one of them")
    return Options(
        nproc_per_node=args.nproc_per_node,
        nnodes=nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        iface=args.iface,
        mode=args.mode,
        simulate_nodes=args.simulate_nodes,
        max_restarts=args.max_restarts,
        rdzv_timeout=args.rdzv_timeout,
        run_id=args.run_id,
        rendezvous_dir=args.rendezvous_dir,
        hostfile=args.hostfile,
        hosts=args.hosts,
        command=_worker_command(args),
    )


def build_plan(args: argparse.Namespace) -> Plan:
    from .discover import plan_here

    return plan_here(_options(args), os.environ)


def _run(args: argparse.Namespace) -> int:
    from . import launch
    from .rendezvous import exchange_master

    _check_script(args)
    plan = build_plan(args)
    if plan.mode == "launch-step":
        launch.exec_step(plan, args.argv)
    launch.check_master_port(plan)
    plan = exchange_master(plan)
    if plan.mode == "per-task":
        launch.exec_per_task(plan)
    if plan.node_rank == 0:  # one copy per job, not one per node
        print(plan.table(), file=sys.stderr, flush=True)
    try:
        if plan.simulated:
            launch.run_simulated(plan, log_dir=args.log_dir)
        else:
            launch.run_per_node(plan, log_dir=args.log_dir, tee=args.tee, redirects=args.redirects)
    except launch.WorkersFailed as exc:
        print(f"hpctorch: {exc.line}", file=sys.stderr)
        return exc.exit_code
    return 0


def _plan(args: argparse.Namespace) -> int:
    from . import launch

    _check_script(args)
    plan = build_plan(args)
    print(plan.to_json() if args.json else plan.table(explain=args.explain))
    launch.check_master_port(plan)
    return 0


def _hostlist(args: argparse.Namespace) -> int:
    if args.action == "expand":
        print("\n".join(hostlist.expand(args.expr)))
    else:
        names = [n for arg in args.names for n in arg.replace(",", " ").split()]
        print(hostlist.compress(names))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = _parser().parse_args(argv)
        args.argv = argv
        handler = {"run": _run, "plan": _plan, "hostlist": _hostlist}[args.command]
        return handler(args)
    except HpctorchError as exc:
        print(f"hpctorch: error: {exc.line()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

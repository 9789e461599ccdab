"""``hpctorch submit``: a job script for the scheduler, written and submitted."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from ..errors import HpctorchError
from ..schedulers import hostlist
from .parser import guard_flags
from .script import check_script


def submit(args: argparse.Namespace) -> int:
    from ..host import badnodes
    from ..submit import jobscript

    scheduler = args.scheduler or jobscript.default_scheduler()
    staged = [*([f"--stage-env={args.stage_env}" if args.stage_env == "try" else "--stage-env"] if args.stage_env else []),
              *[f"--stage-env={path}" for path in args.stage_paths], *(["--stage-dir", args.stage_dir] if args.stage_dir else [])]
    run_args = [*(["--iface", args.iface] if args.iface else []), *guard_flags(args), *staged, *(["-m"] if args.module else []), args.script, *args.script_args]
    check_script(args)
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
        exclude=(),
    )
    listed = badnodes.names(os.environ)
    known = jobscript.known_nodes(scheduler) if listed else None
    request = replace(request, exclude=tuple(n for n in listed if known is None or n in known))
    foreign = f"; {len(listed) - len(request.exclude)} more on the list are not {scheduler}'s nodes here" if len(request.exclude) < len(listed) else ""
    if request.exclude:
        how = jobscript.EXCLUDES.get(scheduler)
        shown = f"{hostlist.display(list(request.exclude))} (hpctorch badnodes list)"
        print(f"hpctorch submit: leaving out {len(request.exclude)} bad node(s) with {how}: {shown}{foreign}" if how else
              f"hpctorch submit: {scheduler} has no option to leave nodes out: {shown} not excluded", file=sys.stderr)
    elif foreign:
        print(f"hpctorch submit: none of the {len(listed)} bad node(s) on the list are {scheduler}'s nodes here", file=sys.stderr)
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
    path = args.job_script or _new_script_path(args.job_name, scheduler)
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as existing:
            if "Written by hpctorch submit" not in existing.read(4096):
                raise HpctorchError(f"{path} exists and is not a job script hpctorch wrote", "pass --job-script with a new file name")
    with open(path, "w", encoding="utf-8") as script:
        script.write(text)
    os.chmod(path, 0o755)
    if args.cpus_per_node is None:
        print("hpctorch submit: no --cpus-per-node: each rank gets the scheduler's default CPUs (one, on many shared nodes); "
              "give --cpus-per-node N for data loaders and threads", file=sys.stderr)
    job_id = jobscript.submit(path, scheduler)
    logs = (request.output or jobscript.DEFAULT_OUTPUT[scheduler] or f"{args.job_name}.o<id>")
    logs = logs.replace("%x", args.job_name).replace("%j", job_id).replace("%J", job_id).replace("{{id}}", job_id).replace("<id>", job_id)
    print(f"submitted {scheduler} job {job_id}; script: {path}; logs: {logs}")
    return 0


def _new_script_path(job_name: str, scheduler: str) -> str:
    """hpctorch-NAME.SCHEDULER.sh, or with -2, -3... where an earlier submit left one: each job
    keeps the script it ran."""
    path, count = f"hpctorch-{job_name}.{scheduler}.sh", 1
    while os.path.exists(path):
        count += 1
        path = f"hpctorch-{job_name}-{count}.{scheduler}.sh"
    return path

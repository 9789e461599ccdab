"""``hpctorch submit``: a job script from a template per scheduler, then the scheduler's
own submit command. Pure rendering (``render``) is kept apart from submitting."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources

from ..errors import HpctorchError
from ..schedulers import hostlist

SUBMIT_COMMANDS = {"slurm": "sbatch", "pbs": "qsub", "lsf": "bsub", "flux": "flux"}
DEFAULT_OUTPUT = {"slurm": "hpctorch-%x-%j.out", "pbs": "", "lsf": "hpctorch-%J.out", "flux": "hpctorch-{{id}}.out"}
_JOB_ID = {
    "slurm": re.compile(r"Submitted batch job (\d+)"),
    "pbs": re.compile(r"^(\S+)$", re.M),
    "lsf": re.compile(r"Job <(\d+)>"),
    "flux": re.compile(r"^(\S+)$", re.M),
}


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for, checked."""

    command: tuple[str, ...]
    """The hpctorch run line's own arguments after ``run``: options, script, script args."""
    nodes: int
    time_s: int
    nproc_per_node: int | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str = "hpctorch"
    output: str | None = None
    preempt: tuple[str, int] | None = None
    requeue: bool = False
    extra: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    """Nodes the scheduler must leave out (the user's bad-node list), where it has an option."""


def parse_time(text: str) -> int:
    """Slurm's forms (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) plus 90m / 2h / 1d; seconds."""
    text = text.strip()
    unit = re.fullmatch(r"(\d+)([smhd])", text)
    if unit:
        return int(unit.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit.group(2)]
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if match is None:
        raise HpctorchError(f"--time {text!r} is not a duration", "write e.g. 2:00:00, 90, 1-12:00:00, 90m or 2h")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        seconds = int(a) * 60 + int(b)
    else:  # MM
        seconds = int(a) * 60
    if seconds <= 0:
        raise HpctorchError(f"--time {text!r} is no time at all", "give a positive duration")
    return seconds


def parse_signal(text: str) -> tuple[str, int]:
    """``USR1@120`` -> ("USR1", 120): the signal and how many seconds before the end."""
    match = re.fullmatch(r"(?:SIG)?([A-Z0-9]+)@(\d+)", text.strip().upper())
    if match is None:
        raise HpctorchError(f"--preempt-signal {text!r} is not SIGNAL@SECONDS", "write e.g. USR1@120")
    return match.group(1), int(match.group(2))


def check_directive_value(flag: str, value: str) -> str:
    """A value that lands on a #SBATCH/#PBS/#BSUB line must stay on that line."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise HpctorchError(f"{flag} {value!r} holds a newline or control character", f"give {flag} a single-line value")
    return value


def _hms(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def per_task(request: JobRequest) -> int | None:
    """The scheduler's launcher starts every rank itself (and one GPU goes to each: bound by
    srun, jsrun and Flux, by hpctorch from the local rank under PALS/MPICH mpiexec) when the
    count per node is known and each rank has one GPU or none: the rank count per node;
    None: one task per node, whose hpctorch starts the workers."""
    nproc = request.nproc_per_node or request.gpus_per_node
    if not nproc or (request.gpus_per_node and request.gpus_per_node != nproc):
        return None
    return nproc


def _directives(request: JobRequest, scheduler: str, output: str) -> list[str]:
    lines: list[str] = []
    sig = request.preempt
    if scheduler == "slurm":
        prefix = "#SBATCH "
        tasks = per_task(request)
        lines += [f"--partition={request.partition}"] if request.partition else []
        lines += [f"--account={request.account}"] if request.account else []
        if request.gpus_per_node:
            lines += ["--gpus-per-task=1"] if tasks else [f"--gpus-per-node={request.gpus_per_node}"]
        if request.cpus_per_node:
            lines += [f"--cpus-per-task={max(1, request.cpus_per_node // (tasks or 1))}"]
        # Without B: the signal reaches the step's tasks: every node's hpctorch.
        lines += [f"--signal={sig[0]}@{sig[1]}"] if sig else []
        lines += ["--requeue" if request.requeue else "--no-requeue"]
        lines += [f"--exclude={hostlist.compress(request.exclude)}"] if request.exclude else []
    elif scheduler == "pbs":
        prefix = "#PBS "
        if sig:
            raise HpctorchError("PBS sends no signal ahead of the walltime", "drop --preempt-signal with --scheduler pbs")
        lines += [f"-q {request.partition}"] if request.partition else []
        lines += [f"-A {request.account}"] if request.account else []
        lines += [f"-o {output}"] if output else []
        lines += ["-r y" if request.requeue else "-r n"]
    elif scheduler == "lsf":
        prefix = "#BSUB "
        lines += [f"-q {request.partition}"] if request.partition else []
        lines += [f"-P {request.account}"] if request.account else []
        # LSF's warning time is in minutes.
        lines += [f"-wa {sig[0]}", f"-wt {max(1, math.ceil(sig[1] / 60))}"] if sig else []
        lines += ["-r"] if request.requeue else []
        # bsub -R: a host selection string; one resource requirement may hold several terms.
        lines += ['-R "select[' + " && ".join(f"hname!={node}" for node in request.exclude) + ']"'] if request.exclude else []
    else:
        prefix = "#flux: "
        if request.requeue:
            raise HpctorchError("Flux has no requeue of a finished job", "drop --requeue with --scheduler flux")
        lines += [f"-q {request.partition}"] if request.partition else []
        lines += [f"--bank={request.account}"] if request.account else []
        lines += [f"--signal=SIG{sig[0]}@{sig[1]}s"] if sig else []
        lines += [f"--requires=-host:{hostlist.compress(request.exclude)}"] if request.exclude else []  # flux-run(1): a negated host constraint
    lines += list(request.extra)
    return [prefix + line for line in lines]


EXCLUDES = {"slurm": "sbatch --exclude", "lsf": "bsub -R select[hname!=...]", "flux": "--requires=-host:..."}
"""How each scheduler leaves nodes out; PBS has no such option of its own."""
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


_LAUNCHERS = {"slurm": ("Slurm", "srun"), "pbs": ("PBS", "mpiexec (Cray PALS or MPICH)"), "lsf": ("LSF", "jsrun"),
              "flux": ("Flux", "flux run")}
"""Per scheduler: its name, and what starts the tasks in the scripts hpctorch writes."""


def render(request: JobRequest, scheduler: str, template: str | None = None, python: str = sys.executable) -> str:
    """The job script text; ``template`` overrides the packaged one for ``scheduler``."""
    if scheduler not in SUBMIT_COMMANDS:
        raise HpctorchError(f"unknown scheduler {scheduler!r}", f"use one of {', '.join(SUBMIT_COMMANDS)}")
    if request.nodes < 1:
        raise HpctorchError(f"--nodes {request.nodes} asks for no node", "give --nodes 1 or more")
    for node in request.exclude:
        if not NODE_NAME.match(node):
            raise HpctorchError(f"the bad-node list holds {node!r}, which is no host name", "hpctorch badnodes remove it")
    for flag, value in (("--partition", request.partition), ("--account", request.account),
                        ("--job-name", request.job_name), ("--output", request.output), *(("extra option", e) for e in request.extra)):
        if value is not None:
            check_directive_value(flag, value)
    if not request.job_name or any(c.isspace() or c in "'\"" for c in request.job_name):
        # Directives are read word by word (#SBATCH, #PBS -N, #BSUB -J): a space would end the name.
        raise HpctorchError(f"--job-name {request.job_name!r} holds a space or a quote, which schedulers read as the name's end",
                            f"give one word, e.g. --job-name {'_'.join(request.job_name.split()) or 'train'}")
    text = template if template is not None else resources.files("hpctorch.submit").joinpath(f"templates/{scheduler}.sh").read_text()
    output = request.output if request.output is not None else DEFAULT_OUTPUT[scheduler]
    nproc = request.nproc_per_node or request.gpus_per_node
    tasks = per_task(request)
    # Per task the scheduler starts every rank: each runs the script itself, no --nproc-per-node.
    run = [python, "-m", "hpctorch", "run", *(["--nproc-per-node", str(nproc)] if nproc and not tasks else []), *request.command]
    name, starter = _LAUNCHERS[scheduler]
    layout = (f"{starter} starts {tasks} task(s) per node, one per rank{' with one GPU each' if request.gpus_per_node else ''}; "
              f"each runs the script\n# with the nodes, master and port from {name} itself (hpctorch's per-task mode)." if tasks else
              f"one task per node, started by {starter}, runs `hpctorch run`, which starts\n# {nproc or 'one per GPU (or 1)'} "
              f"worker(s) per node and finds the nodes, master and port from {name} itself.")
    per = tasks or 1
    gpus = 1 if tasks and request.gpus_per_node else request.gpus_per_node
    cpus = max(1, request.cpus_per_node // per) if request.cpus_per_node else None
    pbs_resources = "".join(
        f":{key}={value}" for key, value in (("ngpus", request.gpus_per_node), ("ncpus", request.cpus_per_node)) if value
    )
    jsrun_resources = " ".join(f"--{key} {value}" for key, value in (("gpu_per_rs", gpus), ("cpu_per_rs", cpus)) if value)
    # Flux gives every task all the node's GPUs unless asked to split them (its gpu-affinity shell option).
    flux_resources = "".join(f"-{key} {value} " for key, value in (("g", gpus), ("c", cpus)) if value)
    flux_resources += "-o gpu-affinity=per-task " if tasks and request.gpus_per_node else ""
    values = {
        "job_name": request.job_name,
        "nodes": str(request.nodes),
        "nproc": str(nproc or "one per GPU (or 1)"),
        "tasks_per_node": str(per),
        "total_tasks": str(per * request.nodes),
        "layout": layout,
        "time_slurm": _hms(request.time_s),
        "time_hms": _hms(request.time_s),
        # Whole minutes, rounded up before splitting: 59:30 is 1:00, not 0:60.
        "time_hm": f"{math.ceil(request.time_s / 60) // 60}:{math.ceil(request.time_s / 60) % 60:02d}",
        "time_minutes": str(math.ceil(request.time_s / 60)),
        "output": output,
        "directives": "\n".join(_directives(request, scheduler, output)),
        "pbs_resources": pbs_resources,
        "jsrun_resources": jsrun_resources,
        "flux_resources": flux_resources,
        # shlex.join: every word of the training command reaches it as written.
        "command": shlex.join(run),
    }
    try:
        script = string.Template(text).substitute(values)
    except (KeyError, ValueError) as exc:
        raise HpctorchError(f"the job template has an unknown or malformed placeholder: {exc}", "use the placeholders of the packaged templates") from None
    return script if script.endswith("\n") else script + "\n"


def default_scheduler() -> str:
    for name, command in SUBMIT_COMMANDS.items():
        # Grid Engine's qsub is not PBS's: its settings.sh exports SGE_ROOT to every user.
        if shutil.which(command) and not (name == "pbs" and os.environ.get("SGE_ROOT")):
            return name
    if os.environ.get("SGE_ROOT"):
        raise HpctorchError("the qsub on PATH is Grid Engine's (SGE_ROOT is set), and hpctorch submit writes no Grid Engine "
                            "scripts", "write the job script yourself: qsub -pe PE N job.sh with 'hpctorch run ...' in it")
    raise HpctorchError("no scheduler's submit command (sbatch, qsub, bsub, flux) is on PATH", "pass --scheduler and --dry-run to write the script")


KNOWN_NODES = {"slurm": ["sinfo", "--noheader", "--Node", "--format=%N"]}
"""The scheduler's own list of its nodes, one per line: Slurm refuses a job whose --exclude names
a node it does not have ("Invalid node name specified"), and a bad-node list on a home shared by
several clusters, or one naming a node since retired, holds such names."""


def known_nodes(scheduler: str, timeout_s: float = 10) -> set[str] | None:
    """The nodes the scheduler has, or None where it cannot say (no command, no answer)."""
    command = KNOWN_NODES.get(scheduler)
    if command is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    return names if done.returncode == 0 and names else None


def submit(script_path: str, scheduler: str, timeout_s: float = 60) -> str:
    """Submit with the scheduler's own command; returns the job id."""
    command = SUBMIT_COMMANDS[scheduler]
    argv = [command, "batch", script_path] if scheduler == "flux" else [command, script_path]
    try:
        if scheduler == "lsf":  # bsub reads the script from standard input
            with open(script_path, encoding="utf-8") as script:
                done = subprocess.run([command], stdin=script, capture_output=True, text=True, timeout=timeout_s)
        else:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise HpctorchError(f"{command} is not on PATH", "run on a login node of the cluster, or use --dry-run") from None
    except subprocess.TimeoutExpired:
        raise HpctorchError(f"{command} did not answer in {timeout_s:.0f} s", "check the scheduler's controller") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise HpctorchError(f"{command} refused the job: {reason}", "fix the option it names, or look at the script")
    match = _JOB_ID[scheduler].search(done.stdout)
    if match is None:
        raise HpctorchError(f"{command} answered without a job id: {done.stdout.strip()!r}", "check the queue by hand")
    return match.group(1)

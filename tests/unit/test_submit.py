"""Job scripts: golden files per scheduler, safe quoting, bad values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.submit import JobRequest, parse_signal, parse_time, render

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "submit"
FULL = JobRequest(
    command=("train.py", "--lr", "0.1; rm -rf /", "--name", "$(whoami)"),
    nodes=4, time_s=7200, gpus_per_node=4, cpus_per_node=32, partition="gpu", account="proj42",
    job_name="bert", preempt=("USR1", 120), requeue=True, extra=("--constraint=a100",),
)
MINIMAL = JobRequest(command=("-m", "mypkg.train"), nodes=2, time_s=5400, nproc_per_node=2)
RESOURCES = JobRequest(command=("train.py",), nodes=8, time_s=86400 + 1800, gpus_per_node=8, cpus_per_node=64,
                       partition="batch", account="acct", output="logs/run.out")
CASES = [(s, name, r) for s in ("slurm", "pbs", "lsf", "flux") for name, r in (("full", FULL), ("minimal", MINIMAL), ("resources", RESOURCES))
         if not (s == "pbs" and r.preempt) and not (s == "flux" and r.requeue)]


@pytest.mark.parametrize("scheduler, name, request_", CASES)
def test_golden(scheduler: str, name: str, request_: JobRequest) -> None:
    text = render(request_, scheduler, python="/opt/venv/bin/python")
    golden = GOLDEN / f"{scheduler}-{name}.sh"
    if os.environ.get("HPCTORCH_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()


def test_arguments_reach_the_script_word_for_word() -> None:
    import shlex

    last = render(FULL, "slurm", python="/py").strip().splitlines()[-1]
    words = shlex.split(last)
    assert words[words.index("train.py"):] == ["train.py", "--lr", "0.1; rm -rf /", "--name", "$(whoami)"]


@pytest.mark.parametrize("field", ["partition", "account", "job_name", "output"])
def test_a_newline_cannot_inject_a_directive(field: str) -> None:
    bad = JobRequest(command=("t.py",), nodes=1, time_s=60, **{field: "x\n#SBATCH --uid=0"})
    with pytest.raises(HpctorchError, match="newline"):
        render(bad, "slurm")
    with pytest.raises(HpctorchError, match="newline"):
        render(JobRequest(command=("t.py",), nodes=1, time_s=60, extra=("--a\rb",)), "slurm")


@pytest.mark.parametrize(
    "text, seconds",
    [("2:00:00", 7200), ("90", 5400), ("1:30", 90), ("1-12", 129600), ("1-12:30:00", 131400), ("90m", 5400), ("2h", 7200), ("1d", 86400)],
)
def test_time_forms(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("bad", ["", "1:xx", "two hours", "0", "-5", "1:2:3:4"])
def test_bad_times(bad: str) -> None:
    with pytest.raises(HpctorchError, match="--time"):
        parse_time(bad)


def test_signals_and_unsupported_combinations() -> None:
    assert parse_signal("USR1@120") == ("USR1", 120) and parse_signal("sigusr2@60") == ("USR2", 60)
    with pytest.raises(HpctorchError, match="SIGNAL@SECONDS"):
        parse_signal("USR1")
    with pytest.raises(HpctorchError, match="PBS sends no signal"):
        render(FULL, "pbs")
    with pytest.raises(HpctorchError, match="no requeue"):
        render(FULL, "flux")
    with pytest.raises(HpctorchError, match="no node"):
        render(JobRequest(command=("t.py",), nodes=0, time_s=60), "slurm")
    with pytest.raises(HpctorchError, match="placeholder"):
        render(MINIMAL, "slurm", template="#!/bin/sh\n$nosuch\n")


def test_cli_knows_every_scheduler_submit_knows() -> None:
    from hpctorch.cli import _parser
    from hpctorch.submit import SUBMIT_COMMANDS

    for name in SUBMIT_COMMANDS:
        args = _parser("submit").parse_args(["submit", "--nodes", "1", "--time", "1", "--scheduler", name, "t.py"])
        assert args.scheduler == name
    with pytest.raises(HpctorchError, match="invalid choice"):
        _parser("submit").parse_args(["submit", "--nodes", "1", "--time", "1", "--scheduler", "nosuch", "t.py"])

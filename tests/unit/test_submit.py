"""Job scripts: golden files per scheduler, safe quoting, bad values."""

from __future__ import annotations

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.submit.jobscript import JobRequest, parse_signal, parse_time, render

from ..fixtures import submit_cases

MINIMAL = submit_cases.MINIMAL
FULL = submit_cases.FULL


@pytest.mark.parametrize("scheduler, name, request_", submit_cases.CASES)
def test_golden(scheduler: str, name: str, request_: JobRequest) -> None:
    # The golden files change only by `make golden`, read in review, never inside this run.
    assert submit_cases.rendered(scheduler, request_) == submit_cases.golden(scheduler, name).read_text()


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
    from hpctorch.cli.parser import parser as _parser
    from hpctorch.submit.jobscript import SUBMIT_COMMANDS

    for name in SUBMIT_COMMANDS:
        args = _parser("submit").parse_args(["submit", "--nodes", "1", "--time", "1", "--scheduler", name, "t.py"])
        assert args.scheduler == name
    with pytest.raises(HpctorchError, match="invalid choice"):
        _parser("submit").parse_args(["submit", "--nodes", "1", "--time", "1", "--scheduler", "nosuch", "t.py"])


def test_lsf_wall_time_rounds_up_to_whole_minutes() -> None:
    text = render(JobRequest(command=("t.py",), nodes=1, time_s=parse_time("59:30")), "lsf", python="/py")
    assert "#BSUB -W 1:00" in text  # not 0:60
    assert "#BSUB -W 0:01" in render(JobRequest(command=("t.py",), nodes=1, time_s=1), "lsf", python="/py")


def test_grid_engines_qsub_is_not_taken_for_pbs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctorch.submit.jobscript import default_scheduler

    qsub = tmp_path / "qsub"
    qsub.write_text("#!/bin/sh\n")
    qsub.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SGE_ROOT", raising=False)
    assert default_scheduler() == "pbs"
    monkeypatch.setenv("SGE_ROOT", "/var/lib/gridengine")  # what Grid Engine's settings.sh exports
    with pytest.raises(HpctorchError, match="Grid Engine's"):
        default_scheduler()

"""The user's bad-node list: kept across jobs, expired after days, left out by the scheduler's
own option (sbatch --exclude, bsub -R select, flux --requires), said in one line where there
is none (PBS)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.host import badnodes
from hpctorch.submit.jobscript import JobRequest, render

from ..conftest import clean_env, hpctorch


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {badnodes.ENV: str(tmp_path / "state" / "bad-nodes.jsonl"), **extra}


def test_added_removed_and_expired(tmp_path: Path) -> None:
    here = env(tmp_path)
    badnodes.add(here, ["nid0003", "nid0007"], "fabric 2.4 MB/s (median 1.1 GB/s)", job="slurm-42")
    badnodes.add(here, ["nid0001"], "by hand")
    badnodes.remove(here, ["nid0007"])
    assert badnodes.names(here) == ["nid0001", "nid0003"]
    [entry] = [e for e in badnodes.current(here) if e.node == "nid0003"]
    assert (entry.reason, entry.job) == ("fabric 2.4 MB/s (median 1.1 GB/s)", "slurm-42")
    assert badnodes.names(here, ) == badnodes.names(env(tmp_path, HPCTORCH_BAD_NODES_DAYS="7"))
    later = time.time() + 8 * 86400
    assert badnodes.current(here, now=later) == []  # 7 days by default
    assert [e.node for e in badnodes.current(env(tmp_path, HPCTORCH_BAD_NODES_DAYS="30"), now=later)] == ["nid0001", "nid0003"]
    badnodes.clear(here)
    assert badnodes.names(here) == []


def test_one_line_an_event_and_a_broken_line_costs_only_itself(tmp_path: Path) -> None:
    here = env(tmp_path)
    badnodes.add(here, ["a1"], "x")
    file = Path(badnodes.path(here))
    with file.open("a") as out:
        out.write('{"node": "a2", "rea')  # a write cut short by a full disk
    badnodes.add(here, ["a3"], "y")
    assert badnodes.names(here) == ["a1", "a3"]
    assert json.loads(file.read_text().splitlines()[0])["node"] == "a1"
    assert oct(file.stat().st_mode & 0o777) == "0o600"


def test_bad_names_and_days_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(HpctorchError, match="is no host name"):
        badnodes.add(env(tmp_path), ["node 1; rm -rf /"], "x")
    with pytest.raises(HpctorchError, match="HPCTORCH_BAD_NODES_DAYS='soon'"):
        badnodes.names(env(tmp_path, HPCTORCH_BAD_NODES_DAYS="soon"))


@pytest.mark.parametrize("scheduler, line", [
    ("slurm", "#SBATCH --exclude=nid[0003,0007]"),
    ("lsf", '#BSUB -R "select[hname!=nid0003 && hname!=nid0007]"'),
    ("flux", "#flux: --requires=-host:nid[0003,0007]"),
])
def test_each_scheduler_leaves_the_bad_nodes_out_with_its_own_option(scheduler: str, line: str) -> None:
    request = JobRequest(command=("t.py",), nodes=2, time_s=600, exclude=("nid0003", "nid0007"))
    assert line in render(request, scheduler).splitlines()
    assert "nid0003" not in render(JobRequest(command=("t.py",), nodes=2, time_s=600), scheduler)


def test_a_name_that_is_no_host_never_reaches_a_directive() -> None:
    with pytest.raises(HpctorchError, match="no host name"):
        render(JobRequest(command=("t.py",), nodes=1, time_s=60, exclude=("a\n#SBATCH --uid=0",)), "slurm")


def test_the_command_line(tmp_path: Path) -> None:
    here = clean_env(**env(tmp_path))
    assert hpctorch("badnodes", "add", "nid[0003-0004]", "--reason", "ECC errors", env=here).returncode == 0
    listed = hpctorch("badnodes", env=here)
    assert listed.returncode == 0 and [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["node", "nid0003", "nid0004"]
    assert listed.stdout.splitlines()[0] == "node\tadded\tuntil\tjob\treason"
    added, until = listed.stdout.splitlines()[1].split("\t")[1:3]
    assert until > added and listed.stdout.splitlines()[1].endswith("\tECC errors")
    assert "2 bad node(s) in" in listed.stderr and "for 7 days, HPCTORCH_BAD_NODES_DAYS" in listed.stderr
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    dry = hpctorch("submit", "--nodes", "2", "--time", "10", "--scheduler", "slurm", "--dry-run", str(script), env=here)
    assert dry.returncode == 0 and "#SBATCH --exclude=nid[0003-0004]" in dry.stdout, dry.stderr
    assert "leaving out 2 bad node(s) with sbatch --exclude: nid[0003-0004]" in dry.stderr
    pbs = hpctorch("submit", "--nodes", "2", "--time", "10", "--scheduler", "pbs", "--dry-run", str(script), env=here)
    assert pbs.returncode == 0 and "pbs has no option to leave nodes out: nid[0003-0004] (hpctorch badnodes list) not excluded" in pbs.stderr
    assert hpctorch("badnodes", "remove", "nid0003", env=here).returncode == 0
    assert hpctorch("badnodes", "clear", env=here).returncode == 0 and hpctorch("badnodes", "list", env=here).stdout == ""
    bad = hpctorch("badnodes", "add", "a;b", env=here)
    assert bad.returncode == 2 and bad.stderr.startswith("hpctorch: error: 'a;b' is no host name")


def test_a_rank_killed_by_sigbus_puts_its_node_on_the_list_and_sigkill_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGBUS is how the kernel ends a process that touched memory with an uncorrectable error;
    SIGKILL is the OOM killer's or a user's, which says nothing of the node."""
    import signal

    from hpctorch import Options, make_plan
    from hpctorch.schedulers import detect
    from hpctorch.start.workers import failure_line

    from .fixtures import load_env
    from .helpers import facts

    for name, value in env(tmp_path).items():
        monkeypatch.setenv(name, value)
    plan = make_plan(detect(load_env("slurm/srun_2x1_rank1.env")), Options(command=("x",)), facts())
    failure_line(plan, 1, 0, -signal.SIGKILL, "its output above")
    assert badnodes.names(env(tmp_path)) == []
    failure_line(plan, 1, 0, -signal.SIGBUS, "its output above")
    [entry] = badnodes.current(env(tmp_path))
    assert (entry.node, entry.job) == (plan.nodes[plan.node_rank], plan.job_id) and "SIGBUS" in entry.reason

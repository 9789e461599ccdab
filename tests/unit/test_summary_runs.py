"""A requeued job's runs add up in one --summary-json file (guard/summary): each run of the same
scheduler job keeps the earlier ones there, says the job's goodput over all of them, and a file
of another job, or one this user did not write, is not read as this job's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctorch.guard.summary import Summary
from hpctorch.plan.types import Plan

from ..conftest import require


def _plan(job_id: str | None = "63") -> Plan:
    return Plan(mode="per-node", scheduler="slurm", job_id=job_id, nodes=("n1", "n2"), node_rank=0, nproc_per_node=(1, 1),
                master_addr="127.0.0.1", master_port=29400, rdzv_backend="static", rdzv_timeout=60, run_id=f"slurm-{job_id}",
                iface="lo", simulated=False, max_restarts=0, workers=(), common_env={})


def _run(wall: float, training: float, job_id: str | None = "63") -> Summary:
    goodput = {"wall_s": wall, "start_s": wall - training, "training_s": training, "lost_s": [], "share": training / wall, "attempts": []}
    return Summary.of(_plan(job_id), 0, wall, {"done": {0: True, 1: True}}, None, None, goodput)


def test_each_run_of_a_requeued_job_keeps_the_earlier_ones_and_says_the_whole(tmp_path: Path) -> None:
    path = str(tmp_path / "summary.json")
    first = _run(100.0, 60.0).after(path)  # no file yet
    assert first.earlier == () and not any("over" in line for line in first.lines())
    first.write_json(path)
    assert "runs" not in json.loads(Path(path).read_text())
    second = _run(50.0, 40.0).after(path)
    assert len(second.earlier) == 1
    assert "hpctorch: slurm 63 over 2 runs (1 before this one): goodput 67%: 100.0 s training of 150.0 s" in second.lines()
    second.write_json(path)
    third = _run(50.0, 0.0).after(path)
    third.write_json(path)
    data = json.loads(Path(path).read_text())
    assert [run["wall_s"] for run in data["runs"]] == [100.0, 50.0, 50.0]
    assert data["job_goodput"] == {"runs": 3, "wall_s": 200.0, "training_s": 100.0, "share": 0.5}
    assert data["goodput"]["training_s"] == 0.0 and data["job"] == "slurm 63"  # this run's own figures stay as they were


def test_runs_of_another_shape_in_the_file_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    _run(100.0, 60.0).write_json(str(path))
    data = json.loads(path.read_text())
    data["runs"] = [{"wall_s": "x"}, {"wall_s": 10.0, "goodput": {"training_s": "y"}}, "text", {"wall_s": 20.0, "goodput": None}]
    path.write_text(json.dumps(data))
    run = _run(50.0, 40.0).after(str(path))
    assert run.earlier == ({"wall_s": 20.0, "goodput": None},)
    assert "hpctorch: slurm 63 over 2 runs (1 before this one): goodput 57%: 40.0 s training of 70.0 s" in run.lines()


@pytest.mark.parametrize("case", ["another job", "no job", "another user's file", "not json"])
def test_a_file_of_anything_else_is_not_this_jobs(tmp_path: Path, case: str) -> None:
    path = tmp_path / "summary.json"
    _run(100.0, 60.0, "64" if case == "another job" else "63").write_json(str(path))
    if case == "another user's file":
        require(os.getuid() == 0, "making a file another user's needs root")
        os.chown(path, 65534, 65534)
    if case == "not json":
        path.write_text("{not json")
    run = _run(50.0, 40.0, None if case == "no job" else "63").after(str(path))
    assert run.earlier == ()

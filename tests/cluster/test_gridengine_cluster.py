"""hpctorch under a real Grid Engine cell: qsub with a parallel environment, the variables
Grid Engine itself sets (JOB_ID, PE_HOSTFILE, NSLOTS), and the job's own host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import require, unprefixed
from .conftest import PYTHON, TOY, toy_ranks
from .gridengine import PE, GridEngine, missing
from .harness import Cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def gridengine(cluster: Cluster) -> Iterator[GridEngine]:
    lacking = missing()
    require(not lacking, f"the Grid Engine cell needs {', '.join(lacking)}")
    cell = GridEngine(cluster).up()
    try:
        yield cell
    finally:
        cell.down()


def test_hpctorch_reads_a_real_grid_engine_job_and_trains(gridengine: GridEngine, job_dir: Path) -> None:
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\n{PYTHON} -m hpctorch run --nproc-per-node 2 {TOY} --steps 4\n")
    status, output = gridengine.qsub(job_dir, script, "-pe", PE, "2")
    assert status == 0, output[-3000:]
    job_id = next(line.split()[2] for line in output.splitlines() if line.startswith("Your job "))
    # The plan says where it came from: Grid Engine's job, on the host its PE_HOSTFILE names.
    assert f"1 node(s) (node1) x 2 = world size 2, sge job {job_id}" in output, output[-3000:]
    ranks = toy_ranks(output)
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1] and {r["host"] for r in ranks} == {"node1"}, output[-3000:]
    assert "done world=2" in unprefixed(output)


def test_the_job_script_of_a_grid_engine_job_is_planned_from_its_variables(gridengine: GridEngine, job_dir: Path) -> None:
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\n{PYTHON} -m hpctorch plan --json\n")
    status, output = gridengine.qsub(job_dir, script, "-pe", PE, "3")
    assert status == 0, output[-3000:]
    import json

    plan = json.loads(output[output.index("{"):output.rindex("}") + 1])
    assert plan["scheduler"] == "sge" and plan["nodes"] == ["node1"], plan
    # NSLOTS=3 are CPUs granted, not workers: one worker per GPU, else one (as without a scheduler).
    assert plan["nproc_per_node"] == [1], plan

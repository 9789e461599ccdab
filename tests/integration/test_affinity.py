"""Workers really run on the CPUs the plan gives them: read back from /proc/self/status."""

from __future__ import annotations

import json
import os

from hpctorch.host.affinity import parse_cpulist

from ..conftest import ROOT, clean_env, hpctorch, require, unprefixed

SCRIPT = str(ROOT / "tests" / "fixtures" / "affinity.py")


def _reports(output: str) -> list[dict]:
    return sorted((json.loads(line[len("AFFINITY "):]) for line in unprefixed(output).splitlines() if line.startswith("AFFINITY ")),
                  key=lambda r: r["rank"])


def _cpus(text: str) -> set[int]:
    return set(parse_cpulist(text))


def test_two_workers_are_bound_to_disjoint_cpus() -> None:
    require(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs to split")
    done = hpctorch("run", "--nproc-per-node", "2", SCRIPT, env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = _reports(done.stdout)
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["allowed"] == report["planned"], report  # the kernel agrees with the plan
        assert report["omp"] == str(len(_cpus(report["allowed"])))
    assert not _cpus(reports[0]["allowed"]) & _cpus(reports[1]["allowed"])
    allowed = os.sched_getaffinity(0)
    assert _cpus(reports[0]["allowed"]) | _cpus(reports[1]["allowed"]) == allowed


def test_cpu_bind_none_leaves_every_cpu() -> None:
    done = hpctorch("run", "--nproc-per-node", "2", "--cpu-bind", "none", SCRIPT, env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for report in _reports(done.stdout):
        assert _cpus(report["allowed"]) == os.sched_getaffinity(0) and report["planned"] is None


def test_the_users_omp_num_threads_is_kept() -> None:
    done = hpctorch("run", "--nproc-per-node", "2", SCRIPT, env=clean_env(OMP_NUM_THREADS="7"), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["omp"] for r in _reports(done.stdout)] == ["7", "7"]


def test_init_applies_the_binding_it_plans(tmp_path) -> None:
    import shutil
    import subprocess
    import sys

    require(shutil.which("mpirun.openmpi") is not None, "Open MPI (mpirun.openmpi) is not installed")
    require(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs to split")
    script = str(ROOT / "tests" / "fixtures" / "init_affinity.py")
    done = subprocess.run(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, script],
                          capture_output=True, text=True, env=clean_env(AFFINITY_REPORTS=str(tmp_path)), timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    reports = sorted((json.loads(path.read_text()) for path in tmp_path.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["planned"] and report["allowed"] == report["planned"], report  # applied, not only claimed
        assert report["threads"] == int(report["omp"]) == len(_cpus(report["allowed"])), report

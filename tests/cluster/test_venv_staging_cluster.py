"""--stage-env on 3 real Slurm nodes, 2 ranks each (named to run after the straggler watch's module: right
after this one, whose gigabytes of copies then leave the disk, that module's throttled-node test failed 2 of 3 times).
The first test stages this test run's own environment (the venv and its base interpreter, 1.5 GB):
node 0 packs it, the pack flows down a chain (fan-out 1: node1 -> node2 -> node3, so node2
forwards), every rank imports torch and the stdlib from its own node's copy, and node3's whole
process tree, counted with strace, makes at most 2% of the file-system calls on the environment's
paths that it makes without staging, and fewer than 300 (hpctorch's own start); then node2, the chain's middle, made slow and without its
copy, stops at the deadline and runs from the shared path. The others stage a small venv built
for the test (tests/smallenv.py: what they prove does not need gigabytes): a second job on the same
nodes reuses every copy; once jobs ran from node 0's copy, a node without one gets what they read
and links to the shared path for the rest; a node without room stops the job before any worker starts, or runs from
the shared path with =try; a node below a node without room takes the pack from the node above;
per task, each node's first rank stages."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .. import smallenv
from ..conftest import require, unprefixed
from .conftest import ONE_THREAD, PYTHON, throttling
from .harness import Cluster

pytestmark = pytest.mark.cluster

WHERE = textwrap.dedent("""
    import os, sys, json, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    libpython = next((line.split()[-1] for line in open("/proc/self/maps") if "/libpython" in line), "none")
    print(f"where host={os.uname().nodename} rank={dist.get_rank()} sum={total.item():.0f} prefix={sys.prefix} torch={torch.__file__} "
          f"base={sys.base_prefix} json={json.__file__} libpython={libpython}", flush=True)
    dist.destroy_process_group()
    os._exit(0)
""")
ROOTS = tuple(sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}))
"""The environment the test run itself runs in: what every node imports from, without staging."""


@pytest.fixture(scope="module")
def small_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small environment's interpreter: the tests after the first stage it."""
    why = smallenv.missing()
    require(why is None, f"the staging tests' small environment needs {why}")
    return smallenv.make(tmp_path_factory.mktemp("smallenv") / "env")


@pytest.fixture(scope="module")
def stage_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One staging folder for the module: the second job must find the first one's copies."""
    root = tmp_path_factory.mktemp("stage")
    root.chmod(0o755)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)
    # The copies are gigabytes written moments ago: their writeback must end here, not slow the
    # next module's tests (the straggler watch's judges CPU shares on these same 2 cores).
    os.sync()


def job(cluster: Cluster, job_dir: Path, *flags: str, trace: bool = False, env: str = "", per_node: int = 2,
        python: str | Path = PYTHON) -> tuple[str, str]:
    (job_dir / "where.py").write_text(WHERE)
    run = f"{python} -m hpctorch run {' '.join(flags)} --nproc-per-node {per_node} {job_dir / 'where.py'}"
    # node3 (the chain's end) runs under strace when asked: its whole process tree, file calls only.
    step = (f"srun sh -c 'if [ \"$SLURM_NODEID\" = 2 ]; then exec strace -f -qq --seccomp-bpf -e trace=%file -o {job_dir / 'trace'} {run}; "
            f"else exec {run}; fi'") if trace else f"srun {run}"
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\n{ONE_THREAD}export HPCTORCH_STAGE_FANOUT=1\n{env}{step}\n")
    return cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=1", timeout=600)


def ranks(output: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in unprefixed(output).splitlines() if line.startswith("where ")]


def environment_calls(trace: Path) -> int:
    quoted = tuple(f'"{root}' for root in ROOTS)
    return sum(1 for line in trace.read_text(errors="replace").splitlines() if any(q in line for q in quoted))


def copies(stage_root: Path, host: str) -> Path:
    return stage_root / f"hpctorch-stage-{os.getuid()}" / host / "copies"


def copy_of(stage_root: Path, host: str, python: Path) -> Path | None:
    """The mark of ``host``'s copy of the environment of ``python``, if it has one."""
    env_root = str(python.parent.parent)
    for mark in copies(stage_root, host).glob("*/staged.json"):
        if env_root in json.loads(mark.read_text())["roots"]:
            return mark
    return None


def test_every_rank_imports_from_its_own_nodes_copy_and_the_shared_path_is_spared(cluster: Cluster, tmp_path: Path, stage_root: Path) -> None:
    plain_dir, staged_dir = tmp_path / "plain", tmp_path / "staged"
    for folder in (plain_dir, staged_dir):
        folder.mkdir(mode=0o755)
    # 3 ranks per node: what remains with staging is hpctorch's own start (~260 calls: Python's and
    # hpctorch's imports before the copy is there), the same per node whatever the rank count;
    # the node's import of torch (~15,000 calls, once: its ranks are forked) is what staging spares.
    state, output = job(cluster, plain_dir, trace=True, per_node=3)
    assert state == "COMPLETED", output[-3000:]
    assert {r["torch"].startswith(ROOTS) for r in ranks(output)} == {True}
    state, output = job(cluster, staged_dir, "--stage-env", "--stage-dir", str(stage_root), trace=True, per_node=3)
    assert state == "COMPLETED", output[-3000:]
    seen = ranks(output)
    assert sorted(int(r["rank"]) for r in seen) == list(range(9)) and {r["sum"] for r in seen} == {"9"}, output[-3000:]
    for r in seen:
        # The venv's and its base's (the stdlib, and libpython by LD_LIBRARY_PATH: pyenv's RUNPATH names the shared path) alike.
        for field in ("torch", "prefix", "base", "json") + (("libpython",) if r["libpython"] != "none" else ()):
            assert r[field].startswith(str(copies(stage_root, r["host"])) + "/"), (field, r)
    assert "hpctorch: the workers run from a copy of" in output
    # Node 0 alone packed; the others received (node3 from node2, fan-out 1).
    assert list((stage_root / f"hpctorch-stage-{os.getuid()}" / "node1" / "packs").glob("*.tar"))
    assert not (stage_root / f"hpctorch-stage-{os.getuid()}" / "node3" / "packs").exists()
    without, with_staging = environment_calls(plain_dir / "trace"), environment_calls(staged_dir / "trace")
    print(f"node3's file-system calls on {', '.join(ROOTS)}: {without} without staging, {with_staging} with "
          f"({100 * with_staging / without:.2f}%)")
    assert without > 10_000, without  # the node's one import of torch (the zygote its three ranks are forked from)
    assert with_staging <= 0.02 * without, (with_staging, without)
    assert with_staging < 300, with_staging  # hpctorch's own start before the copy (docs/staging.md, "What it costs")


@pytest.mark.disturbs_cluster  # node2 held to 10% of a CPU: no other job may run there meanwhile
def test_a_slow_middle_node_stops_at_the_deadline_and_runs_from_the_shared_path(cluster: Cluster, job_dir: Path,
                                                                              stage_root: Path) -> None:
    """node2, the chain's middle, has no copy of the environment (all 1.5 GB of it, packed by the test
    before: node 0 keeps its pack) and 10% of one CPU; node3 below it has its copy. With
    HPCTORCH_STAGE_TIMEOUT_S=60 and =try, node2 stops unpacking (node1 cuts it off once its pace
    shows it cannot finish in time, or its deadline stops it) and says so, and the job trains:
    node2 from the shared path, the others from their copies. Before, nothing
    bounded a node's unpacking (only 60 s without a byte): node2 unpacked for minutes at 10%."""
    shutil.rmtree(copies(stage_root, "node2"))
    out, said = job_dir / "out.txt", "node2 could not stage the environment"
    started = time.monotonic()
    seen_at: list[float] = []

    def line_seen() -> bool:  # the quota is lifted then: node2's workers need not import torch at 10%
        if out.exists() and said in out.read_text(errors="replace"):
            seen_at.append(time.monotonic() - started)
            return True
        return False

    with throttling(cluster, lifted=line_seen, node="node2", percent=10):
        # The whole environment (HPCTORCH_STAGE_HOT=0), not what the test before read of node1's copy.
        state, output = job(cluster, job_dir, "--stage-env=try", "--stage-dir", str(stage_root),
                            env="export HPCTORCH_STAGE_TIMEOUT_S=60 HPCTORCH_STAGE_HOT=0\n")
    assert state == "COMPLETED", output[-3000:]
    # Cut off by node1 once its pace showed it would end past the deadline, or, had its pace been
    # enough at first, stopped at the deadline itself.
    assert re.search(r"node2 could not stage the environment \((cut off by node 0 \(node1\): it took [\d.]+ MiB/s, [\d.]+ of [\d.]+ MiB, and would "
                     r"not finish within its staging time \(HPCTORCH_STAGE_TIMEOUT_S\)|its staging time \(HPCTORCH_STAGE_TIMEOUT_S\) "
                     r"ran out at [\d.]+ of [\d.]+ MiB)\); it runs from the shared path", output), output[-3000:]
    # The deadline kept: 60 s from node2's start, which its job's start and its own start at 10% precede.
    assert seen_at and seen_at[0] < 60 + 60, seen_at
    seen = ranks(output)
    assert sorted(int(r["rank"]) for r in seen) == list(range(6)) and {r["sum"] for r in seen} == {"6"}, output[-3000:]
    for r in seen:
        assert r["prefix"].startswith(ROOTS) if r["host"] == "node2" else r["prefix"].startswith(str(copies(stage_root, r["host"])) + "/"), r


def test_a_second_job_on_the_same_nodes_reuses_every_copy(cluster: Cluster, job_dir: Path, stage_root: Path, small_python: Path) -> None:
    hosts = ("node1", "node2", "node3")
    state, output = job(cluster, job_dir, "--stage-env", "--stage-dir", str(stage_root), python=small_python)
    assert state == "COMPLETED", output[-3000:]
    marks = {host: json.loads(copy_of(stage_root, host, small_python).read_text())["made"] for host in hosts}  # type: ignore[union-attr]
    state, output = job(cluster, job_dir, "--stage-env", "--stage-dir", str(stage_root), python=small_python)
    assert state == "COMPLETED", output[-3000:]
    assert {host: json.loads(copy_of(stage_root, host, small_python).read_text())["made"] for host in hosts} == marks  # type: ignore[union-attr]
    seen = ranks(output)
    assert len(seen) == 6 and all(r["prefix"].startswith(str(copies(stage_root, r["host"]))) for r in seen), output[-3000:]


HOT = textwrap.dedent("""
    import os, torch, torch.distributed as dist, stagedmark
    dist.init_process_group("gloo")
    with open(os.path.join(os.path.dirname(stagedmark.__file__), "data.bin"), "rb") as data:
        read = len(data.read())
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"where host={os.uname().nodename} rank={dist.get_rank()} sum={total.item():.0f} mark={stagedmark.__file__} read={read}", flush=True)
    dist.destroy_process_group()
    os._exit(0)
""")


def test_once_jobs_ran_from_node_0s_copy_a_new_node_gets_what_they_read_and_links_for_the_rest(
        cluster: Cluster, job_dir: Path, stage_root: Path, small_python: Path) -> None:
    """#42's "copy only what jobs import": a first job makes every node's copy whole and its workers
    record what they read (node1's is node 0's record); node2 and node3 then lose their copies, and
    the next job's pack carries what the first job read (the marked package, its data) whole and
    the rest (a package nobody imports) as links to the shared path: smaller, and the job runs."""
    for host in ("node1", "node2", "node3"):  # fresh copies: node 0's record is this test's job's alone
        mark = copy_of(stage_root, host, small_python)
        if mark is not None:
            shutil.rmtree(mark.parent)
    (job_dir / "hot.py").write_text(HOT)
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\n{ONE_THREAD}export HPCTORCH_STAGE_FANOUT=1\n"
                      f"srun {small_python} -m hpctorch run --stage-env --stage-dir {stage_root} --nproc-per-node 2 {job_dir / 'hot.py'}\n")
    state, output = cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=1", timeout=600)
    assert state == "COMPLETED", output[-3000:]
    assert all(copy_of(stage_root, host, small_python) is not None for host in ("node1", "node2", "node3")), output[-3000:]
    for host in ("node2", "node3"):
        shutil.rmtree(copy_of(stage_root, host, small_python).parent)  # type: ignore[union-attr]
    state, output = cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=1", timeout=600)
    assert state == "COMPLETED", output[-3000:]
    assert re.search(r"hpctorch: packing what jobs read of the environment \([\d,]+ of [\d,]+ files; the others as links to the shared "
                     r"path\) for the 2 node\(s\) without a copy", output), output[-3000:]
    seen = ranks(output)
    assert sorted(int(r["rank"]) for r in seen) == list(range(6)) and {r["sum"] for r in seen} == {"6"}, output[-3000:]
    assert {r["read"] for r in seen} == {str(smallenv.DATA_BYTES)}, seen
    for r in seen:
        assert r["mark"].startswith(str(copies(stage_root, r["host"])) + "/"), r
    copy = copy_of(stage_root, "node3", small_python).parent  # type: ignore[union-attr]
    package = next(copy.glob(f"0/lib/python*/site-packages/{smallenv.PACKAGE}"))
    cold = package.parent / smallenv.COLD_PACKAGE
    assert (package / "data.bin").is_file() and not (package / "data.bin").is_symlink()
    original = small_python.parent.parent.resolve()
    assert os.readlink(cold) == str(original / cold.relative_to(copy / "0"))  # the folder nobody read: one link
    packs = sorted((stage_root / f"hpctorch-stage-{os.getuid()}" / "node1" / "packs").glob(f"{copy.name}*.tar"), key=lambda p: p.stat().st_size)
    assert [p.name.startswith(f"{copy.name}-hot-") for p in packs] == [True, False], packs
    assert packs[1].stat().st_size - packs[0].stat().st_size > 0.99 * smallenv.DATA_BYTES, packs  # the cold package's data stayed behind


@contextmanager
def full(stage_root: Path, host: str) -> Iterator[None]:
    """``host``'s staging folder is a 1 MiB file system of its own (a full node-local disk)."""
    folder = stage_root / f"hpctorch-stage-{os.getuid()}" / host
    folder.parent.mkdir(mode=0o700, exist_ok=True)
    aside = folder.with_name(f"{host}.aside")
    if folder.exists():
        folder.rename(aside)
    folder.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=False)
        folder.rmdir()
        if aside.exists():
            aside.rename(folder)


@pytest.fixture
def full_node3(stage_root: Path) -> Iterator[None]:
    with full(stage_root, "node3"):
        yield


def test_a_node_without_room_stops_the_job_before_its_workers_or_runs_from_the_shared_path(
        cluster: Cluster, job_dir: Path, stage_root: Path, small_python: Path, full_node3: None) -> None:
    state, output = job(cluster, job_dir, "--stage-env", "--stage-dir", str(stage_root), python=small_python)
    assert state == "FAILED", output[-3000:]
    assert ranks(output) == [], output[-3000:]  # no worker started
    assert re.search(r"node3 could not stage the environment: no space for the environment in \S+: it needs [\d.]+ MiB", output), output[-3000:]
    assert "1 of 3 nodes could not stage the environment (first: node3: no space" in output, output[-3000:]
    assert "Traceback" not in output
    state, output = job(cluster, job_dir, "--stage-env=try", "--stage-dir", str(stage_root), python=small_python)
    assert state == "COMPLETED", output[-3000:]
    assert "node3 could not stage the environment (no space" in output and "it runs from the shared path" in output, output[-3000:]
    seen = ranks(output)
    assert len(seen) == 6
    for r in seen:
        assert r["prefix"].startswith(str(small_python.parent.parent) if r["host"] == "node3" else str(copies(stage_root, r["host"]))), r


def test_the_child_of_a_node_without_room_takes_the_pack_from_node_0(cluster: Cluster, job_dir: Path, stage_root: Path,
                                                                     small_python: Path) -> None:
    """node2, the chain's middle, has room neither for its copy nor for the bytes it would keep for
    node3, which has no copy either: node3 asks node2's parent, node 0, for the pack and runs from
    its own copy; node2, with =try, from the shared path. Before, node2's failure took node3 with it."""
    mark = copy_of(stage_root, "node3", small_python)
    if mark is not None:
        shutil.rmtree(mark.parent)
    with full(stage_root, "node2"):
        state, output = job(cluster, job_dir, "--stage-env=try", "--stage-dir", str(stage_root), python=small_python)
    assert state == "COMPLETED", output[-3000:]
    assert re.search(r"hpctorch: node3 takes the pack from node 0 \(node1\) from [\d.]+ MiB on \(", output), output[-3000:]
    assert "node2 could not stage the environment (" in output and "node3 could not stage" not in output, output[-3000:]
    assert copy_of(stage_root, "node3", small_python) is not None
    seen = ranks(output)
    assert sorted(int(r["rank"]) for r in seen) == list(range(6)) and {r["sum"] for r in seen} == {"6"}, output[-3000:]
    for r in seen:
        assert r["prefix"].startswith(str(small_python.parent.parent) if r["host"] == "node2" else str(copies(stage_root, r["host"]))), r


def test_per_task_each_nodes_first_rank_stages_and_its_other_ranks_use_the_copy(cluster: Cluster, job_dir: Path, stage_root: Path,
                                                                                small_python: Path) -> None:
    """srun starts every rank (no hpctorch process beside them): node 0's first rank serves the
    staging store with torch's TCPStore, every other rank reaches it with hpctorch's own client."""
    (job_dir / "where.py").write_text(WHERE)
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\n{ONE_THREAD}srun {small_python} -m hpctorch run --stage-env --stage-dir {stage_root} {job_dir / 'where.py'}\n")
    state, output = cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=2", timeout=600)
    assert state == "COMPLETED", output[-3000:]
    seen = ranks(output)
    assert sorted(int(r["rank"]) for r in seen) == list(range(6)) and {r["sum"] for r in seen} == {"6"}, output[-3000:]
    for r in seen:
        assert r["prefix"].startswith(str(copies(stage_root, r["host"])) + "/"), r
    assert output.count("hpctorch: the workers run from a copy of") == 1, output[-3000:]

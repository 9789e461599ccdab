"""The cluster fixture: built once per test session, torn down even after failures."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..conftest import ROOT, require, unprefixed
from .harness import STATE_DIR, Cluster, missing_requirements, turn

PYTHON = sys.executable
TOY = str(ROOT / "examples" / "toy_ddp.py")
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
ONE_THREAD = "export OMP_NUM_THREADS=1\n"
"""The 3 nodes share this machine's 2 cores: with torch's default of a thread per core, 6 threads
spin for 2 cores and who gets them decides the CPU figures (a balanced run once named node3 at
0.44x the median in CI). Real nodes do not share cores; one thread each makes the shares even here."""


SHARED = "HPCTORCH_TEST_CLUSTER"
"""Set to ``shared`` by scripts/run-tests once it has built the cluster: the test processes it
starts side by side use that one, and leave it up for the next."""


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    nodes = int(os.environ.get("HPCTORCH_CLUSTER_NODES", "2"))
    if os.environ.get(SHARED) == "shared":  # its requirements were checked as it was built (the probe is one namespace)
        shared = Cluster(nodes)
        if not shared.conf.exists():
            pytest.fail(f"{SHARED}=shared, but no test cluster is up ({shared.conf} is missing): python -m tests.cluster up")
        yield shared
        return
    missing = missing_requirements()
    require(not missing, f"the test cluster needs {', '.join(missing)}")
    built = Cluster(nodes).up()
    try:
        yield built
    finally:
        built.down()


@pytest.fixture(autouse=True)
def cluster_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """Several test processes may share the cluster (scripts/run-tests): each test holds it
    shared, and one marked ``disturbs_cluster`` (a node slowed, cut off) holds it alone."""
    if "cluster" not in request.fixturenames:
        yield
        return
    with turn(STATE_DIR, exclusive=request.node.get_closest_marker("disturbs_cluster") is not None):
        yield


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    # /tmp is shared by every namespace: the job's submit directory.
    tmp_path.chmod(0o755)
    return tmp_path


def toy_ranks(output: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in unprefixed(output).splitlines() if line.startswith("rank=")]


def assert_trained_across_nodes(output: str, nodes: int = 2, per_node: int = 2) -> None:
    """World size, every rank once, node ranks matching hosts, one fabric master, loss down."""
    ranks = toy_ranks(output)
    world = nodes * per_node
    assert sorted(int(r["rank"]) for r in ranks) == list(range(world)), output
    assert {r["world"] for r in ranks} == {str(world)}
    for r in ranks:
        assert r["host"] == f"node{int(r['node_rank']) + 1}", r
        assert int(r["rank"]) // per_node == int(r["node_rank"]), r
    masters = {r["master"] for r in ranks}
    assert len(masters) == 1 and next(iter(masters)).startswith("198.18.0.1:"), masters
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", unprefixed(output), re.M)]
    assert losses and losses[-1] < losses[0]
    assert f"done world={world}" in output


@contextmanager
def throttling(cluster: Cluster, once: Path | None = None, lifted: Callable[[], bool] | None = None, node: str = "node3",
               percent: int = 15) -> Iterator[str]:
    """``node``'s slurmd, and so every process of its job steps, in a cgroup held to ``percent``%
    of one CPU: at once, or from when the file ``once`` exists, and until ``lifted()`` says so (the
    group is the same throughout, only its quota changes): a test of what a slow node does at one
    stage need not wait out the others at 15% of a CPU (each torch import takes 20 s there)."""
    group = CPU_CGROUP / f"hpct-{node}"
    quota = str(percent * 1000)
    if not (CPU_CGROUP / "cgroup.procs").exists():
        pytest.fail("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu to throttle a node with")
    slurmd = (cluster.dir / f"slurmd-{node}.pid").read_text().strip()
    group.mkdir(exist_ok=True)
    stop = threading.Event()

    def until(done: Callable[[], bool], quota: str) -> None:
        while not stop.is_set() and not done():
            stop.wait(0.1)
        if not stop.is_set():
            (group / "cpu.cfs_quota_us").write_text(quota)

    def hold_then_lift() -> None:
        if once is not None:
            until(once.exists, quota)
        if lifted is not None:
            until(lifted, "-1")

    waiter = threading.Thread(target=hold_then_lift, daemon=True)
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("-1" if once else quota)
        (group / "cgroup.procs").write_text(slurmd)
        waiter.start()
        yield node
    finally:
        stop.set()
        if waiter.ident is not None:
            waiter.join()
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone meanwhile
        os.rmdir(group)


@pytest.fixture
def throttled_screen(cluster: Cluster, job_dir: Path) -> Iterator[str]:
    """node3 held to 15% of one CPU from before its job starts until node 0 has printed the
    screen's judgement (``hpctorch: screen: N nodes in``) to the job's output."""
    out = job_dir / "out.txt"
    with throttling(cluster, lifted=lambda: out.exists() and "hpctorch: screen: 3 nodes in " in out.read_text(errors="replace")) as node:
        yield node


@pytest.fixture
def throttled_training(cluster: Cluster, job_dir: Path) -> Iterator[str]:
    """node3 held to 15% of one CPU from when its rank writes ``training-node3`` in the job's folder."""
    with throttling(cluster, job_dir / "training-node3") as node:
        yield node

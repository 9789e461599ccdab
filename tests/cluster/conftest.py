"""The cluster fixture: built once per test session, torn down even after failures."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import ROOT, require, unprefixed
from .harness import Cluster, missing_requirements

PYTHON = sys.executable
TOY = str(ROOT / "examples" / "toy_ddp.py")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    missing = missing_requirements()
    require(not missing, f"the test cluster needs {', '.join(missing)}")
    nodes = int(os.environ.get("HPCTORCH_CLUSTER_NODES", "2"))
    built = Cluster(nodes).up()
    try:
        yield built
    finally:
        built.down()


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

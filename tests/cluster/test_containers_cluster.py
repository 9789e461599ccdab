"""A job inside a real container runtime on the 2-node cluster: Charliecloud's ch-run under
srun, per node and per task, with an image built here from Debian's packages.

The image is a Debian bookworm root made by debootstrap (cached between runs); this
checkout and its Python are bound into it at their own paths, as sites bind a software
stack into an image. Inside, the container's own /etc/hosts does not know the nodes'
names, as in most images: hpctorch finds the master through the bound job directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT, require
from .conftest import PYTHON, TOY, assert_trained_across_nodes
from .harness import Cluster

pytestmark = pytest.mark.cluster
IMAGE = Path("/var/cache/hpctorch-tests/image")


@pytest.fixture(scope="module")
def image() -> Path:
    require(shutil.which("ch-run") is not None, "ch-run is not installed (apt-get install charliecloud-runtime)")
    require(shutil.which("debootstrap") is not None, "debootstrap is not installed (apt-get install debootstrap)")
    # Waits for the build make test started beside the venv's install, or builds the image itself.
    built = subprocess.run([str(ROOT / "scripts" / "build-test-image"), str(IMAGE)], capture_output=True, text=True, timeout=1900)
    require(built.returncode == 0 and (IMAGE / "etc" / "debian_version").exists(),
            f"debootstrap could not build the image: {built.stdout[-500:]}{built.stderr[-500:]}")
    return IMAGE


def ch_run(image: Path, job_dir: Path, *argv: str) -> list[str]:
    """ch-run with the checkout, the interpreter's installation and the job directory bound in."""
    binds = [str(ROOT), sys.base_prefix, str(job_dir)]
    for path in binds:
        (image / path.lstrip("/")).mkdir(parents=True, exist_ok=True)  # ch-run binds onto existing directories
    return ["env", f"USER={os.environ.get('USER', 'root')}", "ch-run", *(f"-b{p}:{p}" for p in binds), f"--cd={job_dir}", str(image), "--", *argv]


@pytest.mark.parametrize("per_node", [1, 2])
def test_a_job_inside_charliecloud(cluster: Cluster, job_dir: Path, image: Path, per_node: int) -> None:
    nproc = ["--nproc-per-node", "2"] if per_node == 1 else []
    inner = ch_run(image, job_dir, PYTHON, "-m", "hpctorch", "run", *nproc, TOY, "--steps", "6")
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-N2", f"--ntasks-per-node={per_node}",
                                 "--kill-on-bad-exit=1", *inner], timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert_trained_across_nodes(done.stdout)
    if per_node == 1:  # node 0's plan, printed from inside the container
        assert any(line.split()[:2] == ["container", "charliecloud"] for line in done.stderr.splitlines()), done.stderr[-3000:]

"""Container runtimes, from what each documents leaving inside the container."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctorch.host import containers


@pytest.mark.parametrize("env, files, runtime", [
    ({"APPTAINER_CONTAINER": "/scratch/pytorch.sif"}, (), "apptainer"),
    ({}, (".singularity.d/",), "apptainer"),
    ({"SINGULARITY_CONTAINER": "/x.sif"}, (), "singularity"),
    ({"CH_RUNNING": "Weird Al Yankovic"}, (), "charliecloud"),  # what ch-run 0.31 sets
    ({"container": "podman"}, (), "podman"),
    ({}, ("run/.containerenv",), "podman"),
    ({}, (".lock",), "enroot"),
    ({"SARUS_IMAGE": "nvcr.io/nvidia/pytorch"}, (), "sarus"),
    ({"SHIFTER_IMAGEREQUEST": "nersc/pytorch"}, (), "shifter"),
    ({}, (".dockerenv",), "docker"),
    ({"CH_RUNNING": ""}, (), None),
    ({}, (), None),
])
def test_each_runtime(tmp_path: Path, env: dict[str, str], files: tuple[str, ...], runtime: str | None) -> None:
    for name in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if name.endswith("/") else path.touch()
    assert containers.detect(env, root=str(tmp_path)) == runtime

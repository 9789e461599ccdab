"""Which container runtime this process runs in, from what each one documents leaving
behind inside the container. Read-only, cheap (environment lookups and a few stats)."""

from __future__ import annotations

import os
from collections.abc import Mapping

# (runtime, variable that says so, its value or "" for any, files at the container's root)
RUNTIMES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    # Apptainer / Singularity: apptainer.org/docs/user/main/environment_and_metadata.html
    ("apptainer", "APPTAINER_CONTAINER", "", ("/.singularity.d",)),
    ("singularity", "SINGULARITY_CONTAINER", "", ()),
    # Charliecloud: ch-run(1) sets CH_RUNNING inside the container (0.31: "Weird Al Yankovic").
    ("charliecloud", "CH_RUNNING", "", ()),
    # podman (and podman-hpc): container=podman and /run/.containerenv (podman-run(1)).
    ("podman", "container", "podman", ("/run/.containerenv",)),
    # enroot (pyxis's runtime): src/runtime.sh keeps the rootfs lock at /.lock (read-only
    # in the running container) and a bundle's files in /.enroot.
    ("enroot", "", "", ("/.enroot", "/.lock")),
    # Sarus (CSCS) and Shifter (NERSC) export their image in the environment.
    ("sarus", "SARUS_IMAGE", "", ()),
    ("shifter", "SHIFTER_IMAGEREQUEST", "", ()),
    ("docker", "", "", ("/.dockerenv",)),
)


def detect(env: Mapping[str, str], root: str = "/") -> str | None:
    """The runtime's name, or None outside any container we know."""
    for name, variable, value, files in RUNTIMES:
        if variable and env.get(variable) and (not value or env[variable] == value):
            return name
        if any(os.path.exists(os.path.join(root, f.lstrip("/"))) for f in files):
            return name
    return None

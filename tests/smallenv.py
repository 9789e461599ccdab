"""A small Python environment for the staging tests (no pytest here).

A venv of the operating system's Python (its base lies under /usr, already on every node's own
disk, so ``--stage-env`` copies the venv alone), holding a package of its own with a few MiB of
data (several of the tree's chunks) and another that no job imports (the hot set's test), that reaches torch and hpctorch in the test run's own
environment through a .pth file (a path outside the staged folders, left as it is). Packing it
takes a moment where the test run's own environment (1.4 GiB, 40,000 files) takes a minute; one
cluster test still stages that real environment (tests/cluster/test_venv_staging_cluster.py).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGE = "stagedmark"
COLD_PACKAGE = "stagedcold"
"""A package no test job imports: a hot set's pack carries it as links to the shared path."""
DATA_BYTES = 3 << 20


def missing() -> str | None:
    """Why the small environment cannot be made here, or None."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} (the system's Python, package python3)"
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
                             timeout=60).stdout.split()
    if version != [str(v) for v in sys.version_info[:2]]:
        return f"{SYSTEM_PYTHON} of this test run's Python version {sys.version_info[0]}.{sys.version_info[1]} (it is {'.'.join(version)})"
    return None


def make(where: Path) -> Path:
    """The small environment in ``where`` (made once), and its interpreter."""
    python = where / "bin" / "python"
    if python.exists():
        return python
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True, timeout=120)
    packages = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    # addsitedir, not a bare path: the shared environment's own .pth files (hpctorch's editable
    # install) must be read too.
    shared = [p for p in site.getsitepackages() if os.path.isdir(p)]
    (packages / "shared-env.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in shared))
    (packages / PACKAGE).mkdir()
    (packages / PACKAGE / "__init__.py").write_text('"""Marks where the staging tests\' environment was imported from."""\n')
    (packages / PACKAGE / "data.bin").write_bytes(os.urandom(DATA_BYTES))
    (packages / COLD_PACKAGE).mkdir()
    (packages / COLD_PACKAGE / "__init__.py").write_text('"""Never imported by the staging tests\' jobs."""\n')
    (packages / COLD_PACKAGE / "data.bin").write_bytes(os.urandom(DATA_BYTES))
    return python

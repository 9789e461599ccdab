"""Each benchmark script runs on tiny sizes (the real runs are `make bench`, not tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import ROOT, clean_env

# Beside the other tests (scripts/run-tests): a smoke run asserts that each figure comes out, never
# its size, and every test here passes on a loaded machine.

# The column each benchmark must fill with a measured number on every row.
MEASURED = {
    "first_collective": "median s",
    "plan_latency": "median ms",
    "plan_scale": "time ms (best)",
    "bootstrap": "difference s",
    "port_collisions": "wall s",
    "teardown": "median s",
    "control_plane_scale": "per node/s",
    "store_wait": "refused/s at rank 0",
    "straggler_overhead": "step on (ms)",
    "stage_spread": "time s",
    "stage_hot": "bytes per node",
    "auth_cost": "a node's verify: median ms",
    "restart": "median s",
}


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table printed: (header, rows)."""
    found, lines = [], text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("|") and index + 1 < len(lines) and lines[index + 1].startswith("|---"):
            cells = lambda row: [c.strip() for c in row.strip().strip("|").split("|")]  # noqa: E731
            rows = []
            for at in range(index + 2, len(lines)):
                following = lines[at + 1] if at + 1 < len(lines) else ""
                if not lines[at].startswith("|") or following.startswith("|---"):
                    break  # the table ends at its first other line, or where the next table's header starts
                rows.append(cells(lines[at]))
            found.append((cells(line), rows))
    return found


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_benchmark_runs_on_tiny_sizes(name: str) -> None:
    before = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--smoke"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=900)  # a hang guard: control_plane_scale alone takes minutes on a loaded 2-core machine
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    printed = [(header, rows) for header, rows in tables(done.stdout) if MEASURED[name] in header]
    assert printed, done.stdout  # a table with the measured column
    for header, rows in printed:
        assert rows, done.stdout
        column = header.index(MEASURED[name])
        for row in rows:
            assert len(row) == len(header), row
            assert float(row[column].split()[0]) > 0, (header, row)  # a measurement, not a blank or 0
    assert sorted((ROOT / "benchmarks" / "results").glob("*.json")) == before, "a smoke run must not overwrite results"

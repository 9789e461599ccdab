"""Each benchmark script runs on tiny sizes (the real runs are `make bench`, not tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import ROOT, clean_env


@pytest.mark.parametrize("name", ["first_collective", "plan_latency", "plan_scale", "bootstrap", "port_collisions", "teardown"])
def test_benchmark_runs_on_tiny_sizes(name: str) -> None:
    before = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--smoke"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.startswith("|") or "\n|" in done.stdout, done.stdout  # a markdown table
    assert sorted((ROOT / "benchmarks" / "results").glob("*.json")) == before, "a smoke run must not overwrite results"

"""A laptop without Linux's calls (macOS, Windows): sched_*affinity and rtnetlink taken away
in every process (tests/fixtures/no_linux/sitecustomize.py), real torch workers and gloo.
Not a real Mac or Windows machine: what differs there beyond these calls is untested."""

from __future__ import annotations

import os
import subprocess
import sys

from ..conftest import ROOT, clean_env, hpctorch, unprefixed

REPORT = str(ROOT / "tests" / "fixtures" / "report.py")
NO_LINUX = str(ROOT / "tests" / "fixtures" / "no_linux")


def laptop_env() -> dict[str, str]:
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (NO_LINUX, env.get("PYTHONPATH")) if p)
    return env


def test_the_pieces_are_really_gone() -> None:
    done = hpctorch("plan", "--explain", env=laptop_env())  # interfaces from psutil, not netlink
    assert done.returncode == 0, done.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "import os, socket; print(hasattr(os, 'sched_setaffinity'), hasattr(socket, 'AF_NETLINK'))"],
        capture_output=True, text=True, env=laptop_env(), timeout=60)
    assert probe.stdout.split() == ["False", "False"]


def test_one_node_two_workers_without_cpu_binding() -> None:
    done = hpctorch("run", "--verbose", "--nproc-per-node", "2", REPORT, env=laptop_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this platform cannot bind processes to CPUs" in done.stderr
    assert "HPCTORCH_CPU_SETS" not in done.stderr
    assert sum(line.startswith("REPORT ") for line in unprefixed(done.stdout).splitlines()) == 2


def test_simulated_nodes_on_a_laptop() -> None:
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "1", REPORT, env=laptop_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sum(line.startswith("REPORT ") for line in unprefixed(done.stdout).splitlines()) == 2

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


STORE_KIND = str(ROOT / "tests" / "fixtures" / "store_kind.py")


def _stores(output: str) -> list[str]:
    return sorted(line.split(" ", 1)[1] for line in unprefixed(output).splitlines() if line.startswith("STORE "))


def test_file_rendezvous_on_one_node(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The seed's Windows path: torch's FileStore in a directory, no TCP store, script unchanged.
    done = hpctorch("run", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path), "--nproc-per-node", "2", STORE_KIND,
                    env=laptop_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _stores(done.stdout) == [f"rank={r} kind=FileStore sum=2" for r in range(2)]
    assert os.listdir(tmp_path) == [], "FileStore removes its files once every user closed them"


def test_file_rendezvous_on_two_simulated_nodes() -> None:
    done = hpctorch("run", "--rdzv-backend", "file", "--simulate-nodes", "2", "--nproc-per-node", "2", STORE_KIND, env=laptop_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _stores(done.stdout) == [f"rank={r} kind=FileStore sum=4" for r in range(4)]


def test_file_rendezvous_across_nodes_needs_a_shared_directory() -> None:
    done = hpctorch("run", "--rdzv-backend", "file", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", REPORT,
                    env=clean_env(), timeout=60)
    assert done.returncode == 2
    assert "needs a directory every node shares" in done.stderr and "--rdzv-endpoint DIR" in done.stderr

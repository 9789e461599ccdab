"""Shared by the benchmarks: timing, the machine's description, results on disk."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tests.environment import clean_env  # noqa: F401 - the benchmarks import it from here

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PYTHON = sys.executable
WORKER = str(HERE / "worker_allreduce.py")


def machine() -> str:
    """One line: CPU model and count, memory, OS, Python, torch."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    torch = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    return f"{model} x {os.cpu_count()}{memory}; {platform.system()} {platform.release()}; Python {platform.python_version()}; torch {torch}"


def timed(argv: Sequence[str], timeout: float = 300, **kwargs: object) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - started, done


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def interleaved(cases: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run A B C A B C ...: drift on the machine spreads over every case alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, case in cases.items():
            times[name].append(case())
    return times


def kill_trees(processes: Sequence[subprocess.Popen]) -> None:
    """SIGKILL each process and every descendant (launchers start workers in sessions of their own)."""
    import psutil

    for process in processes:
        try:
            tree = psutil.Process(process.pid)
            victims = [*tree.children(recursive=True), tree]
        except psutil.NoSuchProcess:
            continue
        for victim in victims:
            try:
                victim.kill()
            except psutil.NoSuchProcess:
                pass


class CountingStore:
    """A store client that counts the requests made through it (a node's load on the store)."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self.store, self.requests = store, 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        method = getattr(self.store, name)

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.requests += 1
            return method(*args, **kwargs)

        return counted


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    data = {**data, "machine": machine(), "command": shlex.join([Path(PYTHON).name, "-m", f"benchmarks.{name}", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d")}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def cluster_available() -> bool:
    from tests.cluster.harness import missing_requirements

    return not missing_requirements()


@contextlib.contextmanager
def work_and_cluster(name: str, wanted: bool) -> Iterator[tuple[Path, "object | None"]]:
    """A work folder (0755: the namespaces' processes write there) and, where ``wanted`` and this
    machine can run it, the 2-node test cluster; both gone afterwards."""
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=f"hpctorch-bench-{name}-"))
    work.chmod(0o755)
    cluster = None
    try:
        if wanted and cluster_available():
            from tests.cluster.harness import Cluster

            cluster = Cluster(2).up()
        yield work, cluster
    finally:
        if cluster is not None:
            cluster.down()
        shutil.rmtree(work, ignore_errors=True)


def isolated(module: str, argv: list[str]) -> int | None:
    """Re-run ``python -m module argv`` in a network namespace of its own (loopback only) where root
    can make one: this VM's resolver never answers, and torch's store looks up every connection's
    peer name, which then waits out the resolver's timeout; in a namespace without a route the
    lookup fails at once, as it answers at once on a cluster with working DNS. Returns the exit
    status, or None to run here."""
    import shutil

    if os.environ.get("HPCTORCH_BENCH_ISOLATED") or os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    script = "ip link set lo up && exec \"$0\" \"$@\""  # argv travels as arguments, never through the shell's text
    env = {**clean_env(), "HPCTORCH_BENCH_ISOLATED": "1"}
    return subprocess.run(["unshare", "--net", "--", "sh", "-c", script, PYTHON, "-m", module, *argv],
                          cwd=ROOT, env=env, check=False).returncode

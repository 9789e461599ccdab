"""torchrun lines with the command name swapped: torch's c10d rendezvous with no node rank
given, an elastic node range with a node that joins late, and a torch.distributed.launch
script that reads --local_rank from its arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

from hpctorch.host.network import connect, free_port

from ..conftest import ROOT, clean_env, hpctorch, unprefixed

REPORT = str(ROOT / "tests" / "fixtures" / "report.py")
LAUNCH_STYLE = str(ROOT / "tests" / "fixtures" / "launch_style.py")


def _reports(output: str) -> list[dict]:
    return [json.loads(line[len("REPORT "):]) for line in unprefixed(output).splitlines() if line.startswith("REPORT ")]


def _nodes(argvs: list[list[str]], after: Callable[[], bool] | None = None) -> list[subprocess.CompletedProcess]:
    """Every node's run; with ``after``, the nodes after the first start once it holds."""
    processes = []
    for number, argv in enumerate(argvs):
        deadline = time.monotonic() + 120
        while number and after is not None and not after():
            assert time.monotonic() < deadline, "the first node never got there"
            time.sleep(0.05)
        processes.append(subprocess.Popen([sys.executable, "-m", "hpctorch", "run", *argv], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=ROOT))
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=300)  # hang guard, past the last call's 150 s
            results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    finally:
        for process in processes:
            process.kill()
    return results


def test_c10d_rendezvous_without_node_ranks() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    line = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "t1", REPORT]
    results = _nodes([line, line])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    reports = [r for result in results for r in _reports(result.stdout)]
    assert sorted(r["env"]["RANK"] for r in reports) == ["0", "1"]
    assert {r["env"]["WORLD_SIZE"] for r in reports} == {"2"} and {r["env"]["TORCHELASTIC_RUN_ID"] for r in reports} == {"t1"}


def test_an_elastic_range_takes_a_node_that_joins_late() -> None:
    port = free_port()
    line = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-conf", "last_call_timeout=150", REPORT]
    # The second node starts once the first is in the rendezvous (its store listens), within the last
    # call: the second node reaching the rendezvous (hpctorch's start and torch's import) took more than
    # 20 s on a loaded machine once. Two nodes, the range's maximum, complete the rendezvous at once.
    results = _nodes([line, line], after=lambda: connect("127.0.0.1", port, 0.5)["ok"])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    reports = [r for result in results for r in _reports(result.stdout)]
    assert {r["env"]["WORLD_SIZE"] for r in reports} == {"2"}, reports


def test_a_launch_style_script_gets_its_local_rank_as_an_argument() -> None:
    done = hpctorch("run", "--use_env", "--nproc-per-node", "2", "--local-rank-arg=--local_rank", LAUNCH_STYLE,
                    "--local_world_size=2", env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = sorted(line for line in unprefixed(done.stdout).splitlines() if line.startswith("LAUNCH "))
    assert seen == ["LAUNCH local_rank=0 local_world_size=2", "LAUNCH local_rank=1 local_world_size=2"], done.stdout

"""What a user sees from hpctorch run: a short banner, progress while a node is missing,
a closing summary; --verbose, --quiet and --summary-json."""

from __future__ import annotations

import json
from pathlib import Path

from hpctorch.host.network import free_port

from ..conftest import ROOT, clean_env, hpctorch

REPORT = str(ROOT / "tests" / "fixtures" / "report.py")


def ours(stderr: str) -> list[str]:
    """hpctorch's own lines (workers' lines are prefixed with their rank)."""
    return [line for line in stderr.splitlines() if line and not line.startswith("[")]


def test_a_default_run_prints_a_banner_and_a_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "2", "--summary-json", str(summary), REPORT,
                    env=clean_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = ours(done.stderr)
    before = lines[: next(i for i, line in enumerate(lines) if line.startswith("hpctorch: finished"))]
    assert len(before) <= 8, before
    assert before[0].startswith("hpctorch: 2 node(s) (not named by the launcher) x 2 = world size 4"), before
    assert "RANK=" not in done.stderr
    assert any(line.startswith("hpctorch: finished in ") and "exit 0 on all 2 node(s)" in line and "slowest start" in line
               for line in lines), lines
    data = json.loads(summary.read_text())
    # No --log-dir: the temporary per-rank logs went with the success (the console had them).
    assert data["exit_code"] == 0 and len(data["succeeded"]) == 2 and data["logs"] is None
    kept = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "1", "--summary-json", str(summary), "--log-dir",
                    str(tmp_path / "logs"), REPORT, env=clean_env(), timeout=240)
    assert kept.returncode == 0, kept.stderr[-3000:]
    logs = json.loads(summary.read_text())["logs"]
    assert logs and Path(logs).is_dir() and str(tmp_path / "logs") in logs


def test_verbose_prints_the_whole_plan_and_quiet_nothing_of_ours() -> None:
    verbose = hpctorch("run", "--verbose", "--nproc-per-node", "2", REPORT, env=clean_env(), timeout=240)
    assert verbose.returncode == 0 and "workers on this machine (2):" in verbose.stderr, verbose.stderr[-3000:]
    quiet = hpctorch("run", "--quiet", "--nproc-per-node", "2", REPORT, env=clean_env(), timeout=240)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert not [line for line in ours(quiet.stderr) if line.startswith("hpctorch")], quiet.stderr


def test_a_missing_node_is_named_while_node_0_waits() -> None:
    # Node 0 of a two-host list whose other host never starts: progress names it, then the timeout does.
    done = hpctorch("run", "--hosts", "127.0.0.1,ghost-node", "--master-port", str(free_port()), "--rdzv-timeout", "25",
                    "--nproc-per-node", "1", REPORT, "--init", env=clean_env(), timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    # Rank 0 waits (hpctorch starts the workers, which check the nodes agree in init_process_group).
    progress = [line.split("]: ", 1)[-1] for line in done.stderr.splitlines() if "waiting for 1 of 2 nodes (ghost-node)" in line]
    assert progress and progress[0].endswith("of 25 s"), done.stderr[-3000:]
    assert "ghost-node" in done.stderr.strip().splitlines()[-1]

"""--screen on 3 real Slurm nodes: a balanced cluster names nobody; a node whose link is shaped
with tc, or whose CPU is held to a cgroup quota, is named with its measure, its figure and the
median, and lands on the user's bad-node list, which the next job's script leaves out."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..conftest import unprefixed
from .conftest import ONE_THREAD, PYTHON, TOY, toy_ranks
from .harness import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.serial]  # judges CPU and link measures against the other nodes: alone (scripts/run-tests)
HPCTORCH = f"{PYTHON} -m hpctorch"
SHAPED = "20mbit"


def screened(cluster: Cluster, job_dir: Path, *flags: str) -> tuple[str, str, dict]:
    """A 3-node job on the wide partition with --screen: (final state, output, summary JSON)."""
    summary = job_dir / "summary.json"
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nexport HPCTORCH_BAD_NODES={job_dir / 'bad-nodes.jsonl'}\n{ONE_THREAD}"
                      f"srun {HPCTORCH} run {' '.join(flags)} --nproc-per-node 1 --summary-json {summary} {TOY} --steps 2\n")
    state, output = cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=1")
    return state, output, (json.loads(summary.read_text()) if summary.exists() else {})


def screen_lines(output: str) -> list[str]:
    return [line for line in unprefixed(output).splitlines() if line.startswith("hpctorch: screen: ")]


@contextmanager
def shaped(cluster: Cluster, index: int) -> Iterator[str]:
    """node<index>'s fabric at 20 Mbit/s both ways: its own egress, and the bridge's port towards it."""
    node = f"node{index}"
    ends = [["ip", "netns", "exec", cluster.netns(node), "tc", "qdisc", "{}", "dev", "hsn0", "root"], ["tc", "qdisc", "{}", "dev", f"hpctf{index}h", "root"]]
    shape = ["tbf", "rate", SHAPED, "burst", "32kbit", "latency", "50ms"]
    try:
        for end in ends:
            subprocess.run([w.format("add") for w in end] + shape, check=True, capture_output=True, timeout=10)
        yield node
    finally:
        for end in ends:
            subprocess.run([w.format("del") for w in end], check=False, capture_output=True, timeout=10)


@pytest.fixture
def shaped_link(cluster: Cluster) -> Iterator[str]:
    with shaped(cluster, 3) as node:
        yield node


@pytest.mark.parametrize("starter", [(), ("--max-restarts", "1")], ids=["hpctorch-starter", "torch-agent"])
def test_a_balanced_cluster_names_nobody_and_trains(cluster: Cluster, job_dir: Path, starter: tuple[str, ...]) -> None:
    """Under both starters: the screen's store on the master port is gone before the job's own
    (hpctorch's starter holds the port for rank 0; torch's agent serves its c10d store there)."""
    state, output, summary = screened(cluster, job_dir, "--screen", *starter)
    assert state == "COMPLETED", output[-3000:]
    assert screen_lines(output)[-1].startswith("hpctorch: screen: 3 nodes in ") and screen_lines(output)[-1].endswith("no node below 0.5x the median"), output[-3000:]
    assert "not measured: GPUs (none visible) on 3 nodes" in output
    figures = summary["screen"]["figures"]
    assert sorted(figures) == ["0", "1", "2"]
    for node, record in figures.items():
        assert record["figures"]["compute_gflops"] > 0 and record["figures"]["memory_gbs"] > 0, record
        assert record["fabric"]["to"] == (int(node) + 1) % 3 and record["fabric"]["mbs"] > 0, record
    assert summary["screen"]["findings"] == []
    assert len(toy_ranks(output)) == 3
    assert not (job_dir / "bad-nodes.jsonl").exists()


def test_a_shaped_link_is_named_and_fail_stops_before_the_workers(cluster: Cluster, job_dir: Path, shaped_link: str) -> None:
    state, output, _ = screened(cluster, job_dir, "--screen=fail")
    assert state == "FAILED", output[-3000:]
    named = [line for line in screen_lines(output) if line.startswith(f"hpctorch: screen: {shaped_link}: fabric ")]
    assert len(named) == 1, output[-3000:]
    # Both its links measured at the shaped rate (20 Mbit/s = 2.5 MB/s), the median far above: by a
    # factor, not in GB/s, which a loaded machine's links fall short of (775 MB/s under yes x2).
    rate = r"([\d.]+) ([kMGT]?)B/s"
    figures = re.fullmatch(rf".*fabric {rate} to node1, {rate} from node2 \(median {rate}\)", named[0])
    assert figures, named
    scale = {"": 1e-6, "k": 1e-3, "M": 1.0, "G": 1e3, "T": 1e6}
    to, away, median = (float(figures[i]) * scale[figures[i + 1]] for i in (1, 3, 5))  # MB/s
    assert max(to, away) <= 2.5 * 1.2 and median >= 20 * max(to, away), named
    assert not [line for line in screen_lines(output) if line.startswith(("hpctorch: screen: node1:", "hpctorch: screen: node2:"))], output[-3000:]
    assert output.count("hpctorch: error: the screen judged 1 node(s) bad (node3); no worker was started") == 1, output[-3000:]
    assert toy_ranks(output) == []
    listed = [json.loads(line) for line in (job_dir / "bad-nodes.jsonl").read_text().splitlines()]
    assert [e["node"] for e in listed] == ["node3"] and "fabric" in listed[0]["reason"]
    # Its evidence: the rule in the reason, the figures beside it (the link's figure under half its median).
    assert listed[0]["reason"].endswith("(named below 0.5x the median of its kind)"), listed[0]["reason"]
    evidence = listed[0]["evidence"]
    assert evidence["by"] == "screen" and evidence["threshold"] == 0.5
    fabric = next(f for f in evidence["findings"] if f["measure"] == "fabric")
    assert fabric["key"] == "mbs" and fabric["value"] < 0.5 * fabric["median"], evidence
    # The next job's script leaves it out.
    dry = subprocess.run([PYTHON, "-m", "hpctorch", "submit", "--dry-run", "--scheduler", "slurm", "--nodes", "2", "--time", "10", TOY],
                         env={**cluster.env(), "HPCTORCH_BAD_NODES": str(job_dir / "bad-nodes.jsonl")}, capture_output=True, text=True, timeout=60)
    assert "#SBATCH --exclude=node3" in dry.stdout, dry.stdout + dry.stderr


def test_a_throttled_cpu_is_named_and_warn_goes_on(cluster: Cluster, job_dir: Path, throttled_screen: str) -> None:
    state, output, summary = screened(cluster, job_dir, "--screen")
    assert state == "COMPLETED", output[-3000:]
    assert any(line.startswith(f"hpctorch: screen: {throttled_screen}: compute ") for line in screen_lines(output)), output[-3000:]
    assert not [line for line in screen_lines(output) if line.startswith(("hpctorch: screen: node1:", "hpctorch: screen: node2:"))], output[-3000:]
    assert {f["host"] for f in summary["screen"]["findings"]} == {throttled_screen}
    compute = next(f for f in summary["screen"]["findings"] if f["measure"] == "compute")
    # Compared with its kind (the three nodes are one machine: one CPU model, one thread each).
    assert compute["value"] < 0.5 * compute["median"] and compute["kind"].endswith(", 1 thread"), compute
    assert len(toy_ranks(output)) == 3  # warn: the job ran anyway


def test_the_doctor_names_a_shaped_link_and_every_node_hears_the_verdict(cluster: Cluster, job_dir: Path, shaped_link: str) -> None:
    """Before: the doctor timed a 16 MiB all_reduce (10 s on this link), printed 'every check
    passed', and nodes 1 and 2 passed their deadline meanwhile ('node 0 never reported')."""
    done = cluster.run("node1", ["sh", "-c", 'cd "$0" && exec "$@"', str(job_dir), "srun", "-p", "wide", "-N3", "--ntasks-per-node=1",
                                 PYTHON, "-m", "hpctorch", "doctor"], timeout=120, OMP_NUM_THREADS="1")
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    fails = [line.strip() for line in done.stdout.split("verdicts:", 1)[-1].splitlines() if line.strip().startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith(f"FAIL screen: {shaped_link}: fabric "), done.stdout
    assert "ok: every check passed" not in done.stdout
    assert done.stderr.count("report sent; node 0 printed the table (exit 1)") == 2, done.stderr[-3000:]
    assert "never reported" not in done.stdout + done.stderr


def test_spare_nodes_leave_the_shaped_master_out_and_the_rest_train_renumbered(cluster: Cluster, job_dir: Path) -> None:
    """node1 (node 0, the master) has the slow link: it sits out, node2 becomes the master."""
    with shaped(cluster, 1):
        state, output, summary = screened(cluster, job_dir, "--spare-nodes", "1")
    assert state == "COMPLETED", output[-3000:]
    # node2, node 0 from now on, writes the summary: with every node's figures, node1's too.
    assert sorted(summary.get("screen", {}).get("figures", {})) == ["0", "1", "2"], summary
    assert "hpctorch: screen: node1: fabric " in output, output[-3000:]
    assert "hpctorch: node1 sits out as a spare (fabric " in output, output[-3000:]
    assert "hpctorch: running on 2 of 3 nodes (node[2-3]), world size 2, master 198.18.0.2; spare: node1" in output, output[-3000:]
    ranks = toy_ranks(output)
    assert sorted((r["rank"], r["host"], r["node_rank"], r["world"]) for r in ranks) == [("0", "node2", "0", "2"), ("1", "node3", "1", "2")], output[-3000:]
    assert {r["master"].rsplit(":", 1)[0] for r in ranks} == {"198.18.0.2"}
    assert "done world=2" in output


def test_spare_nodes_per_task_renumber_every_rank(cluster: Cluster, job_dir: Path) -> None:
    """srun starts every rank (2 per node): node1's first rank screens for it, its other rank
    waits for node 0's verdict; node1 sits out, and the 4 ranks of node2 and node3 are renumbered."""
    script = job_dir / "job.sh"
    script.write_text(f"#!/bin/sh\nexport HPCTORCH_BAD_NODES={job_dir / 'bad-nodes.jsonl'}\n{ONE_THREAD}"
                      f"srun {HPCTORCH} run --spare-nodes 1 {TOY} --steps 2\n")
    with shaped(cluster, 1):
        state, output = cluster.sbatch(job_dir, script, "-p", "wide", "-N3", "--ntasks-per-node=2")
    assert state == "COMPLETED", output[-3000:]
    assert output.count("hpctorch: node1 sits out as a spare (fabric ") == 1, output[-3000:]
    assert output.count("hpctorch: running on 2 of 3 nodes (node[2-3]), world size 4, master 198.18.0.2; spare: node1") == 1, output[-3000:]
    ranks = toy_ranks(output)
    assert sorted((int(r["rank"]), r["host"], r["world"]) for r in ranks) == [(0, "node2", "4"), (1, "node2", "4"), (2, "node3", "4"), (3, "node3", "4")], output[-3000:]
    assert "done world=4" in output

"""The straggler watch end to end, with real torch processes and gloo: a plain DDP script (no
hpctorch import) whose one rank is slowed by a sleep before its backward pass is named by node 0,
on simulated nodes (each its own agent and watchdog, through the store) and on one node (the
supervisor's thread, no store); a balanced job names nobody; ``--stragglers off`` leaves no trace.
The 3-node cluster test slows a node with a CPU quota instead (tests/cluster)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from ..conftest import clean_env, hpctorch, unprefixed

pytestmark = pytest.mark.serial  # judges CPU shares: never beside another test (scripts/run-tests)

pytest.importorskip("torch")

TRAIN = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)]),
                                                      bucket_cap_mb=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    slow, pause = int(os.environ.get("SLOW_RANK", "-1")), float(os.environ.get("PAUSE", "0.005"))
    for _ in range(int(os.environ.get("STEPS", "250"))):
        loss = model(torch.randn(16, 128)).pow(2).mean()
        time.sleep(0.04 if dist.get_rank() == slow else pause)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # not torch's exit-time teardown, which can abort a plain DDP script (examples/toy_ddp.py)
""")


def run(tmp_path, *args: str, **env: str):  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    summary = tmp_path / "summary.json"
    done = hpctorch("run", "--summary-json", str(summary), *args, str(script), timeout=300,
                    env=clean_env(OMP_NUM_THREADS="1", HPCTORCH_STRAGGLER_WINDOW_S="6", HPCTORCH_BAD_NODES=str(tmp_path / "bad"), **env))
    assert done.returncode == 0, done.stderr[-3000:]
    return done, (json.loads(summary.read_text()) if summary.exists() else {})


def straggler_lines(done) -> list[str]:  # type: ignore[no-untyped-def]
    return [line for line in unprefixed(done.stderr).splitlines() if line.startswith("hpctorch: straggler:")]


def test_the_slow_rank_of_simulated_nodes_is_named_through_the_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done, summary = run(tmp_path, "--simulate-nodes", "3", "--nproc-per-node", "1", SLOW_RANK="1")
    lines = straggler_lines(done)
    assert lines and all(line.startswith("hpctorch: straggler: rank 1 (") for line in lines), done.stderr[-3000:]
    assert "others wait" in lines[0]
    ranks = {row["rank"]: row for row in summary["ranks"]}
    assert set(ranks) == {0, 1, 2}
    assert ranks[1]["inside_share"] + 0.2 < min(ranks[0]["inside_share"], ranks[2]["inside_share"]), ranks
    assert "time inside collectives, per rank" in done.stderr
    # The verdict again at the end, with its evidence and rule, in words and in the JSON.
    assert "hpctorch: stragglers named during the run (others waiting 20% or more of their time, over 6 s windows):" in done.stderr
    verdicts = summary["stragglers_named"]
    assert [v["ranks"] for v in verdicts] == [[1]] and verdicts[0]["threshold"] == 0.2 and verdicts[0]["window_s"] == 6, verdicts
    assert verdicts[0]["others_wait"] >= 0.2 and verdicts[0]["judgements"] >= 1
    assert not (tmp_path / "bad").exists()  # simulated nodes are this machine: never on the bad-node list


def test_the_slow_rank_of_one_node_is_named_by_its_supervisor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done, summary = run(tmp_path, "--nproc-per-node", "3", SLOW_RANK="2")
    assert [line.split(" (")[0] for line in straggler_lines(done)] == ["hpctorch: straggler: rank 2"], done.stderr[-3000:]
    assert len(summary["ranks"]) == 3
    assert [v["ranks"] for v in summary["stragglers_named"]] == [[2]], summary["stragglers_named"]


def test_a_balanced_job_names_nobody_and_off_leaves_no_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 4 ranks on 2 cores (the suite also runs under other load): a CPU shared this way can hold
    # a rank back a few milliseconds a step, which a 5 ms step would show as straggling (true, and
    # not the job's fault); steps of 30 ms of other work keep that well under the threshold.
    done, summary = run(tmp_path, "--simulate-nodes", "2", "--nproc-per-node", "2", STEPS="200", PAUSE="0.03")
    assert straggler_lines(done) == [] and summary["stragglers_named"] == [], done.stderr[-3000:]
    assert len(summary["ranks"]) == 4 and all(row["collectives"] > 0 for row in summary["ranks"])
    # Named by its run id (host.folders.stragglers_dir): other jobs on this machine may make theirs meanwhile.
    folder, run_id = f"/dev/shm/hpctorch-{os.getuid()}/stragglers", f"stragglers-off-{os.getpid()}"
    done, summary = run(tmp_path, "--stragglers", "off", "--run-id", run_id, "--nproc-per-node", "2", SLOW_RANK="1", STEPS="100")
    assert straggler_lines(done) == [] and "time inside collectives" not in done.stderr
    assert summary["ranks"] == []
    assert not [name for name in (os.listdir(folder) if os.path.isdir(folder) else []) if name.startswith(run_id)]  # none made, none left

"""The straggler watch's parts: a rank's meter, a node's window over its ranks' files, node 0's
judgement and the closing table, and the DDP reducer's timing (real gloo, real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.guard import straggler_worker, stragglers
from hpctorch.guard.stragglers import NodeWindow, Settings, judge
from hpctorch.guard.summary import named, per_rank, table
from hpctorch.plan.types import Plan

from ..conftest import ROOT, clean_env


def plan(nodes: int, per_node: int = 1) -> Plan:
    names = tuple(f"cx{n}" for n in range(nodes))
    return Plan(mode="per-node", scheduler="slurm", job_id="7", nodes=names, node_rank=0, nproc_per_node=(per_node,) * nodes,
                master_addr="198.18.0.1", master_port=29500, rdzv_backend="static", rdzv_timeout=60, run_id="r", iface=None,
                simulated=False, max_restarts=0, workers=(), common_env={})


def test_merged_length_counts_overlapping_intervals_once_and_clips_at_the_cut() -> None:
    assert straggler_worker.merged_length([(1, 3), (2, 4), (6, 7)], 0) == 4
    assert straggler_worker.merged_length([(1, 3), (2, 4)], 2.5) == 1.5
    assert straggler_worker.merged_length([(5, 6), (1, 2)], 0) == 2  # any order (futures finish out of order)
    assert straggler_worker.merged_length([], 0) == 0


def test_meter_adds_host_intervals_and_device_durations() -> None:
    meter = straggler_worker.Meter()
    cut = meter._cut
    meter.interval(cut + 0.1, cut + 0.3)
    meter.interval(cut + 0.2, cut + 0.4)
    meter.duration(0.5)
    meter.duration(0.2, count=4)  # entries the recorder dropped
    totals = meter.totals(cut + 1)
    assert totals["count"] == 7
    assert totals["inside_s"] == pytest.approx(1.0)
    assert meter.totals(cut + 2)["inside_s"] == pytest.approx(1.0)  # running totals


def test_a_collective_under_way_counts_up_to_now_and_once_when_it_ends() -> None:
    # A rank that sat inside one all_reduce for the whole run showed "0% of 35 s, 0 collectives".
    meter = straggler_worker.Meter()
    cut = meter._cut
    token = meter.begin(cut + 1)
    first = meter.totals(cut + 10)
    assert first["count"] == 1 and first["inside_s"] == pytest.approx(9.0)
    assert meter.totals(cut + 30)["inside_s"] == pytest.approx(29.0)
    meter.interval(cut + 1, cut + 31, token)
    last = meter.totals(cut + 40)
    assert last["count"] == 1 and last["inside_s"] == pytest.approx(30.0)  # never counted twice


def shares(*values: tuple[float, int], per_node: int = 1) -> dict[int, dict[int, list[float]]]:
    out: dict[int, dict[int, list[float]]] = {}
    for rank, (share, count) in enumerate(values):
        out.setdefault(rank // per_node, {})[rank] = [share, count]
    return out


def test_the_rank_the_others_wait_for_is_named_with_its_figures() -> None:
    found = judge(shares((0.45, 100), (0.41, 100), (0.03, 100), (0.44, 100)), plan(4), 0.2)
    assert [f.line() for f in found] == ["hpctorch: straggler: rank 2 (cx2) computes 1.7x the median step (others wait 41% of each step for it)"]


def test_a_balanced_job_names_nobody() -> None:
    assert judge(shares((0.45, 100), (0.41, 100), (0.38, 100), (0.44, 100)), plan(4), 0.2) == []
    assert judge(shares((0.05, 100), (0.02, 100), (0.04, 100)), plan(3), 0.2) == []  # nobody waits


def test_of_two_ranks_the_one_waited_for_is_named() -> None:
    found = judge(shares((0.91, 300), (0.07, 300)), plan(2), 0.2)
    assert [f.ranks for f in found] == [(1,)]


def test_a_whole_slow_node_is_named_once() -> None:
    found = judge(shares((0.5, 80), (0.5, 80), (0.02, 80), (0.03, 80), (0.5, 80), (0.5, 80), per_node=2), plan(3, 2), 0.2)
    assert [f.line() for f in found] == ["hpctorch: straggler: node cx1 (ranks 2-3) computes 2.0x the median step (others wait 48% of each step for it)"]


def test_no_verdict_without_a_waiting_majority_or_comparable_work() -> None:
    assert judge(shares((0.6, 100), (0.6, 100), (0.1, 100), (0.1, 100), (0.1, 100)), plan(5), 0.2) == []  # more than half "slow"
    assert judge(shares((0.5, 100), (0.5, 100), (0.0, 2)), plan(3), 0.2) == []  # it ran 2 collectives: another job, not a straggler
    assert judge(shares((0.5, 100)), plan(1), 0.2) == []


def test_the_threshold_moves_the_line() -> None:
    values = shares((0.45, 100), (0.30, 100), (0.44, 100))
    assert judge(values, plan(3), 0.2) == []
    assert [f.ranks for f in judge(values, plan(3), 0.1)] == [(1,)]


def test_median_without_one_value() -> None:
    from hpctorch.guard.straggler_judge import _median_without

    assert _median_without([1, 2, 3, 4], 1) == 3
    assert _median_without([1, 2, 3, 4], 4) == 2
    assert _median_without([1, 2, 3], 2) == 2
    assert _median_without([0.1, 0.9], 0.1) == 0.9


def write(folder, local: int, t: float, inside: float, count: int, rank: int | None = None) -> None:  # type: ignore[no-untyped-def]
    (folder / f"{local}.json").write_text(json.dumps({"t": t, "inside_s": inside, "count": count, "rank": local if rank is None else rank}))


def test_a_nodes_window_turns_running_totals_into_shares(tmp_path) -> None:  # type: ignore[no-untyped-def]
    window = NodeWindow(str(tmp_path), 30)
    for t in range(0, 61, 5):
        write(tmp_path, 0, t, t * 0.5, t * 2, rank=8)
        write(tmp_path, 1, t, t * 0.1, t * 2, rank=9)
        window.read()
    assert window.shares() == {8: [0.5, 60], 9: [0.1, 60]}  # the last 30 s, by global rank
    assert window.totals() == {8: [30.0, 60.0, 120], 9: [6.0, 60.0, 120]}
    (tmp_path / "junk.json").write_text("{")
    (tmp_path / "2.json").write_text("not json")
    window.read()  # a torn or foreign file is skipped
    assert set(window.shares()) == {8, 9}


def test_a_restarted_worker_starts_its_window_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    window = NodeWindow(str(tmp_path), 10)
    for t in (0, 5, 10):
        write(tmp_path, 0, t, t * 0.5, t * 10)
        window.read()
    write(tmp_path, 0, 12, 0.1, 3)  # a new process: its counters start from zero
    window.read()
    assert window.shares() == {}  # too short a window yet, and never a negative share
    assert window.totals() == {0: [0.0, 0.0, 0]}


def test_the_closing_table_lists_every_rank_or_the_lowest_of_many() -> None:
    rows = per_rank({0: {0: [8.0, 10.0, 50]}, 1: {1: [0.5, 10.0, 50]}}, plan(2))
    assert rows[1] == {"rank": 1, "node": "cx1", "inside_share": 0.05, "inside_s": 0.5, "measured_s": 10.0, "collectives": 50}
    lines = table(rows)
    assert lines[0].startswith("hpctorch: time inside collectives, per rank (median 43%")
    assert "rank     1  cx1" in lines[2] and "5% of 10 s, 50 collectives" in lines[2]
    many = per_rank({0: {r: [5.0, 10.0, 9] for r in range(40)}}, plan(1, 40))
    assert len(table(many)) == 1 + stragglers.SHOWN_RANKS // 2
    assert table(rows[:1]) == []


def test_settings_from_the_environment_and_their_errors() -> None:
    assert Settings.from_env({}) == Settings(0.2, 30.0)
    assert Settings.from_env({"HPCTORCH_STRAGGLERS": "off"}) is None
    assert Settings.from_env({"HPCTORCH_STRAGGLER_WINDOW_S": "6"}).publish_s == 2.0  # type: ignore[union-attr]
    for env, said in (({"HPCTORCH_STRAGGLERS": "loud"}, "neither off nor warn"), ({"HPCTORCH_STRAGGLER_THRESHOLD": "2"}, "not a fraction"),
                      ({"HPCTORCH_STRAGGLER_THRESHOLD": "x"}, "not a number"), ({"HPCTORCH_STRAGGLER_WINDOW_S": "0.1"}, "shorter than a second")):
        with pytest.raises(HpctorchError, match=said):
            Settings.from_env(env)


def test_the_watch_repeats_a_line_at_most_every_five_minutes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    said: list[str] = []
    watch = stragglers.Watch(plan(1, 3), Settings(0.2, 10), str(tmp_path), say=said.append)
    for t in range(0, 21, 5):
        for local, share in enumerate((0.5, 0.5, 0.05)):
            write(tmp_path, local, t, t * share, t * 10)
        watch.step(None, float(t))
    assert said == ["hpctorch: straggler: rank 2 (cx0) computes 1.9x the median step (others wait 45% of each step for it)"]
    watch.step(None, 400.0)
    assert len(said) == 2


def test_a_rank_slow_in_one_judgement_only_is_not_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A rank still warming up (its first steps, a late start on a loaded machine: seen in CI)
    makes the others wait for one window: no straggler, and a half window, where a warm-up counts
    double, is not judged. Slow in two judgements on end, it is, and its verdict counts both."""
    said: list[str] = []
    watch = stragglers.Watch(plan(1, 3), Settings(0.2, 10), str(tmp_path), say=said.append)
    inside = [0.0, 0.0, 0.0]
    for t in range(0, 41, 5):
        slow = t in (5, 25, 30)  # a spike in one judgement, then two on end
        for local in range(3):
            inside[local] += 5 * (0.02 if slow and local == 2 else 0.5) if t else 0
            write(tmp_path, local, t, inside[local], t * 10)
        named = watch.step(None, float(t))
        assert bool(named) == (t in (30, 35)), (t, named)  # the window (20, 30] holds both, (25, 35] one
        if t == 15:
            assert said == [] and watch.verdicts == {}  # (0, 10] held the spike; a half window was never judged
    assert len(said) == 1 and said[0].startswith("hpctorch: straggler: rank 2 (cx0) computes")
    assert (watch.verdicts["rank 2"]["first_s"], watch.verdicts["rank 2"]["judgements"]) == (25.0, 3)


DDP_SCRIPT = textwrap.dedent("""
    import os, sys
    from hpctorch.guard import straggler_worker as w
    w.install()  # as the worker entry does, before the script imports torch
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", rank=int(os.environ["R"]), world_size=2, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=0.01)
    calls = []
    if os.environ.get("USER_HOOK"):  # registered after DDP's construction, as users do
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        def counted(state, bucket):
            calls.append(1)
            return default_hooks.allreduce_hook(state, bucket)
        model.register_comm_hook(dist.group.WORLD, counted)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        torch.manual_seed(step * 10 + dist.get_rank())
        model(torch.randn(8, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    totals = w.METER.totals(__import__("time").monotonic())
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("RESULT", totals["count"], len(calls), weights.sum().item(), flush=True)
    dist.destroy_process_group()
    os._exit(0)  # not torch's exit-time teardown, which can abort a plain DDP script too ("terminate called...")
""")


def ddp_run(tmp_path, port: int, timed: bool, user_hook: bool = False) -> list[tuple[int, int, float]]:  # type: ignore[no-untyped-def]
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT if timed else DDP_SCRIPT.replace("w.install()", "pass"))
    env = clean_env(PYTHONPATH=str(ROOT / "src"), PORT=str(port), OMP_NUM_THREADS="1", **({"USER_HOOK": "1"} if user_hook else {}))
    processes = [subprocess.Popen([sys.executable, str(script)], env={**env, "R": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for r in range(2)]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        line = next(line for line in out.splitlines() if line.startswith("RESULT"))
        count, calls, weight = line.split()[1:]
        results.append((int(count), int(calls), float(weight)))
    return results


def test_ddps_reducer_is_timed_and_trains_exactly_as_without(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    timed = ddp_run(tmp_path, ports[0], timed=True)
    bare = ddp_run(tmp_path, ports[1], timed=False)
    assert all(count >= 5 * 2 for count, _c, _w in timed), timed  # several buckets a step, each timed
    assert [w for *_, w in timed] == [w for *_, w in bare]  # the same weights, bit for bit
    assert all(count == 0 for count, _c, _w in bare)


def test_a_users_comm_hook_registered_after_ddp_is_the_one_that_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = ddp_run(tmp_path, port, timed=True, user_hook=True)
    assert all(calls >= 5 and count >= calls for count, calls, _w in results), results
    assert os.environ.get("HPCTORCH_STRAGGLERS_DIR") is None  # nothing leaked into this process


FSDP_SCRIPT = textwrap.dedent("""
    import os, time
    from hpctorch.guard import straggler_worker as w
    w.install()
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", rank=int(os.environ["R"]), world_size=2, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    time.sleep(0.2)
    print("RESULT", w.METER.totals(time.monotonic())["count"], flush=True)
    dist.destroy_process_group()
    os._exit(0)  # not torch's exit-time teardown (see DDP_SCRIPT)
""")


def test_fsdp2s_collectives_are_timed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """FSDP2 calls torch 2.13's all_gather_single and reduce_scatter_single: every collective of
    torch.distributed is wrapped by its name, not from a list of the names some torch had."""
    import socket

    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP_SCRIPT)
    env = clean_env(PYTHONPATH=str(ROOT / "src"), PORT=str(port), OMP_NUM_THREADS="1")
    processes = [subprocess.Popen([sys.executable, str(script)], env={**env, "R": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for r in range(2)]
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        count = int(next(line for line in out.splitlines() if line.startswith("RESULT")).split()[1])
        assert count >= 3 * 2, out  # an all-gather per layer forward, a reduce-scatter per layer backward


def _listing_watch(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Node 0's watch of one 3-rank node, its lines kept, its bad-node list the test's own."""
    monkeypatch.setenv("HPCTORCH_BAD_NODES", str(tmp_path / "bad.jsonl"))
    folder = tmp_path / "ranks"
    folder.mkdir()
    said: list[str] = []
    return folder, said, stragglers.Watch(plan(3), Settings(0.2, 10), str(folder), say=said.append)


def test_a_rank_slow_for_two_windows_without_evidence_about_its_node_is_named_never_listed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A rank that computes more for its role (a pipeline's last stage, the issue's case) looks like
    a slow node in time shares alone: named, and said why it is not listed; the list is left alone."""
    from hpctorch.host import badnodes

    folder, said, watch = _listing_watch(tmp_path, monkeypatch)
    inside = [0.0, 0.0, 0.0]
    for t in range(0, 61, 5):
        for local in range(3):
            inside[local] += 5 * (0.05 if local == 2 else 0.5)
            write(folder, local, t, inside[local], t * 10)
        watch.step(None, float(t))
    assert any(line.startswith("hpctorch: straggler: rank 2 (cx0) computes") for line in said), said
    assert [line for line in said if "bad-node list" in line] == [
        "hpctorch: cx0 not put on the bad-node list: slow for 2 windows, but nothing about the node says why (its CPU quota did not "
        "hold it back); a rank's larger share of the work looks the same"]
    assert badnodes.current(os.environ) == []


def test_a_node_goes_on_the_bad_node_list_only_after_two_windows_on_end(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rank 0's evaluation makes everyone wait for a while: named, not listed; a node held back
    by its CPU quota for two windows on end is listed, once."""
    from hpctorch.host import badnodes

    folder, said, watch = _listing_watch(tmp_path, monkeypatch)
    inside = [0.0, 0.0, 0.0]
    for t in range(0, 61, 5):
        slow = 5 <= t <= 15 or t >= 30  # a short spell, a break, then for good
        # Its rank's share and its cgroup's cpu.stat (the evidence about the node), as judge finds them.
        found = [stragglers.Straggler((2,), "cx0", 2.0, 0.4, False, 0.8)] if slow else []
        monkeypatch.setattr(stragglers, "judge", lambda *_a, found=found, **_k: found)
        for local in range(3):
            inside[local] += 5 * (0.05 if slow and local == 2 else 0.5)
            write(folder, local, t, inside[local], t * 10)
        watch.step(None, float(t))
        if t == 25:
            assert said and not (tmp_path / "bad.jsonl").exists()  # named in the spell, not listed
    assert [entry.node for entry in badnodes.current(os.environ)] == ["cx0"]
    entry = badnodes.current(os.environ)[0]
    assert entry.reason.startswith("straggler: rank 2 (cx0)")
    # The verdict keeps its evidence and its rule: in words in the reason, in figures beside it.
    assert entry.reason.endswith("(named at 20% or more of the others' time spent waiting, over 10 s; "
                                 "a quota holding a node back in 50% of periods)"), entry.reason
    assert entry.evidence == {"by": "stragglers", "node": "cx0", "ranks": [2], "whole_node": False, "others_wait": 0.4,
                              "threshold": 0.2, "window_s": 10, "compute_ratio": 2.0, "throttled": 0.8, "throttled_at": 0.5}
    # The closing summary's record: each straggler once, when first and last named, how often.
    verdict = watch.verdicts["rank 2"]
    assert (verdict["first_s"], verdict["last_s"], verdict["judgements"]) == (5.0, 60.0, 10)
    assert verdict["line"].startswith("straggler: rank 2 (cx0) computes 2.0x the median step")
    lines = named(list(watch.verdicts.values()))
    assert lines[0] == "hpctorch: stragglers named during the run (others waiting 20% or more of their time, over 10 s windows):"
    assert lines[1].startswith("  rank 2 (cx0) computes 2.0x") and lines[1].endswith("(in 10 judgements from 5.0 s to 60.0 s)")


def test_a_node_held_back_by_its_cpu_quota_is_named_while_the_others_wait() -> None:
    """Frozen inside collectives as much as outside, its share looks like everyone's: its
    cgroup's throttled periods name it."""
    values = shares((0.89, 900), (0.89, 900), (0.86, 880))
    assert judge(values, plan(3), 0.2) == []
    found = judge(values, plan(3), 0.2, {2: 0.93, 0: 0.0})
    assert [f.line() for f in found] == ["hpctorch: straggler: node cx2 (rank 2): its CPU quota held it back in 93% of the scheduler's "
                                         "periods (cgroup cpu.stat), while the others spend 89% of their time inside collectives"]
    assert judge(values, plan(3), 0.2, {2: 0.3}) == []  # a quota that rarely bites
    assert judge(shares((0.05, 900), (0.05, 900), (0.04, 900)), plan(3), 0.2, {2: 0.93}) == []  # nobody waits
    assert judge(values, plan(3), 0.2, {0: 0.9, 1: 0.9, 2: 0.9}) == []  # every node under the same quota
    slow = judge(shares((0.5, 90), (0.5, 90), (0.02, 90)), plan(3), 0.2, {2: 0.8})
    assert len(slow) == 1 and slow[0].line().endswith("; its CPU quota held it back in 80% of the scheduler's periods (cgroup cpu.stat)")


def test_cpu_stat_is_found_for_a_process_and_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from hpctorch.host import cgroups

    path = cgroups.cpu_stat_path(os.getpid())
    if path is None:
        pytest.skip("no cgroup cpu.stat readable here")
    counters = cgroups.periods(path)
    assert counters is not None and counters[0] >= counters[1] >= 0
    fake = tmp_path / "cpu.stat"
    fake.write_text("nr_periods 100\nnr_throttled 40\nthrottled_usec 123\n")
    assert cgroups.periods(str(fake)) == (100, 40)
    fake.write_text("usage_usec 5\n")  # a v2 group without a quota's counters
    assert cgroups.periods(str(fake)) is None


def test_per_task_a_node_is_named_by_the_name_its_record_gave() -> None:
    task = stragglers.plan_of_task(stragglers.per_task_spec(plan(3)))
    assert (task.nnodes, task.node_rank, task.run_id, task.nodes) == (3, 0, "r", ())
    found = judge(shares((0.45, 100), (0.41, 100), (0.03, 100)), task, 0.2, hosts={2: "nid00042"})
    assert [f.node for f in found] == ["nid00042"]
    assert judge(shares((0.45, 100), (0.41, 100), (0.03, 100)), task, 0.2)[0].node == "node 2"  # no name: never listed


def test_a_throttled_node_whose_ranks_have_no_window_yet_waits_for_one() -> None:
    """Its record came before a window of its ranks' figures: nothing to name yet, and no error
    (an IndexError here stopped node 0's watch, seen per task on the cluster)."""
    values = {0: {0: [0.9, 200]}, 1: {1: [0.9, 200]}, 2: {}}
    assert judge(values, plan(3), 0.2, {2: 1.0}) == []


def test_a_node_named_now_for_its_share_now_for_its_quota_is_listed_as_one(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Its lines change (a rank's share, its quota) while it straggles without a break: listed
    after two windows all the same."""
    monkeypatch.setenv("HPCTORCH_BAD_NODES", str(tmp_path / "bad.jsonl"))
    watch = stragglers.Watch(plan(3), Settings(0.2, 10), str(tmp_path), say=lambda _line: None)
    by_share = stragglers.Straggler((2,), "cx2", 2.0, 0.4, False)
    by_quota = stragglers.Straggler((2,), "cx2", 0.0, 0.8, True, 1.0)
    for t, found in ((0, by_share), (10, by_quota), (20, by_share)):
        monkeypatch.setattr(stragglers, "judge", lambda *_a, found=found, **_k: [found])
        watch.step(None, float(t))
    from hpctorch.host import badnodes

    assert [entry.node for entry in badnodes.current(os.environ)] == ["cx2"]

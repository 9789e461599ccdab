"""The screen: node 0's judgement (pure), the ring link's measure bounded in time (real sockets),
InfiniBand read from sysfs as the kernel lays it out, and the whole exchange on a real TCPStore
between nodes run as threads."""

from __future__ import annotations

import datetime
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hpctorch.screen import exchange as screen
from hpctorch.screen import judge, measure, ringlink
from hpctorch.host.network import free_port
from hpctorch.plan.types import Plan


def record(node: int, compute: float = 100.0, memory: float = 10.0, to_mbs: float | None = 1000.0, rtt: float = 30.0,
           nnodes: int = 4, **extra: Any) -> dict[str, Any]:
    fabric = {"to": (node + 1) % nnodes, "mbs": to_mbs, "rtt_us": rtt} if to_mbs is not None else {"to": (node + 1) % nnodes, "error": "refused"}
    return {"node": node, "host": f"cx{node}", "figures": {"compute_gflops": compute, "memory_gbs": memory, **extra},
            "fabric": fabric, "problems": [], "unmeasured": []}


def lines(records: dict[int, dict], nnodes: int = 4, threshold: float = 0.5) -> list[str]:
    return [f.line() for f in judge.judge(records, nnodes, threshold)]


def test_a_balanced_job_names_nobody() -> None:
    records = {n: record(n, compute=100 + 5 * n, memory=10 - n * 0.3) for n in range(4)}
    assert lines(records) == []


def test_a_slow_cpu_is_named_with_its_figure_and_the_median() -> None:
    records = {n: record(n) for n in range(4)}
    records[2] = record(2, compute=30.0)
    assert lines(records) == ["cx2: compute 30 GFLOP/s (median 100 GFLOP/s)"]
    assert lines(records, threshold=0.2) == []  # --screen-threshold


def test_a_slow_link_names_the_node_whose_both_ring_links_are_slow() -> None:
    # node 2's link is shaped: its link to node 3 and node 1's link to it are both slow.
    records = {n: record(n) for n in range(4)}
    records[1] = record(1, to_mbs=2.4)
    records[2] = record(2, to_mbs=2.3)
    assert lines(records) == ["cx2: fabric 2.3 MB/s to cx3, 2.4 MB/s from cx1 (median 1 GB/s)"]


def test_two_nodes_share_their_links_so_a_slow_link_names_nobody() -> None:
    records = {0: record(0, to_mbs=2.0, nnodes=2), 1: record(1, to_mbs=2.0, nnodes=2)}
    assert lines(records, nnodes=2) == []


def test_latency_needs_more_than_jitter() -> None:
    records = {n: record(n, rtt=30.0) for n in range(4)}
    records[1] = record(1, rtt=200.0)  # 6x the median, but 0.17 ms: no step is slower for it
    records[0] = record(0, rtt=190.0)
    assert lines(records) == []
    records[1] = record(1, rtt=4000.0)
    records[0] = record(0, rtt=3900.0)
    assert lines(records) == ["cx1: fabric latency 4 ms round trip to cx2, 3.9 ms round trip from cx0 (median 30 us round trip)"]


def test_a_missing_node_is_named_and_its_predecessor_is_not_blamed() -> None:
    records = {n: record(n) for n in (0, 1, 3)}
    records[1] = record(1, to_mbs=None)  # its successor, node 2, never listened
    found = judge.judge(records, 4, 0.5, ("nid0", "nid1", "nid2", "nid3"))
    assert [f.line() for f in found] == ["nid2: screen sent no record within the screen's time"]


def test_problems_are_named_on_their_own_and_infiniband_against_the_median_node() -> None:
    records = {n: record(n, ib_active=2) for n in range(4)}
    records[3] = record(3, ib_active=1)
    records[0]["problems"] = ["only 0.20 GB free in /tmp"]
    assert lines(records) == ["cx0: health only 0.20 GB free in /tmp", "cx3: InfiniBand 1 port(s) active (median node 2)"]


def test_processes_of_one_machine_are_not_compared() -> None:
    # doctor --simulate-nodes: every record from one host; their speeds say nothing of nodes.
    records = {n: {**record(n), "host": "laptop"} for n in range(3)}
    records[1] = {**record(1, compute=1.0), "host": "laptop"}
    assert lines(records, nnodes=3) == []


def test_what_was_not_measured_is_said_once_for_all_nodes() -> None:
    records = {n: {**record(n), "unmeasured": ["GPUs (none visible)"]} for n in range(3)}
    records[2]["unmeasured"].append("NVML (pip install nvidia-ml-py)")
    assert judge.unmeasured(records) == ["GPUs (none visible) on 3 nodes", "NVML (pip install nvidia-ml-py) on 1 node"]


def test_rates_are_said_in_the_unit_that_fits() -> None:
    assert judge.rate(2.4) == "2.4 MB/s" and judge.rate(1100.0) == "1.1 GB/s" and judge.rate(0.05) == "50 kB/s"
    assert judge.rate(68.4, "FLOP/s", "G") == "68.4 GFLOP/s"


def test_infiniband_ports_are_read_from_sysfs(tmp_path: Path) -> None:
    # The kernel's layout: /sys/class/infiniband/<device>/ports/<n>/{state,rate}.
    for device, port, state, rate in (("mlx5_0", "1", "4: ACTIVE", "200 Gb/sec (4X HDR)"), ("mlx5_1", "1", "1: DOWN", "10 Gb/sec (4X SDR)")):
        folder = tmp_path / device / "ports" / port
        folder.mkdir(parents=True)
        (folder / "state").write_text(state + "\n")
        (folder / "rate").write_text(rate + "\n")
    assert measure.infiniband(str(tmp_path)) == {"mlx5_0/1": {"state": "ACTIVE", "gbps": 200.0}, "mlx5_1/1": {"state": "DOWN", "gbps": 10.0}}
    assert measure.infiniband(str(tmp_path / "none")) == {}


def test_this_node_measures_compute_memory_and_space() -> None:
    found = measure.this_node(use_gpus=False)
    assert found["figures"]["compute_gflops"] > 0 and found["figures"]["memory_gbs"] > 0
    assert "/tmp" in found["figures"]["free_gb"]
    assert found["unmeasured"] == ["GPUs (none visible)"]
    assert found["kinds"]["cpu"].startswith(measure.cpu_model()) and " thread" in found["kinds"]["cpu"]
    assert found["kinds"]["memory"].endswith(" GiB") and "gpu" not in found["kinds"]


def test_the_cpu_model_and_memory_size_are_read_as_the_kernel_writes_them(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n\n"
                   "processor\t: 1\nmodel name\t: AMD EPYC 7763 64-Core Processor\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n")
    assert measure.cpu_model(str(x86)) == "AMD EPYC 7763 64-Core Processor"
    assert measure.cpu_model(str(arm)) == "CPU implementer 0x41 part 0xd4f"
    sizes = {}
    for name, kib in (("a", 263_812_000), ("b", 263_700_000), ("c", 395_000_000), ("d", 24_683_784), ("e", 527_000_000)):
        (tmp_path / name).write_text(f"MemTotal:       {kib} kB\nMemFree:        1000 kB\n")
        sizes[name] = measure.memory_size_gib(str(tmp_path / name))
    # Two nodes of one kind agree, whatever the kernel keeps back; 256, 384, 512 GiB apart.
    assert sizes == {"a": 256, "b": 256, "c": 384, "d": 24, "e": 512}
    assert measure.memory_size_gib(str(tmp_path / "none")) is None


def kinded(node: int, cpu: str, compute: float, memory: float = 10.0, **extra: Any) -> dict[str, Any]:
    return {**record(node, compute=compute, memory=memory, **extra), "kinds": {"cpu": f"{cpu}, 64 threads", "memory": f"{cpu}, 256 GiB"}}


def test_a_mixed_allocation_compares_like_with_like() -> None:
    # Three Genoa nodes at ~200, two Milan at ~90: the minority is another machine, not a slow one.
    records = {0: kinded(0, "Genoa", 200.0, 20.0), 1: kinded(1, "Genoa", 205.0, 21.0), 2: kinded(2, "Genoa", 198.0, 20.0),
               3: kinded(3, "Milan", 90.0), 4: kinded(4, "Milan", 92.0)}
    assert lines(records, 5) == []
    assert judge.medians(records).startswith("compute 200 GFLOP/s (Genoa, 64 threads), compute 91 GFLOP/s (Milan, 64 threads), ")
    # Compared with everyone, as before, both Milans were named slow.
    plain = {n: {k: v for k, v in r.items() if k != "kinds"} for n, r in records.items()}
    assert [f.line() for f in judge.judge(plain, 5)] == ["cx3: compute 90 GFLOP/s (median 198 GFLOP/s)", "cx4: compute 92 GFLOP/s (median 198 GFLOP/s)"]
    # A slow Milan is named against the Milans' median, and the line says which median.
    records[5] = kinded(5, "Milan", 30.0)
    assert lines(records, 6) == ["cx5: compute 30 GFLOP/s (median 90 GFLOP/s of the 3 nodes with Milan, 64 threads)"]
    assert judge.ranking(records, judge.judge(records, 6), 6)[0] == 5


def test_a_node_alone_of_its_kind_is_said_not_compared() -> None:
    records = {n: kinded(n, "Milan", 100.0) for n in range(3)}
    records[3] = kinded(3, "Genoa", 30.0)
    assert lines(records) == []
    assert judge.unmeasured(records) == ["cx3's compute (Genoa, 64 threads), memory (Genoa, 256 GiB): no other node of its kind to compare with"]


def test_gpus_are_compared_within_their_model() -> None:
    def gpu_node(node: int, name: str, tflops: float) -> dict[str, Any]:
        return {**record(node, gpus=[{"index": 0, "name": name, "tflops": tflops, "h2d_gbs": 25.0, "d2h_gbs": 25.0}]),
                "kinds": {"cpu": "x", "memory": "x", "gpu": name}}

    records = {0: gpu_node(0, "NVIDIA H100 80GB HBM3", 700.0), 1: gpu_node(1, "NVIDIA H100 80GB HBM3", 690.0),
               2: gpu_node(2, "NVIDIA A100-SXM4-80GB", 280.0), 3: gpu_node(3, "NVIDIA A100-SXM4-80GB", 275.0),
               4: gpu_node(4, "NVIDIA A100-SXM4-80GB", 100.0)}
    assert lines(records, 5) == ["cx4: GPU compute 100 TFLOP/s (median 275 TFLOP/s of the 3 nodes with NVIDIA A100-SXM4-80GB)"]


def test_the_ring_link_is_measured_on_real_sockets() -> None:
    until = time.monotonic() + 10
    listener = ringlink.RingListener("127.0.0.1")
    listener.serve(until)
    try:
        found = ringlink.probe(listener.address, until)
        listener.wait()
    finally:
        listener.close()
    assert found["mbs"] > 0 and 0 < found["rtt_us"] < 1e6, found


def test_a_peer_that_never_answers_costs_the_deadline_not_more() -> None:
    """A link that takes bytes and never answers (the slowest link there is) ends the measure at
    the screen's deadline: bounded in time, not bytes."""
    with socket.socket() as silent:  # listens, never accepts: the kernel takes the bytes, nobody replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.monotonic()
        found = ringlink.probe(f"127.0.0.1:{silent.getsockname()[1]}", started + 2.0)
        took = time.monotonic() - started
    assert found["error"].startswith("no answer within the screen's time"), found
    assert took < 2.0 + 5.0, took  # hang guard far above the deadline


def _plan(node: int, nnodes: int, port: int) -> Plan:
    return Plan(mode="per-node", scheduler="test", job_id="7", nodes=tuple(f"nid{n}" for n in range(nnodes)), node_rank=node,
                nproc_per_node=(1,) * nnodes, master_addr="127.0.0.1", master_port=port, rdzv_backend="static", rdzv_timeout=30,
                run_id="screen-test", iface="lo", simulated=False, max_restarts=0, workers=(), common_env={}, local_addr="127.0.0.1")


def _store(port: int, master: bool):  # type: ignore[no-untyped-def]
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, None, master, datetime.timedelta(seconds=30), wait_for_workers=False, multi_tenant=True)


def _screen_threads(nnodes: int, figures: dict[int, float], present: range | None = None, budget_s: float = 6.0,
                    spares: int = 0) -> dict[int, screen.Screened]:
    """``nnodes`` nodes as threads on one real store, each measuring its real ring link on
    loopback; ``figures``: each node's compute figure (the local measure stands in: threads of
    one process share its CPUs). Nodes outside ``present`` never start."""
    port = free_port()
    server = _store(port, True)
    outcomes: dict[int, screen.Screened] = {}

    def node(rank: int) -> None:
        store = server if rank == 0 else _store(port, False)
        local = lambda _gpus: {"figures": {"compute_gflops": figures[rank]}, "problems": [], "unmeasured": []}  # noqa: E731
        plan = _plan(rank, nnodes, port)
        outcomes[rank] = screen.run(plan, store, 0.5, False, "hpctorch/t/screen/", 3.0, budget_s, local=local, spares=spares)

    threads = [threading.Thread(target=node, args=(r,)) for r in (present or range(nnodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)  # hang guard
    return outcomes


def test_every_node_learns_node_0_s_verdict_through_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: f"host-{threading.current_thread().name}")  # one host per thread
    outcomes = _screen_threads(3, {0: 100.0, 1: 20.0, 2: 110.0})
    assert sorted(outcomes) == [0, 1, 2]
    assert {tuple(f["line"].split(": ", 1)[1] for f in o.findings) for o in outcomes.values()} == {("compute 20 GFLOP/s (median 100 GFLOP/s)",)}
    assert all(o.bad_nodes == [1] for o in outcomes.values())
    records = outcomes[0].records
    assert sorted(records) == [0, 1, 2] and all(records[n]["fabric"]["to"] == (n + 1) % 3 and records[n]["fabric"]["mbs"] > 0 for n in records)


def test_when_node_0_sits_out_the_new_node_0_alone_gets_every_node_s_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: f"host-{threading.current_thread().name}")
    outcomes = _screen_threads(3, {0: 20.0, 1: 100.0, 2: 110.0}, spares=1)
    assert all(o.spares == [0] for o in outcomes.values())
    assert sorted(outcomes[1].records) == [0, 1, 2] and outcomes[1].records[0]["figures"]["compute_gflops"] == 20.0  # its summary's
    assert outcomes[2].records == {}  # one reader, not N


def test_a_node_that_never_comes_is_named_once_the_budget_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: f"host-{threading.current_thread().name}")
    started = time.monotonic()
    outcomes = _screen_threads(3, {0: 100.0, 1: 100.0, 2: 100.0}, present=range(2), budget_s=4.0)
    assert sorted(outcomes) == [0, 1]
    assert [f["line"] for f in outcomes[0].findings] == ["nid2: screen sent no record within the screen's time"]
    assert outcomes[1].findings == outcomes[0].findings
    assert time.monotonic() - started < 60  # ended by its deadlines (3 s to arrive, 4 s budget), not the hang guard


class _FakeNvml:
    """nvidia-ml-py's ``pynvml`` as its documentation describes it, for two GPUs (none can exist
    here): GPU 0 healthy; GPU 1 with uncorrected ECC errors, thermal slowdown and a x8 link of x16,
    and no retired-page query (NVMLError_NotSupported, as on GPUs without it)."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
    nvmlClocksThrottleReasonHwThermalSlowdown = 0x40

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)
        return 3 if handle else 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        if handle:
            raise self.NVMLError("Not Supported")
        return 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return 0x40 | 0x1 if handle else 0x1  # 0x1: idle, no fault

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return 8 if handle else 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16


def test_nvml_complaints_are_problems_and_a_missing_nvml_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    problems, missing = measure.nvml_problems()
    assert missing is None and fake.shut
    assert problems == ["GPU 1: 3 uncorrected ECC errors", "GPU 1: thermal slowdown", "GPU 1: PCIe link x8 of x16"]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert measure.nvml_problems() == ([], "NVML (pip install nvidia-ml-py)")


def test_a_lost_gpu_is_a_problem_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU 1 fell off the bus: NVML's handle query fails (NVML_ERROR_GPU_IS_LOST), GPU 0 is still judged."""
    import sys

    fake = _FakeNvml()

    def lost(index: int) -> int:
        if index == 1:
            raise fake.NVMLError("GPU is lost")
        return index

    fake.nvmlDeviceGetHandleByIndex = lost  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert measure.nvml_problems() == (["GPU 1: NVML cannot reach it (GPU is lost)"], None) and fake.shut

    def uncountable() -> int:
        raise fake.NVMLError("Unknown Error")

    fake.nvmlDeviceGetCount = uncountable  # type: ignore[method-assign]
    assert measure.nvml_problems() == (["NVML cannot count this node's GPUs (Unknown Error)"], None)


def test_the_worst_nodes_are_chosen_as_spares_bad_first_then_slowest() -> None:
    records = {n: record(n, compute=100.0 - n) for n in range(4)}  # node 3 the slowest, none bad
    assert judge.ranking(records, judge.judge(records, 4), 4)[:1] == [3]
    records[1] = record(1, compute=10.0)  # bad: first, whatever the others' figures
    del records[2]  # missing: as bad as can be
    # Node 2 first: a spare chosen among the nodes that answered would leave the job waiting for it.
    assert judge.ranking(records, judge.judge(records, 4), 4)[:2] == [2, 1]


def test_a_node_that_sent_nothing_sits_out_before_one_with_findings() -> None:
    # The case: node 1 slow in two measures, node 2 silent. Before: order [1, 3, 0, 2].
    records = {n: record(n, compute=100.0 - n) for n in range(4)}
    records[1] = record(1, compute=10.0, memory=1.0)
    del records[2]
    found = judge.judge(records, 4)
    assert sum(f.node == 1 for f in found) == 2
    assert judge.ranking(records, found, 4)[:2] == [2, 1]


def test_a_refused_probe_is_blamed_on_the_node_whose_both_links_fail() -> None:
    # node 2 refuses: node 1's probe into it and its own probe to node 3 both fail.
    records = {n: record(n) for n in range(4)}
    records[1] = record(1, to_mbs=None)
    records[2] = record(2, to_mbs=None)
    found = [f for f in judge.judge(records, 4) if f.measure == "fabric"]
    assert [(f.node, f.detail) for f in found] == [(2, "from cx1 and to cx3: both links fail (refused)")], found
    # One probe alone fails: its prober's end (or the link), as before.
    records[2] = record(2)
    assert [(f.node, f.detail) for f in judge.judge(records, 4) if f.measure == "fabric"] == [(1, "to cx2: refused")]


def test_an_allocation_keeping_some_nodes_renumbers_nodes_and_ranks() -> None:
    from hpctorch.schedulers.allocation import Allocation, Launched, Launcher

    job = Allocation(Launcher("slurm"), (2, 2, 2), Launched.RANKS, nodes=("n1", "n2", "n3"), job_id="9", task_rank=5, node_rank=2,
                     local_task_rank=1, cpus_per_node=(8, 8, 4), master_addr="10.0.0.1")
    kept = job.keeping([1, 2], "10.0.0.2")
    assert (kept.nodes, kept.tasks_per_node, kept.cpus_per_node, kept.node_rank, kept.task_rank, kept.master_addr) == \
        (("n2", "n3"), (2, 2), (8, 4), 1, 3, "10.0.0.2")
    per_node = Allocation(Launcher("slurm"), (1, 1, 1), nodes=("n1", "n2", "n3"), node_rank=1)
    assert per_node.keeping([1, 2], "10.0.0.2").node_rank == 0 and per_node.keeping([1, 2], "x").task_rank is None

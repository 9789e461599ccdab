"""What one node measures of itself for the screen: compute, memory, free space, GPUs, InfiniBand.

Every measure runs for a fixed time, not a fixed amount of work, so a slow node takes as long as
a fast one and reports a smaller figure. Something that cannot be measured here (no GPU, no
NVML, no InfiniBand) is said once in ``unmeasured`` and left out of the judgement.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

COMPUTE_S = 1.0
MEMORY_S = 0.5
GPU_S = 0.3
COPY_S = 0.2
MATRIX_CPU = 512
MATRIX_GPU = 4096
MEMORY_BYTES = 32 << 20
FREE_SPACE_PATHS = ("/tmp", "/dev/shm")
SYSFS_INFINIBAND = "/sys/class/infiniband"
WINDOWS = 5
"""A rate is the best of this many short windows: what another process did to this node for a
moment (a neighbour's burst) is not the node's speed, a throttle lasting the whole measure is."""


def best_rate(step: Callable[[], object], window_s: float, work: float, cpu_time: bool = False) -> float:
    """``work`` done per ``step``, per second, at the best of WINDOWS windows of ``window_s`` in all.
    With ``cpu_time``, per second of this thread's CPU time (the windows still end by the clock):
    the memory's speed, not the share of a CPU this process got meanwhile."""
    step()  # warm-up: thread pools, first touch of the pages
    rates = []
    for _ in range(WINDOWS):
        cpu = time.thread_time()
        count, took = timed(step, window_s / WINDOWS)
        rates.append(work * count / (max(time.thread_time() - cpu, 1e-6) if cpu_time else took))
    return max(rates)


def timed(step: Callable[[], object], window_s: float, finish: Callable[[], object] = lambda: None) -> tuple[int, float]:
    """Run ``step`` until ``window_s`` passed (at least once): (times run, seconds taken)."""
    count = 0
    begin = time.perf_counter()
    while True:
        step()
        count += 1
        if time.perf_counter() - begin >= window_s:
            finish()
            return count, time.perf_counter() - begin


def cpu_gflops(window_s: float = COMPUTE_S) -> float:
    """Matrix multiplies on the CPUs this process may use (torch's threads), in GFLOP/s."""
    import torch

    a = torch.rand(MATRIX_CPU, MATRIX_CPU)
    b = torch.rand(MATRIX_CPU, MATRIX_CPU)
    return best_rate(lambda: torch.mm(a, b), window_s, 2 * MATRIX_CPU**3 / 1e9)


def memory_gbs(window_s: float = MEMORY_S) -> float:
    """Host memory copy bandwidth (bytes copied per second of CPU time, GB/s), one thread."""
    source = bytearray(os.urandom(1 << 20)) * (MEMORY_BYTES >> 20)
    target = bytearray(MEMORY_BYTES)
    view_from, view_to = memoryview(source), memoryview(target)

    def copy() -> None:
        view_to[:] = view_from

    return best_rate(copy, window_s, MEMORY_BYTES / 1e9, cpu_time=True)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model as the kernel names it (x86's ``model name``; ARM's implementer and part)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as source:
            for line in source:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if fields.get("model name"):
        return " ".join(fields["model name"].split())
    if fields.get("CPU part"):
        return f"CPU implementer {fields.get('CPU implementer', '?')} part {fields['CPU part']}"
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


MEMORY_SIZES_GIB = tuple(sorted({size << shift for size in (2, 3) for shift in range(0, 14)}))
"""Installed memory comes in powers of two and their one-and-a-half (192, 384, 768 GiB)."""


def memory_size_gib(meminfo: str = "/proc/meminfo") -> int | None:
    """The installed memory, in GiB: the common size nearest MemTotal (what the kernel leaves
    the system: 1 to 3% under the installed size), so two nodes of one kind agree."""
    try:
        with open(meminfo, encoding="utf-8") as source:
            total_kib = next(int(line.split()[1]) for line in source if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    total = total_kib / (1 << 20)
    return min(MEMORY_SIZES_GIB, key=lambda size: abs(size - total / 0.98) / size)


def kinds(gpu_names: list[str]) -> dict[str, str]:
    """What this node's figures are comparable with: nodes of another CPU model, thread count,
    memory size or GPU model measure other figures and are judged among their own kind."""
    import torch

    model, size = cpu_model(), memory_size_gib()
    threads = torch.get_num_threads()
    said = {"cpu": f"{model}, {threads} thread{'s' if threads != 1 else ''}", "memory": f"{model}, {size} GiB" if size else model}
    if gpu_names:
        said["gpu"] = " + ".join(sorted(set(gpu_names)))
    return said


def free_space() -> dict[str, float]:
    """Free gigabytes in each of FREE_SPACE_PATHS that exists here."""
    found = {}
    for path in FREE_SPACE_PATHS:
        try:
            found[path] = round(shutil.disk_usage(path).free / 1e9, 2)
        except OSError:
            continue
    return found


def infiniband(root: str = SYSFS_INFINIBAND) -> dict[str, dict[str, Any]]:
    """Each InfiniBand port's state and rate, from sysfs (``<dev>/ports/<n>/state`` reads
    ``4: ACTIVE``, ``rate`` reads ``200 Gb/sec (4X HDR)``: the kernel's documented files)."""
    ports: dict[str, dict[str, Any]] = {}
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return ports
    for device in devices:
        base = os.path.join(root, device, "ports")
        try:
            numbers = sorted(os.listdir(base))
        except OSError:
            continue
        for number in numbers:
            state = _read(os.path.join(base, number, "state")).split(":")[-1].strip()
            rate = _read(os.path.join(base, number, "rate")).split()
            ports[f"{device}/{number}"] = {"state": state or "UNKNOWN", "gbps": float(rate[0]) if rate and _number(rate[0]) else None}
    return ports


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(200).strip()
    except OSError:
        return ""


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def gpus() -> list[dict[str, Any]]:
    """Per visible GPU: matrix-multiply TFLOP/s and host<->device GB/s (pinned memory)."""
    import torch

    return [_gpu(torch, index) for index in range(torch.cuda.device_count())]


def _gpu(torch: Any, index: int) -> dict[str, Any]:
    device = torch.device("cuda", index)
    a = torch.rand(MATRIX_GPU, MATRIX_GPU, device=device, dtype=torch.bfloat16)
    b = torch.rand(MATRIX_GPU, MATRIX_GPU, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize(device)
    count, took = timed(lambda: torch.mm(a, b), GPU_S, lambda: torch.cuda.synchronize(device))
    host = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty_like(host, device=device)
    up, up_s = timed(lambda: on_device.copy_(host, non_blocking=True), COPY_S, lambda: torch.cuda.synchronize(device))
    down, down_s = timed(lambda: host.copy_(on_device, non_blocking=True), COPY_S, lambda: torch.cuda.synchronize(device))
    return {"index": index, "name": torch.cuda.get_device_name(device), "tflops": round(2 * MATRIX_GPU**3 * count / took / 1e12, 2),
            "h2d_gbs": round(host.numel() * up / up_s / 1e9, 2), "d2h_gbs": round(host.numel() * down / down_s / 1e9, 2)}


def nvml_problems() -> tuple[list[str], str | None]:
    """What NVML says is wrong with each GPU (uncorrected ECC errors, pages pending retirement,
    hardware or thermal slowdown, a PCIe link narrower than it can be); or why NVML could not be
    asked (the second value)."""
    try:
        import pynvml  # nvidia-ml-py, the optional extra hpctorch[nvml]
    except ImportError:
        return [], "NVML (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML ({exc})"
    problems: list[str] = []
    slowdowns = {
        "hardware slowdown": getattr(pynvml, "nvmlClocksThrottleReasonHwSlowdown", 0x8),
        "thermal slowdown": getattr(pynvml, "nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
        "power brake": getattr(pynvml, "nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
        "software thermal slowdown": getattr(pynvml, "nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
    }
    try:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            return [f"NVML cannot count this node's GPUs ({exc})"], None
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:  # GPU_IS_LOST, "Unknown Error": a GPU that fell off the bus
                problems.append(f"GPU {index}: NVML cannot reach it ({exc})")
                continue
            checks: list[tuple[str, Callable[[], str | None]]] = [
                ("ECC", lambda: _ecc(pynvml, handle)),
                ("retired pages", lambda: "pages pending retirement" if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) else None),
                ("clocks", lambda: ", ".join(n for n, bit in slowdowns.items() if pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) & bit) or None),
                ("PCIe", lambda: _pcie(pynvml, handle)),
            ]
            for _name, check in checks:
                try:
                    said = check()
                except pynvml.NVMLError:
                    continue  # not supported on this GPU: nothing to judge
                if said:
                    problems.append(f"GPU {index}: {said}")
    finally:
        pynvml.nvmlShutdown()
    return problems, None


def _ecc(pynvml: Any, handle: Any) -> str | None:
    count = pynvml.nvmlDeviceGetTotalEccErrors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    return f"{count} uncorrected ECC errors" if count else None


def _pcie(pynvml: Any, handle: Any) -> str | None:
    now, most = pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle), pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
    return f"PCIe link x{now} of x{most}" if now < most else None


def prepare() -> None:
    """What the measures import, loaded before this node says it is here: a node slow to import
    torch (a CPU held to a quota, a cold shared file system) would otherwise spend the budget the
    nodes share after ``go`` on it, and send no record in time."""
    import importlib

    importlib.import_module("torch")


def this_node(use_gpus: bool) -> dict[str, Any]:
    """Every measure of this node: the figures judged against the other nodes', the problems
    judged on their own, and what could not be measured."""
    figures: dict[str, Any] = {}
    unmeasured: list[str] = []
    problems: list[str] = []
    if use_gpus:
        figures["gpus"] = gpus()
        found, missing = nvml_problems()
        problems += found
        unmeasured += [missing] if missing else []
    else:
        unmeasured.append("GPUs (none visible)")
    figures["compute_gflops"] = round(cpu_gflops(), 2)
    figures["memory_gbs"] = round(memory_gbs(), 2)
    space = free_space()
    figures["free_gb"] = space
    problems += [f"only {free:.2f} GB free in {path}" for path, free in space.items() if free < 1.0]
    ports = infiniband()
    if ports:
        figures["ib_ports"] = ports
        figures["ib_active"] = sum(1 for p in ports.values() if p["state"] == "ACTIVE")
    return {"figures": figures, "problems": problems, "unmeasured": unmeasured,
            "kinds": kinds([str(gpu.get("name", "")) for gpu in figures.get("gpus", [])])}

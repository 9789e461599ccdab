"""GPUs visible to this process and the NUMA node of each, found without importing torch.

Read from what the scheduler narrowed (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS,
ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES) and from the drivers' files. ``root`` is
the filesystem root, so tests give a fake /proc and /sys tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .affinity import read_sysfs


@dataclass(frozen=True)
class Gpus:
    """The devices a CUDA (or HIP) program here would see, in its order."""

    vendor: str | None = None  # "nvidia", "amd", or None when there are none
    ids: tuple[str, ...] = ()
    """As the program would name them: indices, UUIDs or MIG ids."""
    numa: tuple[int | None, ...] = ()
    """The NUMA node of each, None when unknown (UUIDs, MIG, no sysfs entry)."""
    source: str = ""

    def __len__(self) -> int:
        return len(self.ids)


def _visible_list(value: str) -> tuple[str, ...]:
    ids = []
    for item in value.split(","):
        item = item.strip()
        # CUDA stops at the first invalid entry; "-1" and "NoDevFiles" mean none.
        if not item or item.startswith("-") or item == "NoDevFiles":
            break
        ids.append(item)
    return tuple(ids)


def _nvidia_bus_ids(root: str) -> list[str]:
    """PCI addresses of the NVIDIA GPUs, in nvidia-smi's (PCI bus) order."""
    try:
        return sorted(os.listdir(os.path.join(root, "proc", "driver", "nvidia", "gpus")))
    except OSError:
        return []


def _numa_of_pci(root: str, bus_id: str) -> int | None:
    value = read_sysfs(os.path.join(root, "sys", "bus", "pci", "devices", bus_id.lower(), "numa_node"))
    try:
        node = int(value) if value is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _amd_gpu_count(root: str) -> int:
    nodes = os.path.join(root, "sys", "class", "kfd", "kfd", "topology", "nodes")
    try:
        entries = os.listdir(nodes)
    except OSError:
        return 0
    return sum(1 for entry in entries if (read_sysfs(os.path.join(nodes, entry, "gpu_id")) or "0") != "0")


def gpus(env: Mapping[str, str], root: str = "/") -> Gpus:
    """What this process can use. Indices map to physical GPUs in PCI order
    (CUDA_DEVICE_ORDER=PCI_BUS_ID, as nvidia-smi and Slurm number them)."""
    bus_ids = _nvidia_bus_ids(root)
    amd = _amd_gpu_count(root)
    # HIP_VISIBLE_DEVICES selects among what ROCR_VISIBLE_DEVICES left: it decides when both are set.
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if var in env and not bus_ids:
            ids = _visible_list(env[var])
            return Gpus("amd", ids, (None,) * len(ids), var)
    slurm_gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    granted = [int(i) if i.strip().isdigit() else None for i in slurm_gpus.split(",") if i.strip()]
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = _visible_list(env["CUDA_VISIBLE_DEVICES"])
        physical = [int(i) if i.isdigit() else None for i in ids]
        source = "CUDA_VISIBLE_DEVICES"
        if granted and physical != granted and all(p is not None and p < len(granted) for p in physical):
            # Slurm's ConstrainDevices: CUDA counts from 0 within the job's GPUs, which
            # SLURM_STEP_GPUS names machine-wide (/proc/driver/nvidia lists them all).
            physical = [granted[p] for p in physical]  # type: ignore[index]
            source = "CUDA_VISIBLE_DEVICES within SLURM_STEP_GPUS"
    elif granted:
        # Slurm's cgroup hides the others: CUDA numbers the granted ones from 0.
        physical = granted
        ids = tuple(str(i) for i in range(len(physical)))
        source = "SLURM_STEP_GPUS" if env.get("SLURM_STEP_GPUS") else "SLURM_JOB_GPUS"
    elif bus_ids:
        ids = tuple(str(i) for i in range(len(bus_ids)))
        physical, source = list(range(len(bus_ids))), "/proc/driver/nvidia/gpus"
    elif amd:
        return Gpus("amd", tuple(str(i) for i in range(amd)), (None,) * amd, "/sys/class/kfd")
    else:
        return Gpus()
    numa = tuple(_numa_of_pci(root, bus_ids[p]) if p is not None and p < len(bus_ids) else None for p in physical)
    return Gpus("nvidia" if ids else None, ids, numa, source)

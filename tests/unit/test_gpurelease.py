"""What NVML's process list says, read through nvidia-smi's documented query (a stand-in here:
no GPU), and the bounded wait on it."""

from __future__ import annotations

import sys
from pathlib import Path

from hpctorch.start import gpurelease


def _tool(tmp_path: Path, output: str, status: int = 0) -> str:
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({output!r})\nsys.exit({status})\n")
    tool.chmod(0o755)
    return str(tool)


def test_each_process_s_memory_is_summed_over_its_devices(tmp_path: Path) -> None:
    # One line per process and device holding a context; "[N/A]" where the driver cannot say.
    smi = _tool(tmp_path, "4242, 1024\n4242, 2048\n77, [N/A]\nNo running processes found\n")
    assert gpurelease.holders(smi) == {4242: 3072, 77: 0}
    assert gpurelease.holders(_tool(tmp_path, "4242, 1024\n", status=9)) == {}  # a failing tool gives no verdict


def test_the_wait_ends_at_once_when_none_of_the_pids_holds_memory_and_at_the_bound_otherwise(tmp_path: Path) -> None:
    said: list[str] = []
    smi = _tool(tmp_path, "4242, 1024\n")
    assert gpurelease.wait_released([99], 30, smi, said.append) and said == []
    assert gpurelease.wait_released([4242], 30, None, said.append)  # no nvidia-smi: no NVIDIA GPU
    assert not gpurelease.wait_released([4242], 0.5, smi, said.append)
    assert said == ["the failed attempt's process 4242 (1024 MiB) still held GPU memory after 0 s (HPCTORCH_GPU_RELEASE_S): the restart "
                    "goes on, and may meet out-of-memory on that device"]
    assert gpurelease.bound({"HPCTORCH_GPU_RELEASE_S": "5"}) == 5 and gpurelease.bound({}) == gpurelease.RELEASE_S

"""Before a restart, the failed attempt's GPU memory is released (bounded).

A worker that died still holds its device memory until the driver has torn its context down,
which can outlast the process by seconds (a process stuck in the driver, a large context): a new
worker started on that device meanwhile dies of out-of-memory, and the job spends a restart on
it. So before torch's agent starts an attempt's workers, the previous attempt's processes must
hold no memory on any GPU, as NVML sees them (``nvidia-smi --query-compute-apps=pid,used_memory
--format=csv,noheader,nounits``: one line ``PID, MiB`` per process holding a context, documented
in ``nvidia-smi --help-query-compute-apps``). It waits at most ``HPCTORCH_GPU_RELEASE_S``
(30 s), says why once it waits, and never where there is no ``nvidia-smi`` (no NVIDIA GPU).
Inside a container with a pid namespace of its own NVML names the host's pids, none of which
is a worker's here: nothing is waited for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping

RELEASE_S = 30.0
"""Default bound (``HPCTORCH_GPU_RELEASE_S``) on the wait for the failed attempt's memory."""
POLL_S = 0.2
SAY_AFTER_S = 1.0
"""A wait this long is said (the memory of a process that exited is usually gone at once)."""
QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
QUERY_TIMEOUT_S = 10.0

_previous: list[int] = []
"""The pids of the workers the agent started last (this node's previous attempt)."""


def holders(nvidia_smi: str) -> dict[int, int]:
    """Every process holding GPU memory, as NVML lists them: pid -> MiB (summed over devices);
    empty if the tool fails (no verdict is better than a wrong one)."""
    try:
        out = subprocess.run([nvidia_smi, *QUERY], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    held: dict[int, int] = {}
    for line in out.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) >= 2 and fields[0].isdigit():
            held[int(fields[0])] = held.get(int(fields[0]), 0) + (int(fields[1]) if fields[1].isdigit() else 0)
    return held


def bound(env: Mapping[str, str]) -> float:
    text = env.get("HPCTORCH_GPU_RELEASE_S", "")
    try:
        return max(0.0, float(text)) if text else RELEASE_S
    except ValueError:
        return RELEASE_S


def wait_released(pids: Iterable[int], limit_s: float, nvidia_smi: str | None,
                  say: Callable[[str], None] = lambda line: print(f"hpctorch: {line}", file=sys.stderr, flush=True)) -> bool:
    """Until none of ``pids`` holds GPU memory, at most ``limit_s``; whether they let go."""
    wanted = set(pids)
    if not wanted or nvidia_smi is None:
        return True
    start = time.monotonic()
    said = False
    while True:
        held = {pid: mib for pid, mib in holders(nvidia_smi).items() if pid in wanted}
        if not held:
            if said:
                say(f"the failed attempt's GPU memory was released after {time.monotonic() - start:.1f} s")
            return True
        waited = time.monotonic() - start
        what = ", ".join(f"process {pid} ({mib} MiB)" for pid, mib in sorted(held.items()))
        if waited >= limit_s:
            say(f"the failed attempt's {what} still held GPU memory after {limit_s:.0f} s (HPCTORCH_GPU_RELEASE_S): the restart "
                "goes on, and may meet out-of-memory on that device")
            return False
        if not said and waited >= SAY_AFTER_S:
            say(f"waiting for the failed attempt's {what} to release GPU memory before the restart")
            said = True
        time.sleep(POLL_S)


def before_start() -> None:
    """Before the agent starts an attempt's workers: the previous attempt's memory released."""
    if _previous:
        wait_released(_previous, bound(os.environ), shutil.which("nvidia-smi"))


def started(pids: Iterable[int]) -> None:
    _previous[:] = [pid for pid in pids if isinstance(pid, int) and pid > 0]


def install() -> None:
    """Around every attempt's start by torch's agent (``PContext.start``, as ``exits``): wait for
    the previous attempt's memory first, note this attempt's workers after."""
    import functools

    from torch.distributed.elastic.multiprocessing.api import PContext

    original = PContext.start
    if getattr(original, "_hpctorch_gpu", False):
        return

    @functools.wraps(original)  # the markers of the wrappers below travel up with __dict__
    def start(context, *args, **kwargs):  # type: ignore[no-untyped-def]
        before_start()
        result = original(context, *args, **kwargs)
        try:
            started(context.pids().values())
        except Exception:  # noqa: BLE001 - torch's names moved: no wait before the next attempt
            pass
        return result

    start._hpctorch_gpu = True  # type: ignore[attr-defined]
    PContext.start = start  # type: ignore[method-assign]

"""GPUs visible to this process, found without importing torch."""

from __future__ import annotations

import os
from collections.abc import Mapping


def visible_gpus(env: Mapping[str, str], proc_root: str = "/proc") -> tuple[str, ...]:
    """The device ids a CUDA program here would see, in CUDA's order.

    CUDA_VISIBLE_DEVICES, when set, is what the scheduler narrowed us to (indices,
    UUIDs or MIG ids); otherwise the NVIDIA driver's per-GPU entries in /proc.
    """
    narrowed = env.get("CUDA_VISIBLE_DEVICES")
    if narrowed is not None:
        ids = []
        for item in narrowed.split(","):
            item = item.strip()
            # CUDA stops at the first invalid entry; "-1" and "NoDevFiles" mean none.
            if not item or item.startswith("-") or item == "NoDevFiles":
                break
            ids.append(item)
        return tuple(ids)
    try:
        count = len(os.listdir(os.path.join(proc_root, "driver", "nvidia", "gpus")))
    except OSError:
        return ()
    return tuple(str(index) for index in range(count))

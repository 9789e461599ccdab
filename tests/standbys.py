"""The standbys of a job, as the tests and their worker scripts count them (no pytest here: the
fixture tests/fixtures/hang.py imports it too)."""

from __future__ import annotations


def standbys_of(mark: str) -> list[int]:
    """Live standbys waiting (hpctorch.start.standby: their command line says so, and their name
    is hpctorch-warm until their go; the zygote they are forked from is hpctorch-zygote) of the job whose environment
    holds JOB_MARK=``mark``: every node of a test shares this machine's /proc."""
    import os

    found, wanted = [], ("JOB_MARK=" + mark).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as source:
                if b"--standby" not in source.read().split(bytes(1)):
                    continue
            with open(f"/proc/{pid}/comm", "rb") as source:
                if source.read().strip() != b"hpctorch-warm":
                    continue  # the zygote (hpctorch-zygote), or a standby that became a worker
            with open(f"/proc/{pid}/environ", "rb") as source:
                if wanted in source.read().split(bytes(1)):
                    found.append(int(pid))
        except OSError:
            continue
    return found

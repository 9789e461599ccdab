"""Reading the per-slot host files batch systems write (PBS_NODEFILE, LSB_DJOB_HOSTFILE)."""

from __future__ import annotations

from ..errors import HpctorchError


def read_slot_file(path: str, variable: str) -> list[str]:
    """One host per slot, in order; the scheduler wrote it, so a missing file is its error."""
    try:
        with open(path, encoding="utf-8") as listing:
            hosts = [line.split()[0] for line in listing if line.strip()]
    except OSError as exc:
        raise HpctorchError(
            f"{variable}={path} cannot be read: {exc.strerror}",
            f"run inside the job (the file exists only there), or unset the stale {variable}",
        ) from None
    if not hosts:
        raise HpctorchError(f"{variable}={path} lists no host", f"unset the stale {variable}")
    return hosts


def group_slots(hosts: list[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Distinct hosts in first-seen order and their slot counts."""
    nodes = tuple(dict.fromkeys(hosts))
    return nodes, tuple(hosts.count(node) for node in nodes)

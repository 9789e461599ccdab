"""A job's master port, derived from its id: the same on every node and in every process,
with nothing exchanged."""

from __future__ import annotations

import re
import zlib

# Job-derived master ports live below Linux's ephemeral range (32768-60999), so an
# OS-assigned port of another program never takes them, and above the registered
# services most sites run. Consecutive job numbers get ports PORT_STEP_SLOTS apart (1250
# consecutive jobs never share one) and each job's steps have their own; an array index
# moves the port by ARRAY_STRIDE slots, and a non-numeric rest (a PBS server name) is
# hashed in, so ids that share digits (1234.pbs01 / 1259.pbs01, 1234[5] / 12345) differ.
PORT_BASE = 20000
PORT_SPAN = 10000
PORT_STEP_SLOTS = 8
ARRAY_STRIDE = 419  # prime to the 1250 slots: array siblings spread over the range
_JOB_ID = re.compile(r"^(\d{1,17})(?:[\[_](\d{1,9})\]?)?(.*)$")


def derive_port(job_id: str, step_id: str | None = None) -> int:
    """A master port for a job, the same on every node and in every process (crc32, never
    Python's seeded ``hash``), distinct for nearby job ids, array tasks and steps."""
    parts = _JOB_ID.match(job_id)
    if parts:
        number, array, rest = parts.groups()
        key = int(number) + ARRAY_STRIDE * int(array or 0) + zlib.crc32(rest.encode())
    else:  # Flux's f58 ids, run ids: no number to keep in order
        key = zlib.crc32(job_id.encode())
    step_digits = "".join(c for c in (step_id or "") if c.isdigit())
    step = int(step_digits) % PORT_STEP_SLOTS if step_digits else 0
    return PORT_BASE + (key * PORT_STEP_SLOTS + step) % PORT_SPAN


PORT_TRIES = 4
"""The derived port and its alternates: what a job tries when another process holds its port."""


def port_sequence(job_id: str, step_id: str | None = None, count: int = PORT_TRIES) -> tuple[int, ...]:
    """The job's port (``derive_port``), then ``count - 1`` alternates hashed from the job id
    and step: the same on every node, apart from the derived ports of nearby jobs."""
    found = [derive_port(job_id, step_id)]
    attempt = 1
    while len(found) < count and attempt < 4 * count:
        port = PORT_BASE + zlib.crc32(f"{job_id}/{step_id or ''}/alternate {attempt}".encode()) % PORT_SPAN
        if port not in found:
            found.append(port)
        attempt += 1
    return tuple(found)

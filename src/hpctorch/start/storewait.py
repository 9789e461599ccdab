"""A rank other than 0 waits, before torch's env:// rendezvous connects, until rank 0's
store listens: torch's client answers a refused connection by sleeping 0.25-0.75 s and then
longer (``ExponentialBackoffWithJitter`` in c10d's socket.cpp: 500 ms +-50 %, x1.5, up to
60 s), so a rank that reaches ``init_process_group`` a moment before rank 0 lost up to 0.75 s,
and one that waited minutes for a slow rank 0 up to a minute.

Here a plain TCP connect is tried (nothing sent; torch's own client connects right after), from
``FIRST_S``, growing x1.5 up to a cap that rises with the world size, so rank 0's node answers
at most ``PROBES_PER_S`` refused connections a second up to 40,000 waiting ranks, and one per
rank every ``CAP_MAX_S`` beyond (torch's own first retries: one per rank every 0.5 s). Only where
torch's env:// would create the store in rank 0 itself: not under torch's agent
(``TORCHELASTIC_USE_AGENT_STORE``: its store is up before any worker), the file backend, or
when the nodes' agreement (``HPCTORCH_AGREED``) already waited for it. torch is not imported.
"""

from __future__ import annotations

import functools
import os
import random
import socket
import sys
import time
from collections.abc import Callable, Mapping

FIRST_S = 0.01
PROBES_PER_S = 20_000
"""A refused connection costs rank 0's kernel a few microseconds; at 80,000 ranks (cap 2 s:
40,000 a second) a quarter of what torch's own first retries send."""
CAP_MIN_S = 0.05
CAP_MAX_S = 2.0
CONNECT_TIMEOUT_S = 2.0
"""A refusal answers at once; an unanswered SYN (a full listen backlog) needs a retransmission."""
_done: list[bool] = []


def needed(env: Mapping[str, str]) -> bool:
    """Whether this process's env:// rendezvous would race rank 0 creating its store."""
    return (
        env.get("RANK", "0") != "0"
        and bool(env.get("MASTER_ADDR"))
        and env.get("MASTER_PORT", "").isdigit() and int(env["MASTER_PORT"]) > 0
        and env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
        and not env.get("HPCTORCH_FILE_STORE")
        and not env.get("HPCTORCH_AGREED")
    )


def interval_cap(world_size: int) -> float:
    return min(CAP_MAX_S, max(CAP_MIN_S, world_size / PROBES_PER_S))


def wait(address: str, port: int, world_size: int, timeout_s: float,
         connect: Callable[[tuple, float], bool] | None = None) -> str:
    """Until something listens at ``address:port``: "listening", "timed out" after
    ``timeout_s``, or "unresolved" (torch then reports the name as it would have)."""
    probe = connect or _connect
    try:
        # Resolved once: a name service asked every 10 ms by thousands of ranks would suffer.
        targets = [info[4] for info in socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)]
    except OSError:
        return "unresolved"
    deadline = time.monotonic() + timeout_s
    pause, cap = FIRST_S, interval_cap(world_size)
    while True:
        for target in targets:
            if probe(target, max(0.01, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))):
                return "listening"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timed out"
        time.sleep(min(left, pause * random.uniform(0.75, 1.25)))  # jitter: ranks that started together
        pause = min(cap, pause * 1.5)


def _connect(target: tuple, timeout_s: float) -> bool:
    family = socket.AF_INET6 if len(target) == 4 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(target)
        except OSError:
            return False
    return True


def wait_once(env: Mapping[str, str], timeout_s: float, rank: int = -1, world_size: int = -1) -> str | None:
    """Once per process, where ``needed`` (``rank``/``world_size`` as given to
    ``init_process_group``, -1: from the environment). An error line if rank 0 never listened:
    torch's client would only wait its whole timeout again."""
    if rank >= 0:
        env = {**env, "RANK": str(rank)}
    if _done or not needed(env):
        return None
    _done.append(True)
    address, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    size = world_size if world_size > 0 else int(env.get("WORLD_SIZE", "1") or 1)
    outcome = wait(address, port, size, timeout_s)
    if outcome == "listening" and "hpctorch.timings_worker" in sys.modules:  # --timings
        sys.modules["hpctorch.timings_worker"].mark("worker: rank 0's store listening")
    if outcome != "timed out":
        return None
    return (f"rank {env['RANK']}: nothing listened at {address}:{port}, where rank 0 serves the job's store, "
            f"for {timeout_s:.0f} s: check that rank 0 started and reached init_process_group, "
            f"and that this node reaches {address} on port {port}")


def install() -> None:
    """Wrap ``init_process_group`` as torch loads it (``c10dhook``): the wait comes first
    where the call leaves the rendezvous to env:// (no store, no other init_method)."""
    from ..c10dhook import after_load

    after_load(_wrap)


def _wrap(module) -> None:  # type: ignore[no-untyped-def]
    import inspect

    init = module.init_process_group
    signature = inspect.signature(init)

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            given = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            given = None  # torch will say what is wrong with the call
        if given is not None and given.get("store") is None and given.get("init_method") in (None, "env://"):
            timeout = given.get("timeout") or _default_timeout(module, given.get("backend"))
            error = wait_once(os.environ, timeout.total_seconds(), given.get("rank", -1), given.get("world_size", -1))
            if error:
                raise sys.modules["torch.distributed"].DistNetworkError(error)
        return init(*args, **kwargs)

    module.init_process_group = init_process_group


def _default_timeout(module, backend):  # type: ignore[no-untyped-def]
    """torch's own default for this call (``_get_default_timeout``: NCCL's is shorter)."""
    nccl = getattr(module, "default_pg_nccl_timeout", None)
    if str(backend).lower() == "nccl" and hasattr(nccl, "total_seconds"):
        return nccl
    return module.default_pg_timeout

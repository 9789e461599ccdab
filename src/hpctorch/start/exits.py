"""When each worker torch's agent started exited, to the millisecond.

torch's agent stamps a worker's failure with the whole second it noticed it (``ProcessFailure``,
``int(time.time())`` at its next check): a rank that died at 12.99 s and was noticed at 13.05 s
reads as 13, later than the peer that raised at 12.995 s because of it, and the peer is named
first. The workers are children of this process (torch's agent runs in it) or of its zygote: a
thread per worker waits for its exit without reaping it (``waitid`` with ``WNOWAIT``: torch's
``Popen.poll`` still collects the status; a pidfd for one the zygote forked) and notes the time.
"""

from __future__ import annotations

import os
import threading
import time

_exited: dict[int, float] = {}


def watch(pids: object) -> None:
    """Note the exit time of each of ``pids`` (any iterable of ints), just started: a pid an earlier
    attempt's worker had is forgotten first, so its exit time is never this one's."""
    for pid in pids:  # type: ignore[attr-defined]
        if isinstance(pid, int) and pid > 0:
            _exited.pop(pid, None)
            threading.Thread(target=_wait, args=(pid,), name=f"hpctorch-exit-{pid}", daemon=True).start()


def _wait(pid: int) -> None:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        _wait_other(pid)  # forked by the node's zygote (start.zygote), or already reaped by torch's poll
    except OSError:
        return
    _exited[pid] = time.time()


def _wait_other(pid: int) -> None:
    """Until ``pid``, not a child of this process, ends: a pidfd turns readable then (a kernel
    without pidfds, before 5.3: its state, every 10 ms). Gone already (reaped): noted now, a little late."""
    import select

    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        from .zygote import running

        while running(pid):
            time.sleep(0.01)
        return
    try:
        select.select([descriptor], [], [])
    finally:
        os.close(descriptor)


def exited_at(pid: int) -> float | None:
    """The wall-clock time ``pid`` exited, where watched."""
    return _exited.get(pid)


def install() -> None:
    """Watch every worker torch's agent starts, from ``PContext.start`` (torch 2.1 to 2.13: every
    attempt's workers go through it; ``pids()`` names them once started)."""
    import functools

    from torch.distributed.elastic.multiprocessing.api import PContext

    original = PContext.start
    if getattr(original, "_hpctorch", False):
        return

    @functools.wraps(original)  # the markers of the wrappers below travel up with __dict__
    def start(context, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = original(context, *args, **kwargs)
        try:
            watch(context.pids().values())
        except Exception:  # noqa: BLE001 - torch's names moved: its own whole seconds stand
            pass
        return result

    start._hpctorch = True  # type: ignore[attr-defined]
    PContext.start = start  # type: ignore[method-assign]

"""No restart storms: under torch's agent (``--max-restarts``), attempts in a row that reached
no training step end the job.

An error at start (an import, a missing file, a device that fails its first call, a peer that
cannot connect) fails every attempt the same way: each restart spends the allocation again, and
a requeue would too. An attempt trained when one of this node's ranks completed a collective
after its process group (the straggler watch's files, ``guard.straggler_worker``, written at
once the first time). After ``limit`` attempts in a row that did not, this node stops with
``EXIT_NO_PROGRESS``; the other nodes hear it through the watchdog and torch's rendezvous,
which the stopping agent closes. Where the straggler watch is off there is nothing to read,
and torch's own count of restarts alone applies.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ..guard.goodput import Attempt, first_collective

EXIT_NO_PROGRESS = 4
"""hpctorch's exit status when attempts in a row reached no training step: a requeue would fail
the same way (``submit``'s scripts do not requeue it)."""
LIMIT_ENV = "HPCTORCH_NO_PROGRESS_ATTEMPTS"
LIMIT = 3
"""Attempts in a row without a training step before the job stops (``HPCTORCH_NO_PROGRESS_ATTEMPTS``;
0 turns the rule off)."""
ENDED = "_hpctorch_attempt_ended"
"""Marks an attempt's process context once counted: torch closes an attempt's processes more
than once (the context on a failure, then the agent on its restart or shutdown)."""


class NoProgress(Exception):
    """``attempts`` attempts in a row reached no training step."""

    def __init__(self, attempts: int, last: str | None = None) -> None:
        super().__init__(attempts)
        self.attempts = attempts
        self.last = last
        """How this node's last attempt failed, where one of its ranks did."""

    def line(self) -> str:
        last = f"; the last: {self.last}" if self.last else ""
        return (f"stopped: {self.attempts} attempts in a row reached no training step (no collective completed after the "
                f"process group{last}); restarting or requeueing would fail the same way: fix the first error above "
                f"(exit status {EXIT_NO_PROGRESS})")


def limit_from(env: Mapping[str, str]) -> int:
    """The limit the environment sets (a bad value: the default)."""
    try:
        return max(0, int(env.get(LIMIT_ENV, "") or LIMIT))
    except ValueError:
        return LIMIT


class Attempts:
    """This node's attempts, each noted as torch's agent ends it (``ended``, from the teardown
    hook): for the goodput (``history``) and, with a ``limit``, against restart storms."""

    def __init__(self, directory: str | None, limit: int) -> None:
        """``directory``: this node's straggler-watch folder (None: the watch is off, nothing to read)."""
        self.directory = directory
        self.limit = limit
        self.without_progress = 0
        self.stopped = False
        self.history: list[Attempt] = []
        self.last_failure: str | None = None
        """How this node's last attempt failed (``local rank 1 exited with code 3``), if one of its ranks did."""

    def ended(self, context: object) -> None:
        """Once per attempt; ``NoProgress`` at the limit (raised once: torch's agent then shuts
        down, closing the context again)."""
        if self.stopped or getattr(context, ENDED, False):
            return
        try:
            setattr(context, ENDED, True)
        except AttributeError:
            return  # not a context this module can tell apart from the next: uncounted
        self.last_failure = _failure(context)
        if self.directory is None:
            return
        # The files of this attempt's processes alone (any file where the context cannot name them:
        # then an earlier attempt's progress counts, and a storm is never made up).
        attempt = Attempt(time.monotonic(), first_collective(self.directory, _pids(context)))
        self.history.append(attempt)
        if not self.limit:
            return
        self.without_progress = 0 if attempt.first is not None else self.without_progress + 1
        if self.without_progress >= self.limit:
            self.stopped = True
            raise NoProgress(self.without_progress, _failure(context))


def _pids(context: object) -> set[int] | None:
    """The processes of torch's process context (``PContext.pids``, public in torch 2.1 to 2.13)."""
    try:
        return set(context.pids().values())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a context that cannot say: every file counts
        return None


def _failure(context: object) -> str | None:
    """The first failed local rank of the context (its ``_failures``: local rank -> torch's
    ProcessFailure, torch 2.1 to 2.13), in words."""
    from .spares import describe

    failures = getattr(context, "_failures", None)
    if not isinstance(failures, dict) or not failures:
        return None
    return describe(failures[min(failures)]).removeprefix("its ")

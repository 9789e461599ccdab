"""Restart storms (start.attempts): attempts in a row whose processes completed no collective
stop torch's agent at the limit; one that did starts the count again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctorch.start.attempts import EXIT_NO_PROGRESS, LIMIT, Attempts, NoProgress, limit_from


class Context:
    """What torch's process context offers the hook: its workers' pids by local rank."""

    def __init__(self, *pids: int) -> None:
        self._pids = pids

    def pids(self) -> dict[int, int]:
        return dict(enumerate(self._pids))


class Failure:
    """torch's ProcessFailure, as far as the line reads it."""

    def __init__(self, local_rank: int, exitcode: int) -> None:
        self.local_rank, self.exitcode = local_rank, exitcode


def wrote(folder: Path, local: int, pid: int, progress: bool) -> None:
    """A rank's straggler-watch file, as straggler_worker writes it."""
    (folder / f"{local}.json").write_text(json.dumps({"t": 1.0, "inside_s": 0.0, "count": int(progress), "rank": local, "pid": pid,
                                                      "first": 0.5 if progress else None}))


def test_attempts_without_a_training_step_in_a_row_stop_at_the_limit(tmp_path: Path) -> None:
    attempts = Attempts(str(tmp_path), 3)
    first = Context(101, 102)
    wrote(tmp_path, 0, 101, False)
    attempts.ended(first)
    attempts.ended(first)  # torch closes an attempt's context twice (on the failure, then on the restart)
    assert attempts.without_progress == 1
    second = Context(201, 202)
    wrote(tmp_path, 0, 201, True)  # one rank of the attempt trained: the count starts again
    attempts.ended(second)
    assert attempts.without_progress == 0
    # The next attempts' ranks die before they write: the file left by the second attempt's rank
    # (pid 201, progress) is not theirs.
    attempts.ended(Context(301, 302))
    attempts.ended(Context(401, 402))
    fifth = Context(501, 502)
    fifth._failures = {1: Failure(1, -9), 0: Failure(0, 3)}  # torch's, local rank -> ProcessFailure
    with pytest.raises(NoProgress) as raised:
        attempts.ended(fifth)
    assert raised.value.attempts == 3
    line = raised.value.line()
    assert line.startswith("stopped: 3 attempts in a row reached no training step") and f"(exit status {EXIT_NO_PROGRESS})" in line
    assert "; the last: local rank 0 exited with code 3)" in line, line
    attempts.ended(Context(601))  # torch's agent closes again as it shuts down: said once


def test_without_the_straggler_watchs_files_or_with_the_limit_0_nothing_stops(tmp_path: Path) -> None:
    for attempts in (Attempts(None, 3), Attempts(str(tmp_path), 0)):
        for pid in range(10):
            attempts.ended(Context(pid))
        assert not attempts.stopped


def test_a_context_that_cannot_name_its_processes_counts_any_file(tmp_path: Path) -> None:
    class Unnamed:
        """A context without pids()."""

    attempts = Attempts(str(tmp_path), 2)
    attempts.ended(Context(5))
    assert attempts.without_progress == 1
    wrote(tmp_path, 0, 7, True)
    attempts.ended(Unnamed())  # whose file is unknown: any progress counts, a storm is never made up
    assert attempts.without_progress == 0


def test_the_limit_comes_from_the_environment() -> None:
    assert limit_from({}) == LIMIT and limit_from({"HPCTORCH_NO_PROGRESS_ATTEMPTS": "5"}) == 5
    assert limit_from({"HPCTORCH_NO_PROGRESS_ATTEMPTS": "0"}) == 0 and limit_from({"HPCTORCH_NO_PROGRESS_ATTEMPTS": "many"}) == LIMIT

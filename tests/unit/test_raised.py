"""A worker's uncaught exception: its record in torch's error file, and which rank failed first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctorch.start import raised
from hpctorch.start.workers import first_failure

from ..conftest import clean_env

errors = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")


def _raise_in(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        {}["missing_column"]
    except KeyError as error:
        raised.report(error)


def test_the_record_names_the_exception_and_the_users_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "error.json"
    _raise_in(path, monkeypatch)
    shown = capsys.readouterr().err
    assert shown.startswith("Traceback (most recent call last):") and shown.rstrip().endswith("KeyError: 'missing_column'")
    data = json.loads(path.read_text())
    assert data["message"]["message"] == "KeyError: 'missing_column'"  # torch's own reader finds it there
    said = raised.read(str(path))
    assert said is not None and said.startswith("KeyError: 'missing_column' at ") and "test_raised.py:" in said
    assert raised.raised_at(str(path)) is not None
    assert raised.read(str(tmp_path / "none.json")) is None and raised.raised_at(str(tmp_path / "none.json")) is None


def test_a_record_read_back_cannot_move_the_cursor(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({raised.RECORD: {"exception": "E: \x1b[2Kx", "where": "a.py:1", "time": 1.0}}))
    assert raised.read(str(path)) == "E: \\x1b[2Kx at a.py:1"


def _failure(tmp_path: Path, rank: int, exitcode: int, timestamp: int, raised_time: float | None = None):  # type: ignore[no-untyped-def]
    path = tmp_path / f"error-{rank}.json"
    if raised_time is not None:
        path.write_text(json.dumps({"message": {"message": "E: x", "extraInfo": {"py_callstack": "", "timestamp": str(timestamp)}},
                                    raised.RECORD: {"exception": "E: x", "where": None, "time": raised_time}}))
    failure = errors.ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))
    failure.timestamp = timestamp
    return failure


def test_the_first_to_raise_is_named_though_it_exited_last(tmp_path: Path) -> None:
    # Rank 1 raised at 100.2 and was stopped (SIGTERM) on its way out; rank 0's collective broke after.
    error = errors.ChildFailedError("train", {0: _failure(tmp_path, 0, 1, 101, 100.9), 1: _failure(tmp_path, 1, -15, 102, 100.2)})
    assert first_failure(error)[0] == 1


def test_a_death_outranks_the_errors_it_causes_within_its_second(tmp_path: Path) -> None:
    # Rank 2 was killed (no record; torch saw it in second 100); rank 0 raised from the broken collective.
    error = errors.ChildFailedError("train", {0: _failure(tmp_path, 0, 1, 100, 100.4), 2: _failure(tmp_path, 2, -9, 100)})
    assert first_failure(error)[0] == 2
    assert os.path.exists(error.failures[0].error_file)


def test_without_a_raised_rank_torchs_choice_stands(tmp_path: Path) -> None:
    # The 2-node restart test (CI2): rank 3 exited 3, rank 2 was stopped by SIGTERM in the same second.
    error = errors.ChildFailedError("train", {3: _failure(tmp_path, 3, 3, 100), 2: _failure(tmp_path, 2, -15, 100)})
    assert first_failure(error) == error.get_first_failure()


def test_a_death_noticed_in_the_next_second_still_outranks_the_error_it_caused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 20-restart cluster test: rank 3 exited at 12.990 (os._exit, no record), torch noticed it at
    13.05 and stamped 13; rank 2 raised at 12.995 from the collective rank 3 broke. By torch's whole
    second rank 2 came first; by when rank 3 exited (``exits``), rank 3 did."""
    from hpctorch.start import exits

    error = errors.ChildFailedError("train", {2: _failure(tmp_path, 2, 1, 13, 12.995), 3: _failure(tmp_path, 3, 3, 13)})
    assert first_failure(error)[0] == 2  # nothing known of rank 3's exit: torch's second
    monkeypatch.setitem(exits._exited, error.failures[3].pid, 12.990)
    assert first_failure(error)[0] == 3


def test_an_exit_is_noted_to_the_millisecond_and_the_status_left_for_its_parent() -> None:
    import subprocess
    import sys
    import time

    from hpctorch.start import exits

    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"])
    exits._exited[child.pid] = 1.0  # an earlier worker's exit under the same pid
    exits.watch([child.pid])
    deadline = time.monotonic() + 60
    while exits.exited_at(child.pid) is None:  # noted while the child is a zombie nobody reaped
        assert time.monotonic() < deadline, "the exit was never noted"
        time.sleep(0.01)
    noted = exits.exited_at(child.pid)
    assert child.wait(timeout=60) == 3  # its status is still there for Popen (WNOWAIT)
    assert noted is not None and 1.0 < noted <= time.time()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_the_exit_of_a_worker_forked_by_another_process_is_noted_when_it_ends(monkeypatch: pytest.MonkeyPatch, pidfd: bool) -> None:
    """A worker forked by the node's zygote is not this process's child (waitid cannot wait for it):
    noted when it ends, not when it was first watched; on a kernel without pidfds too."""
    import os
    import subprocess
    import time

    from hpctorch.start import exits

    if not pidfd:
        monkeypatch.setattr(os, "pidfd_open", lambda _pid: (_ for _ in ()).throw(OSError(38, "pidfd_open: not implemented")), raising=False)
    # Its child, a cat reading our pipe, outlives it: an orphan, ended when we close the pipe.
    ending = subprocess.Popen(["sh", "-c", "exec 3<&0; cat <&3 >/dev/null & echo $!"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pid = int(ending.stdout.readline())  # type: ignore[union-attr]
    ending.stdout.close()  # type: ignore[union-attr]
    assert ending.wait(timeout=60) == 0
    exits.watch([pid])
    time.sleep(0.2)  # not a wait for anything: a note taken at the watch (the bug) then reads earlier than ``closed``
    closed = time.time()
    assert exits.exited_at(pid) is None  # still running: it reads until we close
    ending.stdin.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 60
    while exits.exited_at(pid) is None:
        assert time.monotonic() < deadline, "the exit was never noted"
        time.sleep(0.01)
    assert exits.exited_at(pid) >= closed  # type: ignore[operator]  # when it ended, not when it was watched


def test_a_rank_stopped_by_sigterm_never_outranks_a_rank_that_raised(tmp_path: Path) -> None:
    error = errors.ChildFailedError("train", {0: _failure(tmp_path, 0, -15, 99), 1: _failure(tmp_path, 1, 1, 101, 100.5)})
    assert first_failure(error)[0] == 1


TORN_WRITER = """
import os, sys
from hpctorch.start import raised
os.environ["TORCHELASTIC_ERROR_FILE"] = sys.argv[1]
try:
    raise RuntimeError("x" * 10_000_000)  # a record that takes a while to write
except RuntimeError as error:
    raised.report(error)
"""


def test_a_rank_killed_while_it_records_its_exception_leaves_the_whole_record_or_none(tmp_path: Path) -> None:
    """The agent SIGTERMs the survivors of a failure, which may be writing their own record: the
    file torch's agent then reads must parse, or not be there."""
    folder = tmp_path / "attempt_0" / "0"
    folder.mkdir(parents=True)
    path = folder / "error.json"
    child = subprocess.Popen([sys.executable, "-c", TORN_WRITER, str(path)], stderr=subprocess.DEVNULL, env=clean_env())
    deadline = time.monotonic() + 120
    while not any(folder.iterdir()) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    child.kill()  # as soon as its writing shows
    child.wait(timeout=60)
    if path.exists():
        json.loads(path.read_text())


def test_a_torn_error_file_reads_as_none_and_the_agent_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's agent read a stopped rank's torn file back and raised, ending the job (#40)."""
    monkeypatch.setattr(errors.ProcessFailure, "__post_init__", errors.ProcessFailure.__post_init__)  # restored after
    path = tmp_path / "error.json"
    path.write_text('{"message": {"mess')
    with pytest.raises(ValueError):
        errors.ProcessFailure(local_rank=0, pid=123, exitcode=-15, error_file=str(path))  # torch alone
    raised.tolerate_torn_error_files()
    failure = errors.ProcessFailure(local_rank=0, pid=123, exitcode=-15, error_file=str(path))
    assert failure.exitcode == -15 and "Signal 15" in failure.message, failure.message
    assert not path.exists() and (tmp_path / "error.json.torn").read_text() == '{"message": {"mess'
    path.write_text(json.dumps({"message": {"message": "KeyError: 'x'", "extraInfo": {"timestamp": "100"}}}))
    assert errors.ProcessFailure(local_rank=0, pid=124, exitcode=1, error_file=str(path)).message["message"] == "KeyError: 'x'"

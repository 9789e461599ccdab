"""The test cluster's turns (tests/cluster/harness.py): test processes share it, a disturbing test has it alone."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.harness import turn


def test_tests_share_the_cluster_and_one_that_disturbs_it_waits_for_them(tmp_path: Path) -> None:
    with turn(tmp_path, exclusive=False), turn(tmp_path, exclusive=False):
        with pytest.raises(TimeoutError, match="another test process held the test cluster"):
            with turn(tmp_path, exclusive=True, timeout=0.3):
                pass
    with turn(tmp_path, exclusive=True):
        with pytest.raises(TimeoutError):
            with turn(tmp_path, exclusive=False, timeout=0.3):
                pass


def _gate_shut(folder: Path) -> bool:
    with open(folder / "turnstile.lock", "a+") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(gate, fcntl.LOCK_UN)
        return False


def test_a_waiting_disturber_is_not_kept_out_by_a_stream_of_sharers(tmp_path: Path) -> None:
    got_it, done = threading.Event(), threading.Event()

    def disturber() -> None:
        with turn(tmp_path, exclusive=True, timeout=60):
            got_it.set()
            done.wait(60)

    with turn(tmp_path, exclusive=False):
        waiter = threading.Thread(target=disturber, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 60
        while not _gate_shut(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        # The disturber waits with the gate shut: a new sharer cannot slip in before it.
        with pytest.raises(TimeoutError):
            with turn(tmp_path, exclusive=False, timeout=0.3):
                pass
        assert not got_it.is_set()
    assert got_it.wait(60)
    done.set()
    waiter.join(60)

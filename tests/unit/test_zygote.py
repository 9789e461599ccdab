"""Standbys forked from a zygote (``start.zygote``), as torch's agent sees them: real processes, a
real zygote (here a plain interpreter in place of the worker entry, which would import torch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hpctorch.start import zygote

STANDBY = """
import os, sys
from hpctorch.start import zygote
zygote.serve()
line = sys.stdin.readline()  # the go
if os.environ.get("HANG_AFTER_GO"):
    import time
    time.sleep(600)
os._exit(int(os.environ.get("EXIT_WITH", "0")) if line else 99)
"""


@pytest.fixture
def made():  # type: ignore[no-untyped-def]
    zygotes: list[zygote.Zygote] = []

    def make(code: str = STANDBY) -> zygote.Zygote:
        zygotes.append(zygote.Zygote([sys.executable, "-c", code], dict(os.environ)))
        return zygotes[-1]

    yield make
    for each in zygotes:
        each.close()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_a_forked_standby_is_the_zygotes_child_in_its_own_session_and_its_exit_code_comes_back(made) -> None:  # type: ignore[no-untyped-def]
    maker = made()
    first, second = maker.fork({**os.environ, "EXIT_WITH": "3"}), maker.fork({**os.environ, "EXIT_WITH": "0"})
    assert first is not None and second is not None
    assert _parent(first.pid) == _parent(second.pid) == maker.process.pid
    assert os.getpgid(first.pid) == first.pid and os.getsid(first.pid) == first.pid  # torch's agent signals its group
    with open(f"/proc/{maker.process.pid}/comm") as comm:
        assert comm.read().strip() == "hpctorch-zygote"
    assert first.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        first.wait(0.2)
    for forked in (first, second):
        forked.stdin.write(b"go\n")
        forked.stdin.close()
    assert first.wait(60) == 3 and second.wait(60) == 0
    assert first.poll() == 3 and first.returncode == 3


def test_a_signal_to_its_group_is_its_exit_code_and_a_standby_never_needed_ends_at_end_of_file(made) -> None:  # type: ignore[no-untyped-def]
    maker = made()
    hung, idle = maker.fork({**os.environ, "HANG_AFTER_GO": "1"}), maker.fork(dict(os.environ))
    assert hung is not None and idle is not None
    hung.stdin.write(b"go\n")
    hung.stdin.flush()
    os.killpg(hung.pid, signal.SIGTERM)
    assert hung.wait(60) == -signal.SIGTERM
    idle.stdin.close()  # the agent went: the standby reads end-of-file
    assert idle.wait(60) == 99


def test_when_the_zygote_is_gone_a_running_standby_is_watched_by_its_pid(made) -> None:  # type: ignore[no-untyped-def]
    maker = made()
    forked = maker.fork({**os.environ, "HANG_AFTER_GO": "1"})
    assert forked is not None
    forked.stdin.write(b"go\n")
    forked.stdin.flush()
    maker.close()
    assert maker.fork(dict(os.environ)) is None  # no more forks: the caller starts a process of its own
    assert forked.poll() is None  # still running, init's child now
    forked.kill()
    assert forked.wait(60) == zygote.GONE_EXIT


def test_a_zygote_that_ends_before_it_serves_forks_nothing_and_says_so_at_once(made) -> None:  # type: ignore[no-untyped-def]
    maker = made("import sys; sys.exit(1)")
    started = time.monotonic()
    assert maker.fork(dict(os.environ)) is None
    assert time.monotonic() - started < zygote.READY_S
    assert maker.gone

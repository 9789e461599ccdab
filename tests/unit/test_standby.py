"""Which standby may become a new worker (``start.standby``): the same interpreter, flags and
worker entry, and the same values of what is read as Python and torch start."""

from __future__ import annotations

import subprocess
import sys

from hpctorch.start import standby

ENTRY = "/site/hpctorch/_worker.py"


def _waiting(env: dict[str, str]) -> standby.Standby:
    popen = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True)
    return standby.Standby(popen, ("/env/bin/python", "-u", ENTRY, "train.py"), env)


def test_a_standby_fits_the_same_interpreter_and_start_time_environment_only() -> None:
    env = {"OMP_NUM_THREADS": "4", "LOCAL_RANK": "1", "RANK": "5", "CUDA_VISIBLE_DEVICES": "0,1"}
    waiting = _waiting(env)
    try:
        assert waiting.fits(("/env/bin/python", "-u", ENTRY, "other.py", "--lr", "1"), {**env, "RANK": "3", "MASTER_PORT": "1"})
        assert not waiting.fits(("/env/bin/python", ENTRY, "train.py"), env)  # other flags
        assert not waiting.fits(("/other/bin/python", "-u", ENTRY, "train.py"), env)  # another interpreter
        assert not waiting.fits(("/env/bin/python", "-u", "train.py"), env)  # not the worker entry
        assert not waiting.fits(("/env/bin/python", "-u", ENTRY, "train.py"), {**env, "OMP_NUM_THREADS": "8"})
        assert not waiting.fits(("/env/bin/python", "-u", ENTRY, "train.py"), {**env, "CUDA_VISIBLE_DEVICES": "1"})
    finally:
        waiting.stop()
    assert waiting.popen.poll() is not None
    assert not waiting.fits(("/env/bin/python", "-u", ENTRY, "train.py"), env)  # gone


def test_the_go_names_what_the_worker_entry_runs_and_where_its_output_goes() -> None:
    popen = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    waiting = standby.Standby(popen, ("/env/bin/python", "-u", ENTRY), {})
    assert waiting.go(("/env/bin/python", "-u", ENTRY, "train.py", "--lr", "1"), {"RANK": "3"}, "/logs/0/stdout.log", None)
    import json

    assert popen.stdout is not None
    go = json.loads(popen.stdout.read())
    popen.wait(60)
    assert go["argv"] == ["train.py", "--lr", "1"] and go["env"] == {"RANK": "3"}
    assert go["stdout"] == "/logs/0/stdout.log" and go["stderr"] is None


def test_a_forked_worker_tells_the_stacks_readers_every_variable_its_start_lacked() -> None:
    """Its /proc environ is its zygote's (local rank 0's, without the attempt's variables): the rank
    file holds every one of those, so ``hpctorch stacks`` finds its rank, node count and store."""
    from hpctorch.host.folders import RANK_KEYS

    assert set(standby.RANK_VARS) | {"LOCAL_RANK"} <= set(RANK_KEYS)

"""Before a restart, the failed attempt's GPU memory is released (``start.gpurelease``), under
torch's real agent. No GPU here: ``nvidia-smi`` is a stand-in that answers the documented query
(``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``: a line
``PID, MiB`` per process holding memory; ``nvidia-smi --help-query-compute-apps``), naming the
failed worker's pid until the test says the driver let go."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, clean_env

pytest.importorskip("torch")

FAKE_SMI = """#!{python}
import os, sys
state = os.environ["GPU_STATE"]
assert sys.argv[1:] == ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], sys.argv
pid = os.path.join(state, "pid")
if os.path.exists(pid) and not os.path.exists(os.path.join(state, "released")):
    print(open(pid).read().strip() + ", 2048")
"""

SCRIPT = """
import os, sys, time
state = os.environ["GPU_STATE"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    open(os.path.join(state, "pid"), "w").write(str(os.getpid()))
    sys.exit(3)
open(os.path.join(state, "second"), "w").write(repr(time.time()))
print("the second attempt ran", flush=True)
"""


def _setup(tmp_path: Path) -> tuple[Path, dict[str, str], list[str]]:
    tools, state = tmp_path / "bin", tmp_path / "state"
    tools.mkdir()
    state.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = clean_env(GPU_STATE=str(state), PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    return state, env, [sys.executable, "-m", "hpctorch", "run", "--max-restarts", "1", "--nproc-per-node", "1", str(script)]


def test_the_restart_waits_until_the_failed_worker_s_gpu_memory_is_released(tmp_path: Path) -> None:
    state, env, argv = _setup(tmp_path)
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 180
        assert run.stderr is not None
        while not any("to release GPU memory before the restart" in line for line in seen):
            assert time.monotonic() < deadline and run.poll() is None, "".join(seen)[-3000:]
            seen.append(run.stderr.readline())
        pid = (state / "pid").read_text().strip()
        assert f"hpctorch: waiting for the failed attempt's process {pid} (2048 MiB) to release GPU memory before the restart\n" in seen
        assert not (state / "second").exists()  # no worker of the next attempt while the memory is held
        released = time.time()
        (state / "released").write_text("")
        out, err = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, ("".join(seen) + err)[-3000:]
    assert "the second attempt ran" in out
    assert float((state / "second").read_text()) > released
    assert "hpctorch: the failed attempt's GPU memory was released after" in err


def test_memory_never_released_is_said_and_the_restart_goes_on_at_the_bound(tmp_path: Path) -> None:
    state, env, argv = _setup(tmp_path)
    done = subprocess.run(argv, capture_output=True, text=True, env={**env, "HPCTORCH_GPU_RELEASE_S": "2"}, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    pid = (state / "pid").read_text().strip()
    assert (f"hpctorch: the failed attempt's process {pid} (2048 MiB) still held GPU memory after 2 s (HPCTORCH_GPU_RELEASE_S): "
            "the restart goes on, and may meet out-of-memory on that device") in done.stderr, done.stderr[-3000:]
    assert "the second attempt ran" in done.stdout

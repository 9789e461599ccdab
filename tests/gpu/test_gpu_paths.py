"""The paths only a GPU exercises: the screen's GPU measures and NVML, the doctor on a GPU node,
and the straggler watch under NCCL (torch's completion hook and CUDA-event durations).

They skip where no CUDA device is visible (CI has none; no requirement can make one): run them
on a GPU machine with ``python -m pytest tests/gpu``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src"), "PYTHONUNBUFFERED": "1", **extra}


def test_the_screen_measures_every_visible_gpu() -> None:
    from hpctorch.screen import measure

    found = measure.gpus()
    assert len(found) == torch.cuda.device_count()
    for gpu in found:
        print(gpu)
        assert gpu["tflops"] > 1, gpu  # any GPU of this decade multiplies bf16 faster than 1 TFLOP/s
        assert gpu["h2d_gbs"] > 0.5 and gpu["d2h_gbs"] > 0.5, gpu


def test_nvml_answers_for_every_gpu() -> None:
    pytest.importorskip("pynvml")
    from hpctorch.screen import measure

    problems, missing = measure.nvml_problems()
    print(problems, missing)
    assert missing is None
    assert all(isinstance(p, str) for p in problems)
    node = measure.this_node(use_gpus=True)
    print(node)
    assert not any("GPU" in u or "NVML" in u for u in node["unmeasured"]), node


def test_the_doctor_screens_a_gpu_node() -> None:
    done = subprocess.run([sys.executable, "-m", "hpctorch", "doctor", "--json", "-", "--timeout", "60"], env=_env(),
                          capture_output=True, text=True, timeout=180)
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0
    report = json.loads(done.stdout)  # the JSON alone; the table went to stderr
    text = json.dumps(report)
    assert '"tflops"' in text, text[:2000]


def test_nccls_flight_recorder_gives_device_durations() -> None:
    script = textwrap.dedent("""
        from hpctorch.guard import straggler_worker as w
        w.install()  # as the worker entry does: before the script imports torch.distributed
        import os, time, torch, torch.distributed as dist
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method="tcp://127.0.0.1:29961")
        big = torch.ones(64 * 2**20, device="cuda")
        torch.cuda.synchronize()
        for _ in range(20):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        time.sleep(2)  # torch's watchdog retires them
        w._device_durations()
        totals = w.METER.totals(time.monotonic())
        print("TOTALS", totals)
        assert totals["count"] >= 20, totals
        assert totals["inside_s"] > 0, totals
        started = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
        time.sleep(2)
        w._device_durations()
        after = w.METER.totals(time.monotonic())
        print("TEN", wall, after["inside_s"] - totals["inside_s"], after["count"] - totals["count"])
        assert after["count"] - totals["count"] == 10
        assert 0 < after["inside_s"] - totals["inside_s"] <= wall * 1.05  # device time of the ten, within their wall time
        dist.destroy_process_group()
    """)
    done = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=180)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0


def test_ddp_on_nccl_is_timed_by_the_watch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda(),
                                                          bucket_cap_mb=4)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(256, 2048, device="cuda")
        import time
        end = time.monotonic() + 14
        while time.monotonic() < end:
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        dist.destroy_process_group()
    """))
    summary = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, "-m", "hpctorch", "run", "--nproc-per-node", str(torch.cuda.device_count()),
                           "--summary-json", str(summary), str(script)], env=_env(HPCTORCH_STRAGGLER_WINDOW_S="6"),
                          capture_output=True, text=True, timeout=300)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0
    assert "will be deprecated" not in done.stderr
    ranks = json.loads(summary.read_text())["ranks"]
    assert len(ranks) == torch.cuda.device_count()
    assert all(row["collectives"] > 0 and row["inside_s"] > 0 for row in ranks), ranks


def test_a_warm_restart_runs_in_a_standby_whose_cuda_context_is_made(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """#43: the standby made its device's CUDA context while it waited; the restarted worker runs
    in it on its own device (LOCAL_RANK), NCCL works there, and the failed worker's memory was
    released before it started."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time, torch, torch.distributed as dist
        warm = torch.cuda.is_initialized()  # before this script's first CUDA call
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        total = torch.ones(1, device="cuda")
        dist.all_reduce(total)
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        with open("/proc/self/cmdline", "rb") as source:
            standby = b"--standby" in source.read().split(b"\\0")
        print(f"attempt={attempt} rank={dist.get_rank()} warm={warm} standby={standby} device={torch.cuda.current_device()} "
              f"sum={total.item():.0f}", flush=True)
        if attempt == "0":
            marks = os.environ["HPCTORCH_STRAGGLERS_DIR"]
            while not os.path.exists(os.path.join(marks, f"{local}.modules")):
                time.sleep(0.05)
            if dist.get_rank() == 0:
                time.sleep(5)  # past the standbys' imports and contexts
                os._exit(7)
            time.sleep(120)
        dist.destroy_process_group()
    """))
    count = torch.cuda.device_count()
    done = subprocess.run([sys.executable, "-m", "hpctorch", "run", "--max-restarts", "1", "--nproc-per-node", str(count), str(script)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0
    again = [line for line in done.stdout.splitlines() if "attempt=1" in line]
    assert len(again) == count
    for line in again:
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        assert fields["warm"] == "True" and fields["standby"] == "True" and fields["sum"] == str(count), line
        assert fields["device"] == str(int(fields["rank"]) % count), line


def test_forked_workers_make_their_cuda_context_where_their_script_asks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Workers forked from the node's zygote (one import of torch per node): the zygote never touches
    CUDA (a fork after it would break), no worker has a context before its script's first CUDA call
    (none on another rank's device), and NCCL works in them."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist
        before = torch.cuda.is_initialized()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        total = torch.ones(1, device="cuda")
        dist.all_reduce(total)
        with open(f"/proc/{os.getppid()}/comm") as parent:
            print(f"rank={dist.get_rank()} before={before} parent={parent.read().strip()} sum={total.item():.0f}", flush=True)
        dist.destroy_process_group()
    """))
    count = torch.cuda.device_count()
    done = subprocess.run([sys.executable, "-m", "hpctorch", "run", "--nproc-per-node", str(count), str(script)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0
    seen = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in done.stdout.splitlines() if "before=" in line]
    assert len(seen) == count and all(r["before"] == "False" and r["parent"] == "hpctorch-zygote" and r["sum"] == str(count) for r in seen), seen

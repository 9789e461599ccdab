"""hpctorch run / plan / init on this machine with real torch processes and gloo."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctorch.host.network import free_port

from ..conftest import EXAMPLES, ROOT, clean_env, hpctorch, unprefixed
from .reports import reports

REPORT = str(ROOT / "tests" / "fixtures" / "report.py")


# Imported first by every Python process of the job (PYTHONPATH): it notes which of them imports torch.
IMPORTS_TORCH = """
import os, sys
def _hook(event, args, seen=[]):
    if event == "import" and args[0].partition(".")[0] == "torch" and not seen:
        seen.append(1)
        with open(os.environ["TORCH_IMPORTS"], "a") as out:
            out.write(os.path.basename(sys.argv[0]) + "\\n")
sys.addaudithook(_hook)
"""


def test_demo_two_simulated_nodes_of_two_workers_trains(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(IMPORTS_TORCH)
    imports = tmp_path / "imports"
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "2", str(EXAMPLES / "toy_ddp.py"), "--steps", "8",
                    env=clean_env(PYTHONPATH=str(tmp_path), TORCH_IMPORTS=str(imports)), timeout=300)
    assert done.returncode == 0, done.stderr
    # The node agents are forked from hpctorch once it has imported torch's agent: one import for
    # all of them (not one each); each node's workers are forked from its zygote, which imported
    # torch once for the node (not once per worker).
    assert sorted(imports.read_text().split()) == ["__main__.py"] + ["_worker.py"] * 2, imports.read_text()
    ranks = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in unprefixed(done.stdout).splitlines() if line.startswith("rank=")]
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1, 2, 3]
    assert {r["world"] for r in ranks} == {"4"}
    assert {(r["rank"], r["node_rank"]) for r in ranks} == {("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")}
    assert len({r["master"] for r in ranks}) == 1
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", unprefixed(done.stdout), re.M)]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert "done world=4 steps=8" in done.stdout


WHO = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
with open(f"/proc/{os.getppid()}/comm") as parent, open("/proc/self/cmdline", "rb") as cmdline:
    print(f"rank={dist.get_rank()} parent={parent.read().strip()} ppid={os.getppid()} script={b'who.py' in cmdline.read()}", flush=True)
print(f"err rank={dist.get_rank()}", file=sys.stderr, flush=True)
dist.barrier()
rank = dist.get_rank()
dist.destroy_process_group()
sys.exit(int(os.environ.get("EXIT_RANK_1", "0")) if rank == 1 else 0)
"""


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "HPCTORCH_FORK_WORKERS=0"])
def test_one_nodes_workers_are_forked_from_one_import_of_torch(tmp_path: Path, forked: bool) -> None:
    """hpctorch's own starter forks a node's workers from one process that imported torch once: one
    import for the node, not one per local rank; each worker keeps the script in its command line
    (ps, pkill -f), its output prefixed, its exit code its own."""
    (tmp_path / "sitecustomize.py").write_text(IMPORTS_TORCH)
    (tmp_path / "who.py").write_text(WHO)
    imports = tmp_path / "imports"
    env = clean_env(PYTHONPATH=str(tmp_path), TORCH_IMPORTS=str(imports), EXIT_RANK_1="3", **({} if forked else {"HPCTORCH_FORK_WORKERS": "0"}))
    done = hpctorch("run", "--nproc-per-node", "3", str(tmp_path / "who.py"), env=env, timeout=300)
    assert done.returncode == 1 and "rank 1 (local rank 1) exited with code 3" in done.stderr.splitlines()[-1], done.stderr
    assert sorted(imports.read_text().split()) == (["_worker.py"] if forked else ["who.py"] * 3), imports.read_text()
    ranks = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in done.stdout.splitlines() if "parent=" in line]
    assert sorted(r["rank"] for r in ranks) == ["0", "1", "2"] and {r["script"] for r in ranks} == {"True"}, done.stdout
    parents = {(r["parent"], r["ppid"]) for r in ranks}
    assert len(parents) == 1 and (next(iter(parents))[0] == "hpctorch-zygote") == forked, parents
    assert sorted(line for line in done.stderr.splitlines() if "err rank=" in line) == [f"[rank {r}]: err rank={r}" for r in range(3)]


def test_a_node_of_one_worker_starts_it_as_its_own_process(tmp_path: Path) -> None:
    """One worker and no restarts: no zygote (it would import torch for one fork), so a script that
    never imports torch costs no import of it; with two workers, the node's one import is the zygote's."""
    (tmp_path / "sitecustomize.py").write_text(IMPORTS_TORCH)
    (tmp_path / "plain.py").write_text("import os\nwith open(f'/proc/{os.getppid()}/comm') as p:\n    print('parent=' + p.read().strip(), flush=True)\n")
    for count, parent, imported in (("1", "python", ""), ("2", "hpctorch-zygote", "_worker.py\n")):
        imports = tmp_path / f"imports-{count}"
        done = hpctorch("run", "--nproc-per-node", count, str(tmp_path / "plain.py"), env=clean_env(PYTHONPATH=str(tmp_path), TORCH_IMPORTS=str(imports)),
                        timeout=300)
        assert done.returncode == 0, done.stderr
        parents = re.findall(r"parent=(\S+)", done.stdout)
        assert len(parents) == int(count) and all(p.startswith(parent) for p in parents), (count, done.stdout)
        seen = imports.read_text() if imports.exists() else ""
        assert seen == imported, (count, seen)


def test_a_stop_while_the_zygote_imports_torch_is_taken_at_once(tmp_path: Path) -> None:
    """SIGTERM while the node's zygote still imports torch (here it never finishes: a slow shared
    file system): hpctorch gives up waiting for it, stops, and leaves no process behind."""
    import signal
    import time

    import psutil

    (tmp_path / "sitecustomize.py").write_text("import sys, time\nif '--standby' in sys.argv:\n    time.sleep(600)\n")
    (tmp_path / "who.py").write_text(WHO)
    job = subprocess.Popen([sys.executable, "-m", "hpctorch", "run", "--nproc-per-node", "2", str(tmp_path / "who.py")],
                           env=clean_env(PYTHONPATH=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a hang guard
        while not any("--standby" in c.cmdline() for c in psutil.Process(job.pid).children()):
            assert time.monotonic() < deadline and job.poll() is None, "no zygote was started"
            time.sleep(0.05)
        zygote = next(c for c in psutil.Process(job.pid).children() if "--standby" in c.cmdline())
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)  # the zygote would have been waited for 300 s
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err.splitlines()[-1], err
    assert not zygote.is_running() or zygote.status() == psutil.STATUS_ZOMBIE


def test_workers_get_exactly_the_planned_environment() -> None:
    args = ("--nproc-per-node", "2", "--run-id", "envcheck")
    planned = json.loads(hpctorch("plan", "--json", *args, REPORT, env=clean_env()).stdout)
    done = hpctorch("run", *args, REPORT, env=clean_env())
    assert done.returncode == 0, done.stderr
    seen = sorted(reports(done.stdout), key=lambda r: int(r["env"]["RANK"]))
    assert len(seen) == 2
    for worker, report in zip(planned["workers"], seen):
        expected = {k: v for k, v in worker["env"].items()}
        actual = {k: report["env"].get(k) for k in expected}
        assert actual == expected
        # The OS chose the port at start; every worker got the same one.
        assert report["env"]["MASTER_PORT"] == seen[0]["env"]["MASTER_PORT"]


def test_per_task_mode_execs_in_place_without_torch() -> None:
    port = str(free_port())
    env = clean_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    process = subprocess.Popen([sys.executable, "-m", "hpctorch", "run", REPORT], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    out, _ = process.communicate(timeout=60)
    (report,) = reports(out)
    assert report["pid"] == process.pid  # exec: no extra process
    assert report["torch_loaded_at_start"] is False
    assert report["env"]["GROUP_RANK"] == "0" and report["env"]["LOCAL_WORLD_SIZE"] == "1"
    assert report["env"]["MASTER_PORT"] == port


def test_module_mode_like_python_dash_m() -> None:
    done = hpctorch("run", "--nproc-per-node", "1", "-m", "tests.fixtures.report", env=clean_env())
    assert done.returncode == 0, done.stderr
    assert [r["env"]["RANK"] for r in reports(done.stdout)] == ["0"]


def test_init_as_plain_python_is_a_world_of_one() -> None:
    done = subprocess.run([sys.executable, REPORT, "--init"], env=clean_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    (report,) = reports(done.stdout)
    assert (report["rank"], report["world_size"], report["backend"], report["rank_sum"]) == (0, 1, "gloo", 0.0)


def test_init_under_hpctorch_run_and_under_torchrun() -> None:
    launchers = [
        [sys.executable, "-m", "hpctorch", "run", "--nproc-per-node", "3"],
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"],
    ]
    for launcher in launchers:
        done = subprocess.run([*launcher, REPORT, "--init"], env=clean_env(), capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        seen = reports(done.stdout)
        assert sorted(r["rank"] for r in seen) == [0, 1, 2]
        assert {r["world_size"] for r in seen} == {3} and {r["rank_sum"] for r in seen} == {3.0}


def test_a_failing_worker_fails_the_run_and_is_named() -> None:
    done = hpctorch("run", "--nproc-per-node", "2", REPORT, "--exit", "3", env=clean_env())
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"hpctorch: rank [01] \(local rank [01]\) exited with code 3", last), last


def test_a_failing_simulated_node_stops_the_others() -> None:
    # Rank 1 fails at once; rank 0 on the other node would sleep an hour: only being stopped ends it.
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "1", REPORT, "--sleep", "3600", "--fail-rank", "1",
                    env=clean_env(), timeout=300)  # a hang guard, far below rank 0's sleep
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"hpctorch: (stopped: )?rank 1 on node 1 \(local rank 0\) exited with code \d+; details: .*; the other nodes were stopped$",
                    last), done.stderr[-3000:]
    assert "REPORT" not in done.stdout  # rank 0 was stopped, it did not finish its sleep


def test_thirty_two_single_node_jobs_at_once_never_collide() -> None:
    jobs = [
        subprocess.Popen([sys.executable, "-m", "hpctorch", "run", REPORT, "--sleep", "3"], env=clean_env(), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(32)
    ]
    results = [job.communicate(timeout=400) for job in jobs]
    assert [job.returncode for job in jobs] == [0] * 32, [err[-500:] for _, err in results if err][:2]
    ports = {reports(out)[0]["env"]["MASTER_PORT"] for out, _ in results}
    assert len(ports) == 32


def test_plan_never_imports_torch() -> None:
    code = "import sys; from hpctorch.cli.main import main; main(['plan', '--nproc-per-node', '2']); assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_hostlist_commands() -> None:
    assert hpctorch("hostlist", "expand", "nid[0009-0011]").stdout.split() == ["nid0009", "nid0010", "nid0011"]
    assert hpctorch("hostlist", "compress", "n1", "n2,n3", "x").stdout.strip() == "n[1-3],x"


def test_output_is_prefixed_filtered_and_kept_per_rank(tmp_path: Path) -> None:
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "2", "--quiet-ranks", "--log-dir", str(tmp_path),
                    str(EXAMPLES / "toy_ddp.py"), "--steps", "3", env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    shown = {m for m in re.findall(r"^\[node \d rank (\d)\]: ", done.stdout, re.M)}
    assert shown == {"0"}  # --quiet-ranks: only rank 0 on the terminal
    assert "[node 0 rank 0]: done world=4 steps=3" in done.stdout
    kept = sorted(tmp_path.rglob("stdout.log"))
    assert len(kept) == 4  # every rank's output is kept: node0/.../0, 1 and node1/.../0, 1
    texts = [p.read_text() for p in kept]
    assert sorted(int(re.search(r"^rank=(\d)", t, re.M).group(1)) for t in texts) == [0, 1, 2, 3]
    plain = hpctorch("run", "--no-prefix", "--nproc-per-node", "2", str(EXAMPLES / "toy_ddp.py"), "--steps", "2", env=clean_env(), timeout=300)
    assert plain.returncode == 0 and "[rank" not in plain.stdout and "done world=2" in plain.stdout


@pytest.mark.parametrize("given_port", [False, True])
def test_a_restart_recovers_a_failed_rank(given_port: bool) -> None:
    # Rank 1 fails in the first attempt only: the restarted workers must meet in a fresh store
    # (torch's shared one would hand them the dead workers' addresses). A given port used to
    # mean torch's static rendezvous, whose one store cannot be made fresh.
    port = ("--master-port", str(free_port())) if given_port else ()
    done = hpctorch("run", "--max-restarts", "1", "--nproc-per-node", "2", *port, REPORT, "--init", "--fail-first", "1",
                    env=clean_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines() if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["rank_sum"] for r in reports} == {1.0}
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reports} == {"1"}


def test_a_restart_across_simulated_nodes_recovers_and_node_0_hears_from_every_node() -> None:
    done = hpctorch("run", "--simulate-nodes", "2", "--max-restarts", "1", "--nproc-per-node", "1", REPORT, "--init", "--brief",
                    "--fail-first", "1", env=clean_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines() if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["rank_sum"] for r in reports} == {1.0}
    # Node 0 serves torch's c10d store (not whichever simulated node got there first), so it
    # outlives the others and the summary covers every node.
    assert "exit 0 on all 2 node(s)" in done.stderr, done.stderr[-2000:]


def test_one_node_is_started_by_hpctorch_unless_torchs_agent_is_needed() -> None:
    def starter(*args: str) -> str:
        done = hpctorch("plan", "--nproc-per-node", "2", *args, REPORT, env=clean_env())
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if line.strip().startswith("started by"))

    assert "hpctorch (no torch agent)" in starter()
    assert "torch's elastic agent" in starter("--max-restarts", "2") and "--max-restarts 2" in starter("--max-restarts", "2")
    assert "torch's elastic agent" in starter("--simulate-nodes", "2")
    assert "torch's elastic agent" in starter("--rdzv-backend", "c10d")


def test_timings_name_every_stage_and_the_slowest_node() -> None:
    done = hpctorch("run", "--timings", "--simulate-nodes", "2", "--nproc-per-node", "2", str(ROOT / "benchmarks" / "worker_allreduce.py"),
                    env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = unprefixed(done.stderr)
    assert "hpctorch: startup of 4 rank(s) on 2 node(s)" in text, text[-3000:]
    stages = re.findall(r"^  (\S.*?)\s+(\d+\.\d\d)  (node [01])", text, re.M)
    names = [name for name, _, _ in stages]
    for stage in ("agreement done", "worker: Python up", "worker: rendezvous reached", "worker: rendezvous done",
                  "worker: first collective done"):
        assert stage in names, text[-3000:]
    seconds = [float(s) for _, s, _ in stages]
    assert seconds == sorted(seconds) and seconds[0] > 0


def test_timings_on_one_node_started_by_hpctorch() -> None:
    done = hpctorch("run", "--timings", "--nproc-per-node", "2", str(ROOT / "benchmarks" / "worker_allreduce.py"), env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^  worker: first collective done\s+\d+\.\d\d  \S+ rank [01]$", unprefixed(done.stderr), re.M), done.stderr[-3000:]


FALLS_TOGETHER = """
import os, sys, time
marker = sys.argv[1]
if os.environ["LOCAL_RANK"] == "1":
    time.sleep(0.5)
    with open(marker + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    os._exit(3)  # the cause
while not os.path.exists(marker):
    time.sleep(0.001)
with open(marker) as source:
    cause = source.read()
def gone(pid):  # exited: a zombie until its parent reaps it, or reaped
    try:
        with open(f"/proc/{pid}/stat") as source:
            return source.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True
while not gone(cause):  # after its exit, not its marker: a loaded machine can hold it between the two
    time.sleep(0.001)
time.sleep(0.015)
os._exit(4)  # a peer that noticed: milliseconds later, most often within the same 50 ms poll
"""


def test_the_first_failure_named_is_the_first_in_time(tmp_path: Path) -> None:
    """Rank 1 dies, rank 0 follows 15 ms after rank 1's exit: the run names rank 1 (it named the
    lowest rank one poll found dead, rank 0, in 7 of 10 tries: 97% of three). Not closer: under
    load the threads that note each exit wake a few milliseconds late, and not always in order."""
    script = tmp_path / "falls_together.py"
    script.write_text(FALLS_TOGETHER)
    for attempt in range(3):
        done = hpctorch("run", "--nproc-per-node", "2", str(script), str(tmp_path / f"died{attempt}"), env=clean_env(), timeout=120)
        assert done.returncode == 1, done.stderr
        assert "rank 1 (local rank 1) exited with code 3" in done.stderr, done.stderr


@pytest.mark.parametrize("how", [("--nproc-per-node", "2"), ("--simulate-nodes", "2", "--nproc-per-node", "1")],
                         ids=["hpctorch-starter", "torch-agent"])
def test_temporary_logs_nobody_asked_for_are_removed_after_a_success_and_kept_after_a_failure(tmp_path: Path, how) -> None:  # type: ignore[no-untyped-def]
    """Every run without --log-dir left a folder in /tmp (hundreds on a shared login node)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = hpctorch("run", *how, REPORT, env=clean_env(TMPDIR=str(scratch)), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "per-rank logs" not in done.stderr
    assert not [p for p in scratch.iterdir() if p.name.startswith(("hpctorch_", "torchelastic_"))], list(scratch.iterdir())
    failed = hpctorch("run", *how, REPORT, "--exit", "3", env=clean_env(TMPDIR=str(scratch)), timeout=300)
    assert failed.returncode == 1
    logs = re.search(r"per-rank logs: (\S+)", failed.stderr)
    assert logs and Path(logs.group(1)).is_dir(), failed.stderr

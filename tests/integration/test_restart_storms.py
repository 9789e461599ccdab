"""No restart storms, under torch's real agent: attempts in a row that reach no training step
stop the restarts with exit status 4 and one line; attempts that train restart as often as
--max-restarts allows, and the closing goodput says what each restart cost, in words, in the JSON
and drawn (`hpctorch timeline`, rendered by headless Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ..conftest import ROOT, clean_env, hpctorch, require

pytest.importorskip("torch")
REPORT = str(ROOT / "tests" / "fixtures" / "report.py")


def test_attempts_that_never_train_stop_with_their_own_status(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import os, sys\nprint('ATTEMPT', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\nsys.exit(3)\n")
    done = hpctorch("run", "--max-restarts", "10", "--nproc-per-node", "1", str(broken), env=clean_env(), timeout=240)
    assert done.returncode == 4, done.stderr[-3000:]
    assert re.findall(r"ATTEMPT (\d+)", done.stdout) == ["0", "1", "2"], done.stdout  # 3 attempts of the 11 allowed
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("hpctorch: stopped: 3 attempts in a row reached no training step (no collective completed after the process "
                    "group; the last: local rank 0 exited with code 3); restarting or requeueing would fail the same way: fix "
                    "the first error above (exit status 4)"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_attempts_that_train_use_every_restart_and_the_goodput_says_what_each_cost(tmp_path: Path) -> None:
    # Each attempt completes a collective, then its rank 0 fails: 2 attempts without a step would
    # stop the job, these restart as --max-restarts 2 says (3 attempts), then fail as usual.
    summary = tmp_path / "summary.json"
    done = hpctorch("run", "--max-restarts", "2", "--nproc-per-node", "1", "--summary-json", str(summary), REPORT, "--init", "--brief",
                    "--exit", "3", env=clean_env(HPCTORCH_NO_PROGRESS_ATTEMPTS="2"), timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines() if "REPORT " in line]
    assert sorted(r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reports) == ["0", "1", "2"], done.stdout
    assert "reached no training step" not in done.stderr
    # Where the time went: to the first collective, training, each of the 2 restarts, the ending; it adds up.
    goodput = json.loads(summary.read_text())["goodput"]
    assert len(goodput["lost_s"]) == 2 and all(s > 0 for s in goodput["lost_s"]), goodput
    assert goodput["start_s"] > 0 and goodput["training_s"] >= 0
    parts = goodput["start_s"] + goodput["training_s"] + sum(goodput["lost_s"]) + goodput["ending_s"]
    assert abs(parts - goodput["wall_s"]) < 0.01, goodput  # each part rounded to the millisecond
    assert re.search(r"^hpctorch: goodput \d+%: .* lost to 2 restarts \(", done.stderr, re.M), done.stderr[-3000:]
    # And drawn: the page renders in a real browser, with no console message, one row per node,
    # the 3 attempts' training and the 2 ends that restarted.
    drawn = hpctorch("timeline", str(summary), env=clean_env(), timeout=60)
    assert drawn.returncode == 0 and drawn.stderr.startswith(f"hpctorch: timeline of 1 node(s) written to {tmp_path / 'summary.html'}"), drawn.stderr
    dom = rendered(tmp_path / "summary.html")
    assert dom.count('class="row"') == 1 and dom.count('class="training"') == 3 and dom.count('class="failure"') == 2, dom[-3000:]
    assert "goodput" in dom and "lost to 2 restarts" in dom


def rendered(page: Path) -> str:
    """The page's DOM once headless Chromium loaded it; no console message allowed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    require(chromium is not None, "Chromium is not installed (make test installs it: scripts/install-system-deps)")
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=120, env={**clean_env(), "HOME": str(page.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CONSOLE" not in done.stderr, [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    return done.stdout


def test_a_restart_that_the_finished_nodes_cannot_join_ends_the_job_at_once_with_its_cause(tmp_path: Path) -> None:
    # Node 0's rank fails after the first collective while node 1's finish: node 0 asks for a
    # restart, which needs node 1's workers. torch's agent on node 1 waits 300 s in its exit
    # barrier for node 0, which waits in the rendezvous for node 1: the job hung for five
    # minutes. Now node 1 leaves its barrier and closes the rendezvous, and node 0 ends the job
    # with its own failure.
    split = tmp_path / "split.py"
    split.write_text("import os, sys\nimport torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
                     "if os.environ['GROUP_RANK'] == '0':\n    sys.exit(3)\ndist.destroy_process_group()\n")
    done = hpctorch("run", "--simulate-nodes", "2", "--nproc-per-node", "1", "--max-restarts", "1", str(split), env=clean_env(),
                    timeout=200)  # a hang guard, below torch's 300 s exit barrier: it waited that out before
    assert done.returncode == 1, done.stderr[-3000:]
    assert "node 1's workers finished, and another node asks for a restart" in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctorch: node 0: local rank 0 exited with code 3, and no restart could follow"), done.stderr[-3000:]

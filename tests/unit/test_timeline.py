"""hpctorch timeline: a run's summary drawn as one self-contained page (guard.timeline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpctorch.guard.timeline import render

from ..conftest import clean_env

SUMMARY = {
    "exit_code": 0, "wall_s": 100.0, "nodes": ["node1", "node2", "<node3>"], "succeeded": ["node1", "<node3>"],
    "start_s": {"node1": 2.0, "node2": 3.0, "<node3>": 4.0}, "replaced": ["node2"], "failure": None,
    "stragglers_named": [{"line": "straggler: rank 2 (<node3>) computes 3.0x the median step", "first_s": 10, "last_s": 40}],
    "goodput": {"wall_s": 100.0, "start_s": 10.0, "training_s": 70.0, "lost_s": [20.0], "share": 0.7,
                "attempts": [{"first_s": 10.0, "ended_s": 50.0}, {"first_s": 70.0, "ended_s": 100.0}]},
}


def test_a_row_per_node_training_restarts_and_nothing_fetched() -> None:
    page = render(SUMMARY)
    assert page.count('class="row"') == 3
    assert page.count('class="training"') == 4 and page.count('class="failure"') == 2  # 2 kept nodes x 2 attempts, 1 restart each
    assert page.count('class="lost"') == 2 and "left the job to a hot spare" in page
    assert "&lt;node3&gt;" in page and "<node3>" not in page  # names escaped
    assert "goodput 70%: 70.0 s training of 100.0 s; 10.0 s to the first collective; 20.0 s lost to 1 restart" in page
    assert "computes 3.0x the median step" in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # self-contained


def test_a_run_that_never_trained_says_so() -> None:
    page = render({"exit_code": 4, "wall_s": 9.0, "nodes": ["vm"], "start_s": {"vm": 1.0}, "goodput": None,
                   "failure": "stopped: 3 attempts in a row reached no training step"})
    assert "no collective completed: nothing trained" in page and "failed: stopped: 3 attempts" in page


def test_bad_files_are_one_line(tmp_path: Path) -> None:
    def timeline(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hpctorch", "timeline", str(path)], capture_output=True, text=True, env=clean_env(), timeout=60)

    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "other.json").write_text(json.dumps({"some": "thing"}))
    garbled = {**SUMMARY, "goodput": {**SUMMARY["goodput"], "stalls": [{"from_s": "x", "to_s": 2.0}]}}
    (tmp_path / "garbled.json").write_text(json.dumps(garbled))
    for path, said in ((tmp_path / "none.json", "cannot read"), (tmp_path / "text.json", "is not JSON"), (tmp_path / "other.json", "is not an hpctorch summary"),
                       (tmp_path / "garbled.json", "is not an hpctorch summary (could not convert")):
        done = timeline(path)
        assert done.returncode == 2 and done.stderr.startswith("hpctorch: error: ") and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    (tmp_path / "run.json").write_text(json.dumps(SUMMARY))
    done = timeline(tmp_path / "run.json")
    assert done.returncode == 0 and (tmp_path / "run.html").read_text() == render(SUMMARY)


def test_node_0s_start_stages_and_the_stalls_are_drawn() -> None:
    goodput = {**SUMMARY["goodput"], "start_stages": [{"stage": "plan ready", "at_s": 0.5}, {"stage": "environment staged", "at_s": 1.5}],
               "stalls": [{"from_s": 30.0, "to_s": 40.0}], "stalled_s": 10.0}
    page = render({**SUMMARY, "goodput": goodput})
    assert page.count('class="stall"') == 2  # over the training of each kept node's row (not the replaced one's)
    assert "stalled: no rank wrote output from 30.0 s to 40.0 s" in page
    # node1's start: its two stages, then the rest to its workers; the others' start is one bar.
    assert "node1: plan ready at 0.5 s" in page and "node1: environment staged at 1.5 s" in page and "node1: 2.0 s to its workers" in page
    assert page.count('class="start"') == 3 + 2
    assert "10.0 s stalled in training (1 stall)" in page


def test_a_requeued_jobs_whole_goodput_is_said_above_its_last_run() -> None:
    page = render({**SUMMARY, "job": "slurm 63", "job_goodput": {"runs": 3, "wall_s": 200.0, "training_s": 100.0, "share": 0.5}})
    assert "slurm 63 over 3 runs: goodput 50%: 100.0 s training of 200.0 s (this page: the last run)" in page

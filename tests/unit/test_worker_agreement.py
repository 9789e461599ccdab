"""The node's agreement outcome file, as the workers and the supervisor read it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from hpctorch.guard import agreement_worker


def test_the_other_local_ranks_wait_for_local_rank_0s_outcome(tmp_path: Path) -> None:
    result = str(tmp_path / "agreed")
    written = threading.Event()

    def agree() -> None:
        agreement_worker._write(result, "")
        written.set()

    threading.Timer(0.2, agree).start()
    assert agreement_worker._wait(result, 30) == ""  # 30 s: a hang guard
    assert written.is_set()  # it waited for local rank 0's file, not its own timeout
    assert agreement_worker.read(result) is None  # agreed: nothing for the supervisor to say


def test_a_disagreement_reaches_the_supervisor_as_cause_and_fix(tmp_path: Path) -> None:
    result = str(tmp_path / "agreed")
    agreement_worker._write(result, json.dumps({"cause": "the nodes planned different jobs: world size ...", "fix": "start every node alike"}))
    assert agreement_worker.read(result) == {"cause": "the nodes planned different jobs: world size ...", "fix": "start every node alike"}
    assert agreement_worker.read(str(tmp_path / "missing")) is None
    assert not list(tmp_path.glob("*.tmp"))  # written whole, then renamed


def test_a_local_rank_0_that_never_checks_is_named_after_the_wait(tmp_path: Path) -> None:
    outcome = json.loads(agreement_worker._wait(str(tmp_path / "agreed"), 0.1))
    assert "local rank 0 did not check" in outcome["cause"] and "init_process_group" in outcome["fix"]

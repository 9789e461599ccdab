"""Where the time went (guard.goodput): start to the first collective, training per attempt,
lost to each restart; the figures add up to the wall time."""

from __future__ import annotations

import json
from pathlib import Path

from hpctorch.guard.goodput import Attempt, account, first_collective, line


def test_a_run_with_two_restarts_adds_up() -> None:
    # Started at 100; attempt 0 trained from 110 to 150; attempt 1 died at 160 before any
    # collective; attempt 2 trained from 170 to its end at 198; the run ended at 200.
    attempts = [Attempt(150.0, 110.0), Attempt(160.0, None), Attempt(198.0, 170.0)]
    got = account(100.0, 200.0, attempts)
    assert got == {"wall_s": 100.0, "start_s": 10.0, "training_s": 68.0, "lost_s": [10.0, 10.0], "ending_s": 2.0, "share": 0.68,
                   "attempts": [{"first_s": 10.0, "ended_s": 50.0}, {"first_s": None, "ended_s": 60.0}, {"first_s": 70.0, "ended_s": 98.0}]}
    assert got["start_s"] + got["training_s"] + sum(got["lost_s"]) + got["ending_s"] == got["wall_s"]
    assert line(got) == ("hpctorch: goodput 68%: 68.0 s training of 100.0 s; 10.0 s to the first collective; "
                         "20.0 s lost to 2 restarts (10.0 s, 10.0 s)")


def test_attempts_before_the_first_collective_are_start_and_none_at_all_says_nothing() -> None:
    got = account(0.0, 30.0, [Attempt(5.0, None), Attempt(30.0, 12.0)])  # a failure at start, then training
    assert got is not None and got["start_s"] == 12.0 and got["lost_s"] == [] and got["training_s"] == 18.0
    assert line(got) == "hpctorch: goodput 60%: 18.0 s training of 30.0 s; 12.0 s to the first collective"
    assert account(0.0, 10.0, [Attempt(5.0, None), Attempt(10.0, None)]) is None
    assert account(0.0, 10.0, []) is None


def test_the_first_collective_is_the_earliest_of_the_attempts_processes(tmp_path: Path) -> None:
    for local, (pid, first) in enumerate([(11, 5.0), (12, 4.0), (13, None)]):
        (tmp_path / f"{local}.json").write_text(json.dumps({"pid": pid, "first": first}))
    (tmp_path / "notes.txt").write_text("not a rank's")
    assert first_collective(str(tmp_path)) == 4.0
    assert first_collective(str(tmp_path), {11, 13}) == 5.0  # another attempt's rank (12) is not this one's
    assert first_collective(str(tmp_path), {13}) is None and first_collective(None) is None


def test_a_stall_in_training_is_taken_out_of_it_and_the_figures_still_add_up() -> None:
    # Started at 100; trained from 110 to 150 (attempt 0, stalled from 140 to its end), then from
    # 160 to 200, stalled from 170 to 175 (twice over: one stall counts once) and from 190 to the
    # run's end (still open). A stall before the first collective (105-108) is part of the start.
    attempts = [Attempt(150.0, 110.0), Attempt(200.0, 160.0)]
    stages = [("plan ready", 0.2), ("environment staged", 6.0), ("late mark", 99.0)]
    got = account(100.0, 200.0, attempts, stages, [(105.0, 108.0), (140.0, 150.0), (170.0, 175.0), (171.0, 174.0), (190.0, None)])
    assert got is not None and got["stalled_s"] == 25.0 and got["training_s"] == 55.0 and got["lost_s"] == [10.0]
    assert got["start_s"] + got["training_s"] + got["stalled_s"] + sum(got["lost_s"]) == got["wall_s"]  # type: ignore[operator]
    assert got["stalls"] == [{"from_s": 5.0, "to_s": 8.0}, {"from_s": 40.0, "to_s": 50.0}, {"from_s": 70.0, "to_s": 75.0},
                             {"from_s": 90.0, "to_s": 100.0}]
    assert got["start_stages"] == [{"stage": "plan ready", "at_s": 0.2}, {"stage": "environment staged", "at_s": 6.0}]
    assert line(got) == ("hpctorch: goodput 55%: 55.0 s training of 100.0 s; 10.0 s to the first collective (plan ready at 0.2 s, "
                         "environment staged at 6.0 s); 25.0 s stalled in training (4 stalls); 10.0 s lost to 1 restart (10.0 s)")


def test_node_0s_stalls_come_from_its_judge_or_from_the_watch_beside_the_workers() -> None:
    from hpctorch.guard.goodput import stalls_of

    class Alone:
        stalls = [[1.0, 2.0]]

    assert stalls_of({"stalls": {0: [[5.0, None], "garbled"]}}, Alone()) == [[5.0, None]]
    assert stalls_of({"done": {0: True}}, Alone()) == [[1.0, 2.0]]
    assert stalls_of({}) == []

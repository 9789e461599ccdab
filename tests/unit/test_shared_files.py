"""The agreement's and the doctor's shared-file channel: O(1) file-system calls per node and
poll whatever the node count; node 0 alone reads the others', only what is new."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.guard.sharedfiles import BeatingFiles


def rounds(directory: Path, nnodes: int, count: int, files: list[BeatingFiles] | None = None) -> list[BeatingFiles]:
    """``count`` polls of every node: publish (a beat), then read; interval 0: every call acts."""
    files = files or [BeatingFiles(str(directory), n, {"host": f"n{n}"}, interval_s=0) for n in range(nnodes)]
    for _ in range(count):
        for node in files:
            node.publish()
        time.sleep(0.02)  # file times move in the kernel's coarse clock ticks
        for node in files:
            node.read_live()
    return files


def test_a_node_other_than_0_makes_the_same_calls_at_8_and_at_64_nodes(tmp_path: Path) -> None:
    small = rounds(tmp_path / ".hpctorch" / "small.agreement", 8, 4)
    large = rounds(tmp_path / ".hpctorch" / "large.agreement", 64, 4)
    assert {f.operations for f in small[1:]} == {f.operations for f in large[1:]} == {small[1].operations}
    assert small[1].operations == 2 + 2 + 3 + 4  # its folders once, its record once, 3 beats, one read of node 0's file a poll
    assert set(large[0].live) == set(range(1, 64)) and all(set(f.live) == {0} for f in large[1:])
    assert large[5].live[0]["host"] == "n0" and large[0].live[5]["host"] == "n5"


def test_node_0_reads_a_file_only_when_it_was_replaced(tmp_path: Path) -> None:
    directory = tmp_path / ".hpctorch" / "job.agreement"
    files = rounds(directory, 16, 4)
    before = files[0].operations
    files = rounds(directory, 16, 3, files)
    assert files[0].operations - before == 3 + 3  # its own beat and one directory scan a poll: no stat, no read
    files[5].publish(step="checkpointed")
    before = files[0].operations
    rounds(directory, 16, 1, files)
    assert files[0].operations - before == 1 + 1 + 1  # its beat, the scan and the one replaced record
    assert files[0].live[5]["step"] == "checkpointed"


def test_a_file_left_by_an_earlier_run_is_never_counted(tmp_path: Path) -> None:
    directory = tmp_path / ".hpctorch" / "job.agreement"
    directory.mkdir(parents=True, mode=0o700)
    (directory / "node7.json").write_text(json.dumps({"node": 7, "host": "gone"}))
    files = rounds(directory, 4, 4)
    assert 7 not in files[0].live and set(files[0].live) == {1, 2, 3}


def test_node_0_looks_less_often_while_nothing_changes(tmp_path: Path) -> None:
    files = [BeatingFiles(str(tmp_path / ".hpctorch" / "x.agreement"), n, {}, interval_s=0.01) for n in range(3)]
    for _ in range(40):
        for node in files:
            node.publish()
            node.read_live()
        time.sleep(0.02)
    assert files[0]._scan_s > 0.05  # backed off from 0.01 once every peer beat and nothing changed


def test_a_planted_folder_is_refused_before_anything_in_it_is_read(tmp_path: Path) -> None:
    """Another user's records cannot reach a node: the folder must be the user's own and 0700
    before the node writes there or reads a peer's file (``host.folders.private_dir``)."""
    planted = tmp_path / ".hpctorch"
    (planted / "job.doctor").mkdir(parents=True)
    planted.chmod(0o777)  # what a neighbour who made it first would leave
    (planted / "job.doctor" / "node0.json").write_text(json.dumps({"node": 0, "hello": {"serving": False}}))
    node1 = BeatingFiles(str(planted / "job.doctor"), 1, {}, interval_s=0)
    with pytest.raises(HpctorchError, match="can be written by others"):
        node1.publish(hello={"addresses": []})

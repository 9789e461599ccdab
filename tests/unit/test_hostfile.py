"""Host lists in the formats users already have."""

from __future__ import annotations

import pytest

from hpctorch import Options, make_plan
from hpctorch.errors import HpctorchError
from hpctorch.schedulers import hostfile

from .helpers import facts

FORMATS = """
# DeepSpeed / OpenMPI style, MPICH style, bare names
node1 slots=4
node2:2
node3   # no slots
node4 slots=1 max_slots=8
"""


def test_every_format_parses_in_order() -> None:
    assert hostfile.parse(FORMATS, "hosts") == [("node1", 4), ("node2", 2), ("node3", None), ("node4", 1)]


def test_own_index_by_name_short_name_or_address() -> None:
    entries = hostfile.parse("node1 slots=2\nnode2 slots=1\n198.18.0.3 slots=1\n", "hosts")
    by_name = hostfile.allocation(entries, "hosts", "node2.cluster.example", ["10.0.0.2"], {})
    assert (by_name.node_rank, by_name.nodes, by_name.slots_per_node) == (1, ("node1", "node2", "198.18.0.3"), (2, 1, 1))
    by_address = hostfile.allocation(entries, "hosts", "other", ["198.18.0.3"], {})
    assert by_address.node_rank == 2
    by_resolution = hostfile.allocation(entries, "hosts", "x", ["198.18.0.1"], {"node1": ("198.18.0.1",)})
    assert by_resolution.node_rank == 0


def test_slots_give_heterogeneous_ranks_and_every_node_the_same_port() -> None:
    entries = hostfile.parse("node1 slots=2\nnode2 slots=1\n", "hosts")
    a0 = hostfile.allocation(entries, "hosts", "node1", [], {}, "python -u train.py")
    a1 = hostfile.allocation(entries, "hosts", "node2", [], {}, "python -u train.py")
    assert a0.master_port == a1.master_port
    # Another run on the same hosts (another command or --run-id) gets another port.
    other = hostfile.allocation(entries, "hosts", "node1", [], {}, "python -u eval.py")
    assert other.master_port != a0.master_port
    p1 = make_plan(a1, Options(command=("x",)), facts(resolved={"node1": ("198.18.0.1",)}))
    assert (p1.nproc_per_node, p1.world_size, [w.rank for w in p1.workers]) == ((2, 1), 3, [2])
    assert p1.master_addr == "198.18.0.1" and p1.run_id == f"hostfile-{a1.master_port}"


@pytest.mark.parametrize(
    "text, words",
    [("", "names no host"), ("node1\nnode1\n", "twice"), ("node1 slots=x\n", "line 1"), ("a:b\n", "line 1"), ("a gpus=2\n", "unknown key 'gpus'")],
)
def test_bad_host_lists(text: str, words: str) -> None:
    with pytest.raises(HpctorchError, match=words):
        hostfile.parse(text, "hosts")


def test_a_host_not_in_the_list_is_told_so() -> None:
    with pytest.raises(HpctorchError, match=r"this host \(vm\) is not in hosts"):
        hostfile.allocation([("a", None), ("b", None)], "hosts", "vm", ["10.0.0.9"], {})

"""What the user sees while waiting and at the end: progress lines, banner, summary."""

from __future__ import annotations

import io

from hpctorch import Options, make_plan
from hpctorch.guard.agreement import waiting_for
from hpctorch.guard.summary import Summary
from hpctorch.plan.render import banner
from hpctorch.progress import Progress
from hpctorch.schedulers import detect

from .fixtures import load_env
from .helpers import facts


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_every_interval_plain_in_a_log_in_place_on_a_terminal() -> None:
    log, tty = io.StringIO(), Terminal()
    for stream in (log, tty):
        now = [100.0]
        progress = Progress(300, every_s=10, stream=stream, clock=lambda: now[0])
        progress.tick(lambda: "too early")  # nothing before the first interval
        now[0] += 10.5
        progress.tick(lambda: "waiting for 12 of 1,024 nodes (nid[0012-0023])")
        progress.tick(lambda: "again too early")
        now[0] += 10.5
        progress.tick(lambda: None)  # nothing to say: nothing printed
        progress.done()
    assert log.getvalue() == "hpctorch: waiting for 12 of 1,024 nodes (nid[0012-0023]) — 10 s of 300 s\n"
    assert tty.getvalue() == "\r\x1b[Khpctorch: waiting for 12 of 1,024 nodes (nid[0012-0023]) — 10 s of 300 s\n"


def test_node_0_names_the_missing_nodes_as_a_hostlist() -> None:
    env = load_env("slurm/srun_2x1_rank1.env")
    plan = make_plan(detect({**env, "SLURM_NODEID": "0", "SLURM_PROCID": "0"}), Options(command=("x",)),
                     facts(resolved={"node1": ("198.18.0.1",)}))
    assert waiting_for(plan, True, {0: {}}) == "waiting for 1 of 2 nodes (node2)"
    assert waiting_for(plan, True, {0: {}, 1: {}}) is None
    other = make_plan(detect(env), Options(command=("x",)), facts(resolved={"node1": ("198.18.0.1",)}))
    assert waiting_for(other, False, {}).startswith("node 1: waiting to reach node 0's store at 198.18.0.1:")
    assert waiting_for(other, True, {}) is None  # node 0 speaks for the job


def test_the_banner_is_a_few_lines_with_reasons() -> None:
    plan = make_plan(detect(load_env("slurm/srun_2x1_rank1.env")), Options(nproc_per_node=2, command=("x",)),
                     facts(resolved={"node1": ("198.18.0.1",)}))
    lines = banner(plan).splitlines()
    assert len(lines) <= 8, lines
    assert lines[0] == "hpctorch: 2 node(s) (node[1-2]) x 2 = world size 4, slurm job 4"
    assert any(line.split()[:2] == ["mode", "per-node"] and "<-" in line for line in lines)
    assert any(line.split()[:2] == ["interface", "hsn0"] for line in lines)
    assert "RANK=" not in banner(plan)  # no worker environments: those are in hpctorch plan


def test_summary_lines() -> None:
    ok = Summary(0, 12.34, ("node1", "node2"), (0, 1), {0: 2.5, 1: 3.25}, "/tmp/logs", None)
    assert ok.line() == ("hpctorch: finished in 12.3 s, exit 0 on all 2 node(s) (node[1-2]); slowest start: node2 "
                         "(3.2 s to its workers); per-rank logs: /tmp/logs on node1 (each node keeps its own)")
    spared = Summary(0, 20.0, ("node1", "node2"), (0,), {}, None, None, replaced=(1,))
    assert spared.line() == "hpctorch: finished in 20.0 s, exit 0 on node1 and 1 hot spare(s); replaced by a hot spare: node2"
    partly = Summary(0, 9.0, ("node1", "node2", "node3"), (0, 2), {}, None, None)
    assert partly.line() == "hpctorch: finished in 9.0 s, exit 0 on this node; not heard from: node2"
    early = Summary(0, 5.0, ("node1", "node2"), (), {}, None, None)  # over before the watchdog's helpers reached the store
    assert early.line() == ("hpctorch: finished in 5.0 s, exit 0 on this node; the job ended before the watchdog reached the "
                            "other nodes (each node's own line says how it ended)")
    failed = Summary(1, 8.0, ("node1", "node2"), (), {}, None, "rank 3 on node 1 (node2) exited with code 1")
    assert failed.line() == "hpctorch: failed after 8.0 s (exit 1)"  # the failure is the last line, said once


def test_each_line_is_one_write_under_pythonunbuffered() -> None:
    """With PYTHONUNBUFFERED, print writes the text and its newline apart; the ranks of one
    step share one stderr, so their error lines met mid-line (seen under mpiexec in CI)."""
    from hpctorch.cli.main import _whole_lines

    class Recording(io.RawIOBase):
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
            self.writes.append(bytes(data))
            return len(data)

    for whole in (False, True):
        raw = Recording()
        stream = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # as Python sets stderr up unbuffered
        if whole:
            _whole_lines(stream)
        print("hpctorch: error: one; fix: two", file=stream)
        print("second", file=stream)
        if whole:
            assert raw.writes == [b"hpctorch: error: one; fix: two\n", b"second\n"]
        else:
            assert raw.writes[:2] == [b"hpctorch: error: one; fix: two", b"\n"]  # the control

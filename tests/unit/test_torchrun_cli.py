"""Every option of the installed torchrun is accepted by hpctorch run, in both spellings,
with torchrun's meaning (enumerated from torch's own parser: a newer torch's new options
fail here until handled)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from hpctorch.cli.main import _options
from hpctorch.cli.parser import parser as _parser
from hpctorch.cli.torchrun import not_python
from hpctorch.errors import HpctorchError

run = pytest.importorskip("torch.distributed.run")

SAMPLES = {"nnodes": "1:2", "rdzv_endpoint": "node1:29400", "rdzv_conf": "join_timeout=60", "rdzv_backend": "c10d",
           "nproc_per_node": "2", "node_rank": "0", "master_port": "29400", "redirects": "3", "tee": "3",
           "local_ranks_filter": "0,1", "logs_specs": "default", "duplicate_stdout_filters": "a,b",
           "duplicate_stderr_filters": "a,b"}


def torchrun_options() -> list[tuple[str, argparse.Action]]:
    return [(flag, action) for action in run.get_args_parser()._actions for flag in action.option_strings
            if flag not in ("-h", "--help")]


def sample(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[0])]
    if action.dest in SAMPLES:
        return [SAMPLES[action.dest]]
    if action.type is int:
        return ["1"]
    if action.type is float:
        return ["0.5"]
    return ["x"]


def becomes(argv: list[str]) -> tuple[object, str]:
    """What ``hpctorch run ARGV train.py`` becomes: its Options, and torch's logs specs (the
    console and log options reach torch's agent there, not the plan)."""
    from hpctorch import Options, make_plan
    from hpctorch.cli.main import _local_ranks
    from hpctorch.schedulers import local
    from hpctorch.start.launch import _logs_specs

    from .helpers import facts

    args = _parser("run").parse_args(["run", *argv, "train.py"])
    args.argv = []
    plan = make_plan(local.detect({}), Options(command=("x",)), facts())
    return _options(args), repr(_logs_specs(plan, args.log_dir, args.tee, args.redirects, None, _local_ranks(args)))


@pytest.mark.parametrize("flag, action", torchrun_options(), ids=[flag for flag, _ in torchrun_options()])
def test_every_torchrun_option_is_accepted_and_changes_what_runs(flag: str, action: argparse.Action) -> None:
    options, specs = becomes([flag, *sample(action)])
    assert options.command[-1] == "train.py"
    assert (options, specs) != becomes([]), f"{flag} {' '.join(sample(action))} changed neither the options nor torch's logs specs"


def test_torchrun_values_reach_the_plan() -> None:
    args = _parser("run").parse_args(["run", "--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29500",
                                      "--rdzv-id", "job7", "--rdzv-conf", "join_timeout=900,last_call_timeout=5",
                                      "--start-method", "fork", "--monitor-interval", "1", "--numa-binding", "node", "t.py"])
    options = _options(args)
    assert (options.min_nodes, options.nnodes, options.rdzv_backend, options.run_id) == (1, 4, "c10d", "job7")
    assert (options.master_addr, options.master_port, options.master_flag) == ("head", 29500, "--rdzv-endpoint")
    assert options.rdzv_conf == {"join_timeout": "900", "last_call_timeout": "5"}
    assert options.agent == {"start_method": "fork", "monitor_interval": 1.0, "numa_options": "node"}


@pytest.mark.parametrize("argv, words", [
    (["--rdzv-endpoint", "head:notaport"], "--rdzv-endpoint 'head:notaport'"),
    (["--nnodes", "4:2"], "0 < MIN <= MAX"),
    (["--rdzv-backend", "zookeeper"], "invalid choice"),
    (["--rdzv-conf", "join_timeout"], "--rdzv-conf item 'join_timeout'"),
    (["--rdzv-endpoint", "a:1", "--master-addr", "b"], "both name the master"),
])
def test_bad_torchrun_values_are_one_line(argv: list[str], words: str) -> None:
    with pytest.raises(HpctorchError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        _options(_parser("run").parse_args(["run", *argv, "t.py"]))


def test_agent_options_reach_torchs_launch_config() -> None:
    from hpctorch import Options, make_plan
    from hpctorch.schedulers import local
    from hpctorch.start.launch import _launch_config

    from .helpers import facts

    allocation = local.detect({})
    plan = make_plan(allocation, Options(command=("x",), agent={"start_method": "fork", "monitor_interval": 2.0,
                                                                  "numa_options": "node", "role": "trainer"}), facts())
    config = _launch_config(plan, None, True)
    assert (config.start_method, config.monitor_interval, config.role) == ("fork", 2.0, "trainer")
    assert config.numa_options.affinity_mode.value == "node"
    assert "torch's own NUMA binding" in plan.reasons["cpu_bind"] and "HPCTORCH_CPU_SETS" not in plan.common_env


def test_what_python_cannot_run_is_named_and_what_it_can_passes(tmp_path: Path) -> None:
    import py_compile
    import zipapp

    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("print('hi')\n")
    zipapp.create_archive(app, tmp_path / "app.pyz", interpreter="/usr/bin/env python3")
    compiled = py_compile.compile(str(script), cfile=str(tmp_path / "train.pyc"))
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/bash\necho hi\n")
    for runnable in (script, tmp_path / "app.pyz", compiled):
        assert not_python(str(runnable)) is None, runnable
    assert not_python(str(shell)) == "a script for /bin/bash"
    assert not_python(sys.executable) == "a program"

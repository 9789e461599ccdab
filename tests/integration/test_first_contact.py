"""What a new user meets first, run as they would: the real command line, its real output."""

from __future__ import annotations

import re

import pytest

import hpctorch as package

from ..conftest import clean_env, hpctorch


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_names_hpctorch_torch_and_python(flag: str) -> None:
    import torch

    done = hpctorch(flag, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    line = done.stdout.strip()
    assert re.fullmatch(rf"hpctorch {re.escape(package.__version__)} \(\S+\), torch {re.escape(torch.__version__)}, Python \d+\.\d+\.\d+ \(\S+\)", line), line


def test_the_top_level_help_lists_the_version_flag() -> None:
    done = hpctorch("--help", env=clean_env(), timeout=60)
    assert done.returncode == 0 and "--version" in done.stdout


@pytest.mark.parametrize(("typed", "meant"), [("--nproc-per-nod", "--nproc-per-node"), ("--simulate-node=2", "--simulate-nodes=2")])
def test_a_mistyped_option_gets_the_nearest_spelling_and_the_subcommands_help(typed: str, meant: str) -> None:
    args = ("run", typed, "2", "train.py") if "=" not in typed else ("run", typed, "train.py")
    done = hpctorch(*args, env=clean_env(), timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"hpctorch: error: run: unrecognized arguments: {typed}"), line
    assert f"did you mean {meant} for {typed}?" in line and line.endswith("fix: see 'hpctorch run --help'"), line

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

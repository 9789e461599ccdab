"""The script a run names (cli/script): a package folder gets the -m that python would run it by,
from where the user stands, never a dotted absolute path (an earlier '-m .tmp.work.mypkg')."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hpctorch.cli.script import check_script
from hpctorch.errors import HpctorchError


def _fix(script: str) -> str:
    with pytest.raises(HpctorchError) as raised:
        check_script(argparse.Namespace(module=False, script=script))
    return raised.value.fix


def test_a_package_folder_is_named_as_python_m_would_run_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "work" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path / "work")
    assert _fix(str(package)) == "run the package as python -m does: -m mypkg"
    assert _fix("mypkg/") == "run the package as python -m does: -m mypkg"
    monkeypatch.chdir(tmp_path)
    assert _fix("work/mypkg") == "run the package as python -m does: -m work.mypkg"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _fix(str(package)) == (f"run the package as python -m does, from its parent folder: cd {tmp_path / 'work'} and give "
                                  f"-m mypkg (or add {tmp_path / 'work'} to PYTHONPATH)")
    (tmp_path / "work" / "plain").mkdir()
    assert _fix(str(tmp_path / "work" / "plain")) == "give the script's path inside it"

"""The finder a node's start under --stage-env imports with (hpctorch.listed_imports): the same
modules from the same places as Python's own finder, the library's from their cached bytecode,
anything else checked against its source."""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

from hpctorch.listed_imports import wanted

# Modules hpctorch's start imports (a package, its submodules, extensions, a failed import inside copy)
# and the test's own folders: a package, a namespace package, a name in two folders.
SHOW = textwrap.dedent("""
    import sys
    sys.path[1:1] = [FIRST, SECOND]
    if ON:
        from hpctorch import listed_imports
        listed_imports.install()
    import json, tarfile, socket, hashlib, dataclasses, argparse, email.message, xml.dom.minidom
    import pkg.sub, shadow, spaced.inner
    seen = {}
    for name, module in sorted(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.origin not in (None, "built-in", "frozen"):
            seen[name] = [spec.origin, getattr(module, "__file__", None), spec.submodule_search_locations and list(spec.submodule_search_locations),
                          type(spec.loader).__name__]
    try:
        import no_such_module_here
    except ImportError as exc:
        missing = [type(exc).__name__, str(exc), exc.name]
    import importlib.util
    missing.append(importlib.util.find_spec("no_such_module_here"))
    print(json.dumps({"seen": seen, "values": [shadow.VALUE, pkg.sub.VALUE, spaced.inner.VALUE], "missing": missing}))
""")


def _imports(tmp_path: Path, on: bool) -> dict:
    code = SHOW.replace("FIRST", repr(str(tmp_path / "first"))).replace("SECOND", repr(str(tmp_path / "second"))).replace("ON", repr(on))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


def _tree(tmp_path: Path) -> None:
    files = {"first/shadow.py": "VALUE = 'first'\n", "second/shadow.py": "VALUE = 'second'\n",
             "second/pkg/__init__.py": "", "second/pkg/sub.py": "VALUE = 'sub'\n",
             "first/spaced/inner.py": "VALUE = 'inner'\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)


def test_every_module_comes_from_where_pythons_finder_takes_it(tmp_path: Path) -> None:
    _tree(tmp_path)
    plain, listed = _imports(tmp_path, False), _imports(tmp_path, True)
    assert listed["values"] == plain["values"] == ["first", "sub", "inner"]
    # A name no folder has: Python's error, and find_spec's None, not a walk of every folder again.
    assert listed["missing"] == plain["missing"] == ["ModuleNotFoundError", "No module named 'no_such_module_here'", "no_such_module_here", None]
    common = plain["seen"].keys() & listed["seen"].keys()
    assert len(common) > 100 and plain["seen"].keys() - common == set(), plain["seen"].keys() - common
    assert {name: listed["seen"][name][:3] for name in common} == {name: plain["seen"][name][:3] for name in common}
    loaders = {name: value[3] for name, value in listed["seen"].items()}
    # The library's modules imported after the finder: their bytecode alone; the rest Python's check.
    assert loaders["tarfile"] == loaders["json.decoder"] == loaders["email.message"] == "_Bytecode", loaders
    assert loaders["shadow"] == loaders["pkg.sub"] == "SourceFileLoader", loaders
    assert loaders["spaced.inner"] == "SourceFileLoader"  # found by Python: a namespace package is its to place


def test_a_source_outside_the_library_newer_than_its_bytecode_is_compiled_again(tmp_path: Path) -> None:
    _tree(tmp_path)
    source = tmp_path / "first" / "shadow.py"
    py_compile.compile(str(source), doraise=True)
    assert _imports(tmp_path, True)["values"][0] == "first"
    source.write_text("VALUE = 'edited in place'\n")
    assert _imports(tmp_path, True)["values"][0] == "edited in place"


def test_only_run_with_stage_env_takes_it() -> None:
    assert wanted(["hpctorch", "run", "--stage-env", "train.py"])
    assert wanted(["/x/hpctorch/__main__.py", "run", "--nproc-per-node", "2", "--stage-env=try", "train.py"])
    assert not wanted(["hpctorch", "plan", "--stage-env", "train.py"])
    assert not wanted(["hpctorch", "run", "train.py"])
    assert not wanted(["hpctorch"])

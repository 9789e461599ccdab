"""The hot set (``--stage-env``, #42 item 7): a worker running from a copy records what it reads
of it; node 0's later pack carries those files whole and the rest as links to the shared path;
a copy made from it runs the same code, reading the rest there on demand."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import hpctorch
from hpctorch import staged
from hpctorch.stage import hotrecord, hotset, pack, unpack
from hpctorch.stage.node import Staged

SITE = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
WORKER = os.path.join(os.path.dirname(hpctorch.__file__), "_worker.py")
SCRIPT = """
import sys
import hotpkg
assert len(open(hotpkg.DATA, "rb").read()) == 65536
if sys.argv[1:] == ["cold too"]:
    import coldpkg
    assert len(open(coldpkg.DATA, "rb").read()) == 1 << 20
    print("cold", coldpkg.__file__)
print("hot", hotpkg.__file__)
"""


def make_venv(where: Path) -> str:
    """A real venv (no pip) with a package the script reads and one it reads only when asked."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    for name, size in (("hotpkg", 65536), ("coldpkg", 1 << 20)):
        package = where / SITE / name
        package.mkdir()
        (package / "__init__.py").write_text("import os\nDATA = os.path.join(os.path.dirname(__file__), 'data.bin')\n")
        (package / "data.bin").write_bytes(os.urandom(size))
    (where / SITE / "hotpkg" / "notes.txt").write_text("never read\n")
    return os.path.realpath(where)


def receive(made: pack.Pack, copies: Path, key: str, roots: list[str]) -> Staged:
    copies.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies), key, roots, made.size, made.digest)
    found = unpack.copies_of(str(copies), key)
    return Staged(staged.map_with(found, os.path.join(roots[0], "bin", "python")), dict(found), key)


def run(copy: Staged, script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTORCH_", "PYTHON"))}
    copy.export(env)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(hpctorch.__file__))  # hpctorch itself, from the test run
    return subprocess.run([copy.python, "-u", WORKER, str(script), *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_later_pack_carries_what_the_workers_read_and_links_the_rest(tmp_path: Path) -> None:
    roots = [make_venv(tmp_path / "venv")]
    (tmp_path / "stage").mkdir()
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    full = pack.pack(roots, "k", str(tmp_path / "stage"))
    first = receive(full, tmp_path / "node0", "k", roots)
    assert first.records() == str(tmp_path / "node0" / "k" / hotrecord.RECORDS)
    ran = run(first, script)
    assert ran.returncode == 0, ran.stderr
    assert f"hot {tmp_path / 'node0' / 'k' / '0' / SITE / 'hotpkg' / '__init__.py'}" in ran.stdout

    names = hotset.recorded(str(tmp_path / "node0" / "k"))
    assert f"0/{SITE}/hotpkg/data.bin" in names and f"0/{SITE}/hotpkg/__init__.py" in names
    assert not any("coldpkg" in name for name in names), sorted(names)
    hot = hotset.with_sources(names)
    made = pack.pack(roots, "k", str(tmp_path / "stage"), hot=hot)
    # Three links: the folders coldpkg (its 1 MiB and all) and include (empty), and notes.txt, never read, beside hot files.
    assert made.path != full.path and made.linked == 3 and made.size * 5 < full.size
    assert pack.is_kept("k", str(tmp_path / "stage"), hot) and pack.pack(roots, "k", str(tmp_path / "stage"), hot=hot) == made

    later = receive(made, tmp_path / "node1", "k", roots)
    copy = tmp_path / "node1" / "k" / "0"
    assert (copy / SITE / "hotpkg" / "data.bin").is_file() and not (copy / SITE / "hotpkg" / "data.bin").is_symlink()
    assert os.readlink(copy / SITE / "coldpkg") == os.path.join(roots[0], SITE, "coldpkg")
    assert os.readlink(copy / SITE / "hotpkg" / "notes.txt") == os.path.join(roots[0], SITE, "hotpkg", "notes.txt")
    for mended in ("pyvenv.cfg", "bin/activate"):  # what relocation rewrites is always carried whole
        assert not (copy / mended).is_symlink() and str(copy) in (copy / mended).read_text(), mended
    ran = run(later, script, "cold too")
    assert ran.returncode == 0, ran.stderr
    # The cold package is the copy's (a link in it), read from the shared path through the link.
    assert f"cold {copy / SITE / 'coldpkg' / '__init__.py'}" in ran.stdout and f"hot {copy / SITE / 'hotpkg'}" in ran.stdout
    # The cold package read now is in this copy's record: a pack node1 makes as node 0 would carry it.
    assert f"0/{SITE}/coldpkg/data.bin" in hotset.recorded(str(tmp_path / "node1" / "k"))


def test_a_record_names_only_files_inside_the_copy_and_a_copy_keeps_a_few(tmp_path: Path) -> None:
    copy = tmp_path / "k"
    records = copy / hotrecord.RECORDS
    records.mkdir(parents=True, mode=0o700)
    copy.chmod(0o700)
    (records / "a").write_text("0/lib/x.py\n../../etc/passwd\n/etc/shadow\n0/../../x\n1/lib/y.so\nx/y\n0\n")
    assert hotset.recorded(str(copy)) == {"0/lib/x.py", "1/lib/y.so"}
    os.symlink("/etc/passwd", records / "planted")  # a link in the records is not read through
    assert hotset.recorded(str(copy)) == {"0/lib/x.py", "1/lib/y.so"}
    env = {staged.ENV: '{"python": "/x", "roots": {}, "records": "%s"}' % records}
    taken = [hotrecord._free_slot(str(records)) for _ in range(hotrecord.MAX_RECORDS + 1)]
    assert None not in taken[:-1] and taken[-1] is None  # the ranks of a node take one each, never more than there are
    assert hotrecord.install(env) is None  # full: no more records, no hook
    for fd in taken[:-1]:
        os.close(fd)  # type: ignore[arg-type]
    assert hotset.with_sources(["0/p/__pycache__/m.cpython-311.pyc", "0/q.py"]) == {
        "0/p/__pycache__/m.cpython-311.pyc", "0/p/m.py", "0/q.py"}


def test_what_the_copys_mending_rewrites_is_always_carried_whole() -> None:
    assert hotset.forced("0/bin/tool", "/env/bin/tool", ["/env"])
    assert hotset.forced("0/pyvenv.cfg", "/env/pyvenv.cfg", ["/env"])
    assert hotset.forced(f"0/{SITE}/x.pth", f"/env/{SITE}/x.pth", ["/env"])
    assert not hotset.forced(f"0/{SITE}/pkg/pyvenv.cfg", f"/env/{SITE}/pkg/pyvenv.cfg", ["/env"])
    assert not hotset.forced(f"0/{SITE}/pkg/data.bin", f"/env/{SITE}/pkg/data.bin", ["/env"])
    assert hotset.folders_of(["0/a/b/c.py", "1/d"]) == {"0", "0/a", "0/a/b", "1"}


def test_a_program_whose_run_path_names_a_staged_folder_is_carried_whole() -> None:
    binary = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not os.path.isfile(binary):
        pytest.skip("this Python is not built with a shared libpython (its binary has no run path into its prefix)")
    from hpctorch.stage import runpath

    assert runpath.names_inside(binary, [sys.base_prefix])
    assert not runpath.names_inside(binary, ["/somewhere/else"])
    assert not runpath.names_inside(__file__, [sys.base_prefix])  # not ELF

"""--stage-env's parts on real files, sockets and torch's TCPStore: what is copied and its key,
the pack, relocation, the tree that spreads the pack, and the copy each node makes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpctorch import staged
from hpctorch.cli.main import main
from hpctorch.cli.parser import parser, stage_paths
from hpctorch.errors import HpctorchError
from hpctorch.stage import environment, pack, relocate, spread, unpack


def make_env(root: Path, base: Path) -> Path:
    """A venv-shaped folder whose interpreter link and scripts name ``root`` and ``base``."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "pkg").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {base}/bin\nexecutable = {base}/bin/python3.11\ncommand = {base}/bin/python3 -m venv {root}\n")
    (root / "bin" / "tool").write_text(f"#!{root}/bin/python\nprint('hi')\n")
    (root / "bin" / "activate").write_text(f"VIRTUAL_ENV='{root}'\nOTHER={root}2/bin\n")
    (root / "bin" / "tool").chmod(0o755)
    os.symlink(f"{base}/bin/python3", root / "bin" / "python")
    os.symlink("/usr/bin/env", root / "bin" / "outside")
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (site / "inside.pth").write_text(f"{root}/lib/extra\n")
    (site / "__editable__.project.pth").write_text("/home/me/project/src\n")
    (base / "bin").mkdir(parents=True, exist_ok=True)
    (base / "bin" / "python3").write_bytes(b"\x7fELF\0binary naming " + str(base).encode())
    return root


def test_source_takes_the_venv_and_a_base_that_is_not_the_systems(tmp_path: Path) -> None:
    venv, base = tmp_path / "venv", tmp_path / "pyenv"
    make_env(venv, base)
    chosen = environment.source(prefix=str(venv), base_prefix=str(base), executable=str(venv / "bin" / "python"))
    assert chosen.roots == (str(venv), str(base)) or chosen.roots == (str(base), str(venv))
    assert chosen.python == str(venv / "bin" / "python")  # the link's name: its folder holds pyvenv.cfg
    system = environment.source(prefix=str(venv), base_prefix="/usr", executable=str(venv / "bin" / "python"))
    assert system.roots == (str(venv),)
    nested = environment.source([str(venv / "lib")], prefix=str(venv), base_prefix=str(venv), executable="/x/python")
    assert nested.roots == (str(venv),)
    with pytest.raises(HpctorchError, match="no such folder"):
        environment.source([str(tmp_path / "missing")], prefix=str(venv), base_prefix=str(venv))


def make_conda(base: Path) -> Path:
    """A conda installation's layout (conda's docs: ``conda-meta`` records the installed
    packages, ``pkgs`` is the package cache, ``envs`` holds the other environments)."""
    for folder in ("conda-meta", "bin", "lib/python3.11/site-packages/numpy", "pkgs/numpy-1.26.4-py311/info", "envs/other/bin",
                   "envs/mine/conda-meta", "envs/mine/bin", "conda-bld/work"):
        (base / folder).mkdir(parents=True, exist_ok=True)
    (base / "bin" / "python3.11").write_bytes(b"\x7fELF\0")
    (base / "lib" / "python3.11" / "site-packages" / "numpy" / "__init__.py").write_text("")
    (base / "pkgs" / "numpy-1.26.4-py311.conda").write_bytes(b"x" * 4096)
    (base / "envs" / "other" / "bin" / "python3.11").write_bytes(b"\x7fELF\0")
    (base / "envs" / "mine" / "bin" / "python3.11").write_bytes(b"\x7fELF\0")
    return base


def test_of_a_conda_base_only_what_the_staged_python_imports_is_copied(tmp_path: Path) -> None:
    """Staging conda's base environment, a venv on conda's Python, or an env with its base named
    too: the package cache, the build folder and the other environments stay behind."""
    base = make_conda(tmp_path / "conda")
    whole = environment.source(prefix=str(base), base_prefix=str(base), executable=str(base / "bin" / "python3.11"))
    assert whole.roots == (str(base),)
    assert whole.skip == tuple(str(base / name) for name in ("pkgs", "envs", "conda-bld"))
    (tmp_path / "stage").mkdir()
    made = pack.pack(whole.roots, "conda", str(tmp_path / "stage"), whole.skip)
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies_dir), "conda", whole.roots, made.size, made.digest)
    copy = copies_dir / "conda" / "0"
    assert (copy / "lib" / "python3.11" / "site-packages" / "numpy" / "__init__.py").exists()
    assert sorted(p.name for p in copy.iterdir()) == ["bin", "conda-meta", "lib"]
    assert environment.key(whole.roots, whole.skip).files == environment.key([str(copy)]).files

    venv = make_env(tmp_path / "venv", base)
    on_conda = environment.source(prefix=str(venv), base_prefix=str(base), executable=str(venv / "bin" / "python"))
    assert set(on_conda.skip) == {str(base / "lib" / "python3.11" / "site-packages"), *(str(base / n) for n in ("pkgs", "envs", "conda-bld"))}

    mine = environment.source([str(base)], prefix=str(base / "envs" / "mine"), base_prefix=str(base / "envs" / "mine"),
                              executable=str(base / "envs" / "mine" / "bin" / "python3.11"))
    assert mine.roots == (str(base),)
    assert set(mine.skip) == {str(base / "pkgs"), str(base / "envs" / "other"), str(base / "conda-bld")}


def test_the_workers_library_path_names_libpython_alone(tmp_path: Path) -> None:
    """A Python built with --enable-shared finds libpython on the shared path by its RUNPATH, so the
    copy's goes on LD_LIBRARY_PATH; the env's other libraries (conda's libssl, libstdc++) must not
    reach the programs the workers start (git, ssh)."""
    from hpctorch.stage.node import Staged

    venv = make_env(tmp_path / "venv", tmp_path / "base")
    for library in ("libpython3.11.so.1.0", "libpython3.11.so", "libssl.so.3", "libstdc++.so.6"):
        (venv / "lib" / library).write_bytes(library.encode())
    (tmp_path / "stage").mkdir()
    made = pack.pack([str(venv)], "key", str(tmp_path / "stage"))
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies_dir), "key", [str(venv)], made.size, made.digest)
    copies = unpack.copies_of(str(copies_dir), "key")
    env = {"PATH": "/usr/bin"}
    Staged(f"{copies[str(venv)]}/bin/python", dict(copies), "key").export(env)
    folder = Path(env["LD_LIBRARY_PATH"])
    assert sorted(p.name for p in folder.iterdir()) == ["libpython3.11.so", "libpython3.11.so.1.0"]
    assert (folder / "libpython3.11.so.1.0").resolve() == Path(copies[str(venv)]) / "lib" / "libpython3.11.so.1.0"
    assert (folder / "libpython3.11.so.1.0").read_bytes() == b"libpython3.11.so.1.0"
    bare = dict(copies)
    Staged(f"{copies[str(venv)]}/bin/python", {str(tmp_path / "no-libpython"): str(tmp_path / "nowhere")}, "k").export(bare)
    assert "LD_LIBRARY_PATH" not in bare


def test_the_key_changes_with_any_file_and_only_then(tmp_path: Path) -> None:
    venv = make_env(tmp_path / "venv", tmp_path / "base")
    first = environment.key([str(venv)])
    assert environment.key([str(venv)]) == first
    assert first.files >= 8
    init = venv / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py"
    init.write_text("VALUE = 2\n")
    os.utime(init, ns=(0, 12345))
    assert environment.key([str(venv)]).digest != first.digest
    second = environment.key([str(venv)])
    (venv / "bin" / "python").unlink()
    os.symlink("/elsewhere/python3", venv / "bin" / "python")
    assert environment.key([str(venv)]).digest != second.digest


def test_the_key_sees_a_file_replaced_with_the_same_size_and_mtime(tmp_path: Path) -> None:
    """cp -p, rsync -a or an edit within the same second: same size and mtime, new content."""
    venv = make_env(tmp_path / "venv", tmp_path / "base")
    init = venv / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py"
    before = init.stat()
    first = environment.key([str(venv)])
    replacement = tmp_path / "replacement.py"
    replacement.write_text("V" * before.st_size)  # same size, other bytes
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, init)  # what rsync -a does: a new file renamed over the old one
    after = init.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert environment.key([str(venv)]).digest != first.digest
    edited = environment.key([str(venv)])
    with open(init, "r+") as handle:  # in place, the mtime put back: the ctime still moves
        handle.write("W")
    os.utime(init, ns=(after.st_atime_ns, after.st_mtime_ns))
    assert environment.key([str(venv)]).digest != edited.digest


def test_a_pack_is_made_once_and_kept(tmp_path: Path) -> None:
    venv = make_env(tmp_path / "venv", tmp_path / "base")
    base = tmp_path / "stage"
    base.mkdir()
    made = pack.pack([str(venv)], "k1", str(base))
    data = b"".join(made.chunks())
    assert len(data) == made.size and hashlib.sha256(data).hexdigest() == made.digest
    assert os.stat(made.path).st_mode & 0o777 == 0o600
    mtime = os.stat(made.path).st_mtime_ns
    again = pack.pack([str(venv)], "k1", str(base))
    assert again == made and os.stat(made.path).st_mtime_ns >= mtime
    assert not [p for p in (base / "packs").iterdir() if p.name.endswith(".tmp")]


def test_a_pack_has_one_header_a_file_and_the_copy_keeps_each_sources_cache_valid(tmp_path: Path) -> None:
    """No extended header for a fraction of a second (each one parsed again on every node), and
    the copy's mtimes are the originals' whole seconds: what a .pyc records of its source."""
    import py_compile

    venv = make_env(tmp_path / "venv", tmp_path / "base")
    module = venv / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py"
    os.utime(module, ns=(1_700_000_000_750_000_000,) * 2)
    cache = py_compile.compile(str(module), doraise=True)
    (tmp_path / "stage").mkdir()
    made = pack.pack([str(venv)], "k", str(tmp_path / "stage"))
    assert b"PaxHeader" not in Path(made.path).read_bytes()
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies_dir), "k", [str(venv)], made.size, made.digest)
    copy = copies_dir / "k" / "0" / module.relative_to(venv)
    recorded = int.from_bytes(Path(cache).read_bytes()[8:12], "little")  # the source's mtime in the .pyc's header
    assert recorded == int(copy.stat().st_mtime) == 1_700_000_000
    assert copy.read_text() == module.read_text()


def test_a_pack_survives_files_that_go_or_are_replaced_while_it_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python replaces a .pyc by a rename while node 0 packs (2 of 5 packs failed): a file listed
    and gone is left out, a file replaced is packed whole, and the pack still unpacks and checks."""
    import tarfile

    venv = make_env(tmp_path / "venv", tmp_path / "base")
    cache = venv / "lib" / "python3.11" / "site-packages" / "pkg" / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-311.pyc").write_bytes(b"old" * 1000)
    import socket

    with socket.socket(socket.AF_UNIX) as listener:  # a socket left in the environment: skipped, as tar.add does
        listener.bind(str(venv / "lib" / "left.sock"))
    walk = os.walk

    def live_walk(top, *args, **kwargs):  # type: ignore[no-untyped-def]
        for folder, dirs, names in walk(top, *args, **kwargs):
            if folder == str(cache):
                names = [*names, "gone.cpython-311.pyc"]  # listed, then removed before its turn
                replacement = cache / "mod.tmp"
                replacement.write_bytes(b"new" * 2000)
                os.replace(replacement, cache / "mod.cpython-311.pyc")  # replaced after the listing
            yield folder, dirs, names

    monkeypatch.setattr(pack.os, "walk", live_walk)
    base = tmp_path / "stage"
    base.mkdir()
    made = pack.pack([str(venv)], "live", str(base))
    with tarfile.open(made.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert "0/lib/python3.11/site-packages/pkg/__pycache__/gone.cpython-311.pyc" not in members
        packed = tar.extractfile(members["0/lib/python3.11/site-packages/pkg/__pycache__/mod.cpython-311.pyc"])
        assert packed is not None and packed.read() == b"new" * 2000
        assert members["0/bin/python"].issym()  # links stay links
    copies = tmp_path / "copies"
    copies.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies), "live", [str(venv)], made.size, made.digest)
    assert (copies / "live" / "0" / "lib" / "python3.11" / "site-packages" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").read_bytes() == b"new" * 2000


def test_relocation_mends_links_scripts_config_and_pth_files_and_nothing_else(tmp_path: Path) -> None:
    venv, base = make_env(tmp_path / "venv", tmp_path / "base"), tmp_path / "base"
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    (tmp_path / "node0").mkdir()
    made = pack.pack([str(venv), str(base)], "key", str(tmp_path / "node0"))
    unpack.receive(made.chunks(), str(copies_dir), "key", [str(venv), str(base)], made.size, made.digest)
    copy, copy_base = copies_dir / "key" / "0", copies_dir / "key" / "1"
    assert os.readlink(copy / "bin" / "python") == f"{copy_base}/bin/python3"
    assert os.readlink(copy / "bin" / "outside") == "/usr/bin/env"
    assert (copy / "pyvenv.cfg").read_text().startswith(f"home = {copy_base}/bin\n")
    assert (copy / "bin" / "tool").read_text().startswith(f"#!{copy}/bin/python\n")
    assert os.access(copy / "bin" / "tool", os.X_OK)
    assert (copy / "bin" / "activate").read_text() == f"VIRTUAL_ENV='{copy}'\nOTHER={venv}2/bin\n"  # /venv2 is another folder
    site = copy / "lib" / "python3.11" / "site-packages"
    assert (site / "inside.pth").read_text() == f"{copy}/lib/extra\n"
    assert (site / "__editable__.project.pth").read_text() == "/home/me/project/src\n"  # the project stays where it is
    assert str(base).encode() in (copy_base / "bin" / "python3").read_bytes()  # a program is never rewritten
    assert unpack.ready(str(copies_dir), "key")
    assert unpack.copies_of(str(copies_dir), "key") == {str(venv): str(copy), str(base): str(copy_base)}
    assert relocate.relocate({}, str(tmp_path)) == 0


def test_a_damaged_pack_leaves_no_copy(tmp_path: Path) -> None:
    venv = make_env(tmp_path / "venv", tmp_path / "base")
    (tmp_path / "stage").mkdir()
    made = pack.pack([str(venv)], "key", str(tmp_path / "stage"))
    data = bytearray(b"".join(made.chunks()))
    data[700] ^= 0xFF  # inside the first member's header or data
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    with pytest.raises(unpack.UnpackError):
        unpack.receive([bytes(data)], str(copies_dir), "key", [str(venv)], made.size, made.digest)
    with pytest.raises(unpack.UnpackError, match=f" 1000 of {made.size} bytes"):
        unpack.receive([bytes(data[:1000])], str(copies_dir), "key", [str(venv)], made.size, made.digest)
    assert not unpack.ready(str(copies_dir), "key")
    assert list(copies_dir.iterdir()) == []


def test_the_tree_shape() -> None:
    assert spread.children_of(0, 10, 3) == [1, 2, 3]
    assert spread.children_of(3, 10, 3) == []
    assert [spread.parent_of(n, 3) for n in (1, 3, 4, 9)] == [0, 0, 1, 2]
    assert spread.depth_of(1) == 0 and spread.depth_of(5, 4) == 1 and spread.depth_of(6, 4) == 2
    assert spread.depth_of(4096, 4) == 6


def _store(server: bool, port: int = 0):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, None, server, timedelta(seconds=30), wait_for_workers=False, multi_tenant=True)


def _chunked(payload: bytes, size: int = spread.CHUNK) -> list[bytes]:
    return [payload[i:i + size] for i in range(0, len(payload), size)]


def _pack_and_spools_that_fill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, Path, Path]:
    """Node 0's pack (6 chunks) in a file, and a folder for the spools, where every spool's disk
    fills after its first chunk (the nodes that keep bytes for children)."""
    payload = os.urandom(6 * spread.CHUNK)
    pack = tmp_path / "pack"
    pack.write_bytes(payload)
    spools = tmp_path / "spools"
    spools.mkdir()
    append = spread.Spool.append

    def filling(self, data):  # type: ignore[no-untyped-def]
        if self.written >= spread.CHUNK:
            raise OSError(28, "No space left on device")
        return append(self, data)

    monkeypatch.setattr(spread.Spool, "append", filling)
    return payload, pack, spools


def _tree(nnodes: int, fanout: int, payload: bytes, consume_of, spool_dir: Path, deadline_s: float = 60.0,  # type: ignore[no-untyped-def]
          source=None, idle_s: float = spread.IDLE_S, said: dict[int, list[str]] | None = None,
          wrap=lambda store: store) -> tuple[dict[int, str], dict[int, float]]:
    """Every node of a tree as a thread, each through ``wrap`` of its store client; each node's
    error (if any) and when it returned (and in ``said``, the lines each node said)."""
    server = _store(True)
    errors: dict[int, str] = {}
    ended: dict[int, float] = {}
    parts: list[spread.Part] = []  # each serving nodes below it whose parent failed them, until all are done
    deadline = time.monotonic() + deadline_s

    def node(me: int) -> None:
        store = wrap(server if me == 0 else _store(False, server.port))
        given = (source if source is not None else _chunked(payload)) if me == 0 else None
        try:
            parts.append(spread.take_part(store, "t/", me, nnodes, "127.0.0.1", "tok", len(payload), consume_of(me), given, fanout, deadline,
                             idle_s=idle_s, spool_dir=str(spool_dir),
                             say=None if said is None else lambda line: said.setdefault(me, []).append(line)))
        except (spread.SpreadError, ValueError) as exc:
            errors[me] = str(exc)
        ended[me] = time.monotonic() - (deadline - deadline_s)

    threads = [threading.Thread(target=node, args=(n,)) for n in range(nnodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline_s + 120)
    assert not any(thread.is_alive() for thread in threads)
    for part in parts:
        part.close()
    return errors, ended


def _keeping(got: dict[int, bytes], me: int):  # type: ignore[no-untyped-def]
    def consume(chunks) -> None:  # type: ignore[no-untyped-def]
        got[me] = b"".join(chunks)
    return consume


def test_the_tree_brings_every_node_the_same_bytes_and_a_stranger_gets_nothing(tmp_path: Path) -> None:
    payload = os.urandom(3 * spread.CHUNK + 12345)
    nnodes, fanout = 11, 2
    server = _store(True)
    got: dict[int, bytes] = {}
    errors: dict[int, str] = {}

    def node(me: int) -> None:
        store = server if me == 0 else _store(False, server.port)
        source = _chunked(payload, 65536) if me == 0 else None
        try:
            spread.take_part(store, "t/", me, nnodes, "127.0.0.1", "secret", len(payload), _keeping(got, me), source, fanout,
                             time.monotonic() + 60, spool_dir=str(tmp_path)).close()
        except spread.SpreadError as exc:
            errors[me] = str(exc)

    threads = [threading.Thread(target=node, args=(n,)) for n in range(nnodes)]
    for thread in threads:
        thread.start()
    # A stranger that read node 0's address connects with the wrong token: refused, the tree goes on.
    # Its own client: torch's holds one lock per client for a whole wait, and node 0's thread sets
    # the address through the server's (a shared client deadlocked here under load for the 30 s).
    address = spread.wait_for(_store(False, server.port), "t/addr/0", time.monotonic() + 30, "node 0")
    with pytest.raises(spread.SpreadError):
        spread.Upstream(address, "guess", 1, idle_s=5).receive(None, 0, 10, time.monotonic() + 30)
    for thread in threads:
        thread.join(120)
    assert not errors
    assert got == {n: payload for n in range(nnodes)}
    assert os.listdir(tmp_path) == []  # the spools of the nodes with children had no name, and are gone


def test_a_slow_node_keeps_neither_its_sibling_nor_its_child_waiting_and_stops_at_its_deadline(tmp_path: Path) -> None:
    """Node 1 extracts slowly (it takes its first chunk, then waits until both node 2, its sibling,
    and node 3, its child, have every byte, then takes one chunk a second): neither waits on it,
    and its own part ends at its deadline, its child served. Before, node 0 forwarded to node 1
    with a blocking send from its own loop: node 2 and node 3 got nothing more once node 1's
    socket buffers were full."""
    payload = os.urandom(48 * spread.CHUNK)
    got: dict[int, bytes] = {}
    others_done = threading.Event()

    def consume_of(me: int):  # type: ignore[no-untyped-def]
        def slow(chunks) -> None:  # type: ignore[no-untyped-def]
            for index, _chunk in enumerate(chunks):
                if index == 0:
                    assert others_done.wait(120), "node 2 and node 3 waited on node 1"
                time.sleep(1.0)

        def fast(chunks) -> None:  # type: ignore[no-untyped-def]
            got[me] = b"".join(chunks)
            if 2 in got and 3 in got:
                others_done.set()

        return slow if me == 1 else fast

    # Fan-out 2 over 4 nodes: node 0 -> 1, 2; node 1 -> 3.
    errors, ended = _tree(4, 2, payload, consume_of, tmp_path, deadline_s=15.0)
    assert got.get(2) == payload and got.get(3) == payload
    assert set(errors) == {1}, errors
    assert "HPCTORCH_STAGE_TIMEOUT_S" in errors[1] and "ran out" in errors[1]
    assert ended[1] < 15.0 + 30.0  # the deadline bounds its extraction (the limit is for a loaded machine)


def test_a_node_whose_own_copy_fails_still_forwards_every_byte(tmp_path: Path) -> None:
    payload = os.urandom(4 * spread.CHUNK)
    got: dict[int, bytes] = {}

    def consume_of(me: int):  # type: ignore[no-untyped-def]
        def failing(chunks) -> None:  # type: ignore[no-untyped-def]
            next(chunks)
            raise ValueError("no space left on node 1")

        return failing if me == 1 else _keeping(got, me)

    errors, _ = _tree(5, 1, payload, consume_of, tmp_path)  # a chain: 0 -> 1 -> 2 -> 3 -> 4
    assert errors == {1: "no space left on node 1"}
    assert {n: got[n] == payload for n in (0, 2, 3, 4)} == {0: True, 2: True, 3: True, 4: True}


def test_a_relay_whose_children_need_nothing_ends_without_a_stray_thread_error(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 has its copy and its one child has too (it connects, then leaves): node 1 ends while
    its thread still receives from node 0. That thread must end quietly (it met a closed socket on
    the cluster: a traceback in the job's output)."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    payload = os.urandom(24 * spread.CHUNK)
    got: dict[int, bytes] = {}
    errors, _ = _tree(3, 1, payload, lambda me: _keeping(got, me) if me == 0 else None, tmp_path)
    assert not errors and got == {0: payload}
    assert raised == []


def test_a_pack_node_0_cannot_read_fails_every_node_and_each_says_so(tmp_path: Path) -> None:
    payload = os.urandom(4 * spread.CHUNK)

    def source():  # type: ignore[no-untyped-def]
        yield payload[:spread.CHUNK]
        raise OSError("node 0's disk failed")

    errors, _ = _tree(5, 1, payload, lambda me: (lambda chunks: list(chunks)), tmp_path, source=source())
    assert set(errors) == {0, 1, 2, 3, 4}
    assert "node 0 could not read its pack" in errors[0]
    assert all(f"went away after {spread.CHUNK} of {len(payload)} bytes" in errors[n] for n in (1, 2, 3, 4)), errors
    # Each below node 1 asked the nodes above its parent in turn, up to node 0, which had no more.
    assert all(errors[n].endswith("; no node above it could give the rest") for n in (2, 3, 4)), errors


def test_a_node_too_slow_for_its_deadline_is_cut_off_and_its_child_takes_the_pack_from_node_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain 0 -> 1 -> 2 -> 3; node 1 receives at most 1 MiB a second (as a node held to a slice
    of a CPU does), so at its pace it would end past its deadline: node 0 cuts it off once it has
    seen that pace, node 1 says so and looks for no other parent, and node 2 asks node 0 for the
    rest, from the byte it had. Before, node 2 and node 3 went down with node 1 at the deadline."""
    receive = spread.Upstream.receive

    def slow_for_node_1(self, into, got, size, deadline):  # type: ignore[no-untyped-def]
        if self.node == 1:
            time.sleep(1.0)
        return receive(self, into, got, size, deadline)

    monkeypatch.setattr(spread.Upstream, "receive", slow_for_node_1)
    payload = os.urandom(64 * spread.CHUNK)
    got: dict[int, bytes] = {}
    said: dict[int, list[str]] = {}
    errors, ended = _tree(4, 1, payload, lambda me: _keeping(got, me), tmp_path, deadline_s=30.0, said=said)
    assert set(errors) == {1}, errors
    assert errors[1].startswith("cut off by node 0: it took ") and "would not finish within its staging time" in errors[1], errors
    assert {n: got.get(n) == payload for n in (0, 2, 3)} == {0: True, 2: True, 3: True}
    assert 1 not in said and 3 not in said, said
    assert len(said.get(2, [])) == 1 and said[2][0].startswith("takes the pack from node 0 from "), said
    assert max(ended[n] for n in (2, 3)) < 30.0 + 30.0, ended  # within the deadline (the slack is for a loaded machine)


def test_a_middle_node_that_stalls_a_moment_after_keeping_up_is_not_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 (0 -> 1 -> 2) takes 24 MiB at once, then nothing for 7 s (a disk's writeback, a
    pause), then the rest: its last seconds' pace alone would have it end past the deadline, its
    whole transfer's does not; it is not cut, and every node has every byte."""
    receive = spread.Upstream.receive
    stalled = threading.Event()

    def stalling(self, into, got, size, deadline):  # type: ignore[no-untyped-def]
        if self.node == 1 and got >= 24 * spread.CHUNK and not stalled.is_set():
            stalled.set()
            time.sleep(7.0)
        return receive(self, into, got, size, deadline)

    monkeypatch.setattr(spread.Upstream, "receive", stalling)
    payload = os.urandom(64 * spread.CHUNK)
    got: dict[int, bytes] = {}
    errors, _ = _tree(3, 1, payload, lambda me: _keeping(got, me), tmp_path, deadline_s=30.0)
    assert stalled.is_set() and errors == {}, errors
    assert got == {0: payload, 1: payload, 2: payload}


def test_a_cut_record_another_user_planted_is_no_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's store seals its records (authority.SealedStore). A stranger plants node 2's
    ``cut`` record unsealed; when node 1, node 2's parent, cannot keep the bytes (its disk fills),
    node 2 reads no cut from it and takes the pack from node 0."""
    from hpctorch.guard import authority

    seal = authority.Seal(b"the job's secret", "run", "test")
    planted = False

    def sealed(store):  # type: ignore[no-untyped-def]
        nonlocal planted
        if not planted:
            store.set("t/cut/2", "cut off by a stranger")  # unsealed, straight into the store
            planted = True
        return authority.SealedStore(store, seal)

    payload, pack, spools = _pack_and_spools_that_fill(tmp_path, monkeypatch)
    got: dict[int, bytes] = {}
    said: dict[int, list[str]] = {}
    errors, _ = _tree(3, 1, payload, lambda me: _keeping(got, me), spools, source=str(pack), said=said, wrap=sealed)
    assert planted and set(errors) == {1}, errors
    assert got.get(2) == payload and said[2][0].startswith("takes the pack from node 0 from "), (errors, said)


def test_a_slow_leaf_is_never_cut_for_its_pace_only_stopped_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leaf takes the bytes at its extraction's pace, which a moment does not foretell (on the
    cluster a leaf cut for its first seconds' pace would have finished), and no node waits on it:
    node 1, alone below node 0, at 1 MiB a second, runs until its deadline and says that."""
    receive = spread.Upstream.receive

    def slow(self, into, got, size, deadline):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        return receive(self, into, got, size, deadline)

    monkeypatch.setattr(spread.Upstream, "receive", slow)
    payload = os.urandom(24 * spread.CHUNK)
    errors, _ = _tree(2, 1, payload, lambda me: (lambda chunks: list(chunks)), tmp_path, deadline_s=12.0)
    assert set(errors) == {1} and "ran out at" in errors[1] and "cut off" not in errors[1], errors


def test_the_children_of_a_node_that_cannot_keep_the_pack_take_it_from_node_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fan-out 2 over 5 nodes: node 0 -> 1, 2; node 1 -> 3, 4. Node 1's disk fills after its first
    chunk, so it can keep nothing for its children: both ask node 0 for every byte, and only node 1
    fails. Node 0 reads its pack from a file (its spool), node 1 alone keeps one."""
    payload, pack, spools = _pack_and_spools_that_fill(tmp_path, monkeypatch)
    got: dict[int, bytes] = {}
    said: dict[int, list[str]] = {}
    errors, _ = _tree(5, 2, payload, lambda me: _keeping(got, me), spools, source=str(pack), said=said)
    assert set(errors) == {1} and "could not keep the pack for its children: No space left on device" in errors[1], errors
    assert {n: got.get(n) == payload for n in (0, 2, 3, 4)} == {0: True, 2: True, 3: True, 4: True}
    assert sorted(said) == [3, 4] and all(lines[0].startswith("takes the pack from node 0 from ") for lines in said.values()), said


def test_the_staged_interpreter_and_paths() -> None:
    env = {staged.ENV: '{"python": "/l/0/bin/python", "roots": {"/env": "/l/0", "/env/base": "/l/1"}}'}
    assert staged.python(env) == "/l/0/bin/python"
    assert staged.python({}) == sys.executable
    assert staged.map_path("/env/lib/x.py", env) == "/l/0/lib/x.py"
    assert staged.map_path("/env/base/bin", env) == "/l/1/bin"
    assert staged.map_path("/env2/x", env) == "/env2/x"
    assert staged.map_path("/env", {}) == "/env"


def test_stage_env_with_a_folder_is_read_from_hpctorchs_options_only() -> None:
    top = parser("run")
    argv = ["run", "--nproc-per-node", "2", "--stage-env=/opt/libs", "--stage-env=try", "train.py", "--stage-env=mine"]
    args = top.parse_args(stage_paths(top, argv))
    assert args.stage_env == "try" and args.stage_paths == ["/opt/libs"]
    assert top.parse_args(stage_paths(top, ["run", "--stage-env=try", "--stage-env=/opt/libs", "t.py"])).stage_env == "try"
    assert args.script == "train.py" and args.script_args == ["--stage-env=mine"]
    plain = top.parse_args(stage_paths(top, ["run", "--stage-env", "train.py"]))
    assert plain.stage_env == "on" and plain.script == "train.py" and plain.stage_paths == []


def test_bad_stage_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    assert main(["run", "--stage-env", "--stage-dir", str(tmp_path / "nope"), str(script)]) == 2
    assert "--stage-dir" in capsys.readouterr().err
    assert main(["run", f"--stage-env={tmp_path / 'nope'}", str(script)]) == 2
    assert "no such folder" in capsys.readouterr().err
    monkeypatch.setenv("HPCTORCH_STAGE_TIMEOUT_S", "soon")
    assert main(["run", "--stage-env", str(script)]) == 2
    err = capsys.readouterr().err
    assert "HPCTORCH_STAGE_TIMEOUT_S" in err and err.count("\n") == 1
    monkeypatch.delenv("HPCTORCH_STAGE_TIMEOUT_S")
    monkeypatch.setenv("HPCTORCH_STAGE_HOT", "yes")
    assert main(["run", "--stage-env", str(script)]) == 2
    err = capsys.readouterr().err
    assert "HPCTORCH_STAGE_HOT='yes' is neither 0 nor 1" in err and err.count("\n") == 1


def test_scratch_is_local_tmp_unless_tmp_is_a_network_file_system(tmp_path: Path) -> None:
    from hpctorch.host import folders

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\n")
    assert folders.local_scratch(str(mounts)) == "/tmp"
    mounts.write_text("/dev/vda / ext4 rw 0 0\nserver:/tmp /tmp nfs4 rw 0 0\n")
    assert folders.local_scratch(str(mounts)) == ("/dev/shm" if folders.polling_root() else "/tmp")
    assert folders.file_system_of("/tmp/x/y", str(mounts)) == "nfs4"


def test_a_staged_copy_runs_python_from_its_new_place(tmp_path: Path) -> None:
    """A real venv (made here, without pip) staged, and its copy's interpreter started."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (tmp_path / "stage").mkdir()
    roots = [os.path.realpath(venv)]
    made = pack.pack(roots, "v", str(tmp_path / "stage"))
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies_dir), "v", roots, made.size, made.digest)
    python = staged.map_with(unpack.copies_of(str(copies_dir), "v"), os.path.join(roots[0], "bin", "python"))
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(copies_dir / "v" / "0")


def test_the_python_store_client_speaks_with_torchs_own_tcpstore() -> None:
    from datetime import timedelta

    from hpctorch import storeclient

    server = _store(True)
    client = storeclient.connect("127.0.0.1", server.port, 10)
    client.set("a/b", "from python")
    assert server.get("a/b") == b"from python"
    server.set("t", b"from torch")
    assert client.get("t") == b"from torch"
    assert client.add("n", 3) == 3 and server.add("n", 2) == 5 and client.add("n", 0) == 5
    assert client.compare_set("c", "", "first") == b"first" and client.compare_set("c", "", "second") == b"first"
    with pytest.raises(storeclient.StoreError, match="timeout"):
        client.wait(["never"], timedelta(seconds=0.5))
    assert client.add("n", 1) == 6  # the cancelled wait left the connection usable
    threading.Timer(0.3, lambda: server.set("later", "v")).start()
    assert client.get("later") == b"v"
    assert client.check(["a/b", "t"]) and not client.check(["a/b", "never"]) and not client.check(["never"])
    assert client.multi_get(["t", "a/b", "n"]) == [b"from torch", b"from python", b"6"]
    threading.Timer(0.3, lambda: server.set("soon", "s")).start()
    assert client.multi_get(["t", "soon"]) == [b"from torch", b"s"]  # waits for every key first, as torch's does
    # An append has no answer: a request that has one after it on the same connection makes sure
    # the server took it before the other connection's (two connections are not ordered).
    client.append("list", "1,")
    client.check(["list"])
    server.append("list", "2,")
    server.check(["list"])
    client.append("list", "3,")
    assert server.get("list") == b"1,2,3,"
    assert client.delete_key("list") and not client.delete_key("list") and not server.check(["list"])
    assert client.add("n", 0) == 6  # every answer read: the connection is still in step


def test_a_server_that_answers_otherwise_is_a_protocol_mismatch_and_a_missing_one_times_out() -> None:
    import socket as sockets

    from hpctorch import storeclient

    listener = sockets.create_server(("127.0.0.1", 0))

    def answer_wrong() -> None:
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(b"\x00\x00\x00\x00")
        time.sleep(1)
        conn.close()

    threading.Thread(target=answer_wrong, daemon=True).start()
    with pytest.raises(storeclient.ProtocolMismatch):
        storeclient.connect("127.0.0.1", listener.getsockname()[1], 5)
    port = listener.getsockname()[1]
    listener.close()
    started = time.monotonic()
    with pytest.raises(storeclient.StoreError, match="could not reach"):
        storeclient.connect("127.0.0.1", port, 1)
    assert time.monotonic() - started < 30


def test_a_listener_that_never_answers_is_not_handed_to_torchs_client() -> None:
    """It takes the connection and says nothing: torch's own client would wait on it for ever,
    whatever its timeout, so ``open_client`` says so within its own."""
    import socket as sockets

    from hpctorch import storeclient

    with sockets.create_server(("127.0.0.1", 0)) as silent:  # the kernel takes the connection; nobody reads it
        started = time.monotonic()
        with pytest.raises(storeclient.ProtocolMismatch, match="no answer to the handshake within 1 s") as raised:
            storeclient.open_client("127.0.0.1", silent.getsockname()[1], 1)
        assert not raised.value.answered
        assert time.monotonic() - started < 30  # a hang guard only


def test_the_python_client_is_used_only_for_a_torch_that_speaks_its_protocol() -> None:
    import torch

    from hpctorch import storeclient

    assert storeclient.installed_torch() == torch.__version__
    assert storeclient.speaks_with("2.13.0+cpu") and storeclient.speaks_with("2.4.0")
    assert not storeclient.speaks_with("2.3.1") and not storeclient.speaks_with(None) and not storeclient.speaks_with("nightly")


def test_submit_passes_the_staging_options_to_the_run_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    assert main(["submit", "--nodes", "2", "--time", "1:00", "--scheduler", "slurm", "--dry-run", "--stage-env=try",
                 f"--stage-env={tmp_path}", "--stage-dir", "/dev/shm", str(script)]) == 0
    run_line = [line for line in capsys.readouterr().out.splitlines() if "hpctorch run" in line][-1]
    assert f"hpctorch run --stage-env=try --stage-env={tmp_path} --stage-dir /dev/shm {script}" in run_line


def test_a_leaf_that_has_its_copy_takes_no_bytes_and_its_siblings_get_them_all(tmp_path: Path) -> None:
    payload = os.urandom(3 * spread.CHUNK)
    got: dict[int, bytes] = {}
    errors, _ = _tree(3, 2, payload, lambda me: None if me == 2 else _keeping(got, me), tmp_path, idle_s=10)
    assert not errors
    assert got == {0: payload, 1: payload}


def test_what_the_started_processes_inherit(tmp_path: Path) -> None:
    from hpctorch.stage.node import Staged

    copy = tmp_path / "0"
    (copy / "lib").mkdir(parents=True)
    (copy / "lib" / "libpython3.11.so.1.0").write_bytes(b"")
    relocate.link_libpython({"/env": str(copy)}, str(tmp_path))
    env = {"PATH": "/usr/bin", "VIRTUAL_ENV": "/env", "LD_LIBRARY_PATH": "/opt/lib"}
    Staged(f"{copy}/bin/python", {"/env": str(copy)}, "k").export(env)
    assert env["PATH"] == f"{copy}/bin:/usr/bin"
    assert env["LD_LIBRARY_PATH"] == f"{copy}.libpython:/opt/lib"
    assert env["VIRTUAL_ENV"] == str(copy)
    assert staged.python(env) == f"{copy}/bin/python" and staged.pythons(env) == (sys.executable, sys.executable)


def test_the_staged_interpreter_must_lie_inside_the_copy(tmp_path: Path) -> None:
    """A key record naming a program elsewhere (/tmp/evil.sh) would have the node run it."""
    from hpctorch.stage import node

    venv = make_env(tmp_path / "venv", tmp_path / "base")
    (tmp_path / "stage").mkdir()
    made = pack.pack([str(venv)], "key", str(tmp_path / "stage"))
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    unpack.receive(made.chunks(), str(copies_dir), "key", [str(venv)], made.size, made.digest)
    (venv / "bin" / "real").write_text("#!/bin/sh\n")
    (copies_dir / "key" / "0" / "bin" / "real").write_text("#!/bin/sh\n")
    assert node._staged(str(copies_dir), "key", str(venv / "bin" / "real")).python == str(copies_dir / "key" / "0" / "bin" / "real")
    evil = tmp_path / "evil.sh"
    evil.write_text("#!/bin/sh\n")
    for named in (str(evil), str(venv / "bin" / ".." / ".." / "evil.sh"), str(venv / "bin" / "missing")):
        with pytest.raises(node._Problem, match="does not lie inside its copy"):
            node._staged(str(copies_dir), "key", named)



def test_a_pack_whose_members_leave_the_copy_is_refused(tmp_path: Path) -> None:
    """hpctorch's own rules, on every Python (tarfile's "tar" filter checks the same on disk, at a
    dozen lstat calls a member): an absolute name, ../, a file through, onto or as a directory over
    a link to outside, a hard link to outside or to such a link; the copy is never made, nothing
    lands outside or changes there."""
    import io
    import tarfile

    def packed(*members: tuple[str, str, str]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w|") as tar:
            for kind, name, target in members:
                info = tarfile.TarInfo(name)
                if kind == "file":
                    info.size = len(target)
                    tar.addfile(info, io.BytesIO(target.encode()))
                elif kind == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, 0o777
                    tar.addfile(info)
                else:
                    info.type, info.linkname = (tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE), target
                    tar.addfile(info)
        return buffer.getvalue()

    outside = tmp_path / "outside"
    outside.mkdir()
    copies_dir = tmp_path / "copies"
    copies_dir.mkdir(mode=0o700)
    (outside / "kept").write_text("mine")
    outside.chmod(0o755)
    cases = {"absolute": [("file", str(outside / "abs"), "x")], "up": [("file", "0/../../outside/up", "x")],
             "up-and-back": [("sym", "0/away", str(outside)), ("file", "0/away/../away/x", "x")],
             "through-a-link": [("sym", "0/away", str(outside)), ("file", "0/away/through", "x")],
             "onto-a-link": [("sym", "0/kept", str(outside / "kept")), ("file", "0/kept", "overwritten")],
             "dir-over-a-link": [("sym", "0/away", str(outside)), ("dir", "0/away", "")],
             "hard-link": [("hard", "0/h", str(outside / "kept"))],
             "hard-link-to-a-link": [("sym", "0/kept", str(outside / "kept")), ("hard", "0/h", "0/kept")]}
    for case, members in cases.items():
        data = packed(*members)
        with pytest.raises(unpack.UnpackError, match="outside the copy|goes through the link"):
            unpack.receive([data], str(copies_dir), case, [str(tmp_path / "venv")], len(data), hashlib.sha256(data).hexdigest())
        assert sorted(p.name for p in outside.iterdir()) == ["kept"] and (outside / "kept").read_text() == "mine", case
        assert (outside.stat().st_mode & 0o7777, (outside / "kept").stat().st_nlink) == (0o755, 1), case
        assert not unpack.ready(str(copies_dir), case), case
    data = packed(("file", "0/ok", "fine"), ("sym", "0/link", "ok"))
    unpack.receive([data], str(copies_dir), "fine", [str(tmp_path / "venv")], len(data), hashlib.sha256(data).hexdigest())
    assert (copies_dir / "fine" / "0" / "link").read_text() == "fine"


def test_a_run_path_into_a_staged_folder_becomes_the_way_from_the_file() -> None:
    copies = {"/opt/py": "/tmp/c/k/1", "/env": "/tmp/c/k/0"}
    assert relocate.runpath.relative("/opt/py/lib", "/tmp/c/k/1/bin/python3.11", copies) == "$ORIGIN/../lib"
    assert relocate.runpath.relative("/opt/py/lib", "/tmp/c/k/1/lib/libpython3.11.so.1.0", copies) == "$ORIGIN"
    assert relocate.runpath.relative("/opt/py/lib:/usr/lib64:$ORIGIN/x", "/tmp/c/k/1/lib/python3.11/lib-dynload/_ssl.so",
                                     copies) == "$ORIGIN/../..:/usr/lib64:$ORIGIN/x"
    assert relocate.runpath.relative("/opt/python/lib", "/tmp/c/k/1/bin/python3", copies) == "/opt/python/lib"  # not staged


def test_the_copy_of_a_shared_libpython_interpreter_loads_its_own_libpython(tmp_path: Path) -> None:
    """The real interpreter and its libpython, copied and mended as a staged copy is: the copy's
    binary runs with no LD_LIBRARY_PATH, loading the copy's libpython, where before its RUNPATH
    named the original folder (the shared path) and every process looked there first."""
    import sysconfig

    original = Path(sys.base_prefix)
    library = original / "lib" / str(sysconfig.get_config_var("INSTSONAME") or "")
    binary = original / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not library.is_file() or not binary.is_file():
        pytest.skip("this Python is not built with a shared libpython (--enable-shared)")
    top = tmp_path / "unpacked"
    for source in (binary, library):
        target = top / "0" / source.parent.name / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(0o555)  # as a read-only library comes out of a pack
    final = tmp_path / "copies" / "key" / "0"
    relocate.relocate({str(original): str(final)}, str(top))
    final.parent.parent.mkdir()
    top.rename(final.parent)
    copied = final / "bin" / binary.name
    assert os.stat(copied).st_mode & 0o777 == 0o555
    probe = "print(next(line.split()[-1] for line in open('/proc/self/maps') if 'libpython' in line))"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ran = subprocess.run([str(copied), "-c", probe], capture_output=True, text=True, env={**env, "PYTHONHOME": str(original)},
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(final / "lib" / library.name)


BEFORE_THE_COPY = """
import sys
from hpctorch.cli import staging

def stage(args, plan, settings):
    print(" ".join(sorted(sys.modules)))
    raise SystemExit(0)

staging.stage = stage
from hpctorch.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_before_its_copy_a_node_imports_nothing_of_the_start_stage(tmp_path: Path) -> None:
    """Every module imported before a node's copy is adopted is read from the shared file system,
    on every node: the start stage's (the launcher, torch's logging, the workers) come after it."""
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    done = subprocess.run([sys.executable, "-c", BEFORE_THE_COPY, "run", "--stage-env", "--stage-dir", str(tmp_path),
                           "--nproc-per-node", "1", str(script)], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "HPCTORCH_"))})
    assert done.returncode == 0, done.stderr[-2000:]
    imported = set(done.stdout.split())
    assert "hpctorch.cli.main" in imported and "hpctorch.plan.discover" in imported  # the plan was made: staging's turn came
    early = sorted(imported & {"hpctorch.start.launch", "hpctorch.start.workers", "hpctorch.start.simulated", "hpctorch.start.spares",
                               "hpctorch.start.torchlogs", "hpctorch.start.supervisor", "logging", "tempfile", "torch"})
    assert early == [], early

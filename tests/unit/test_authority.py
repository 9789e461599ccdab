"""Records a node acts on are authenticated as this user's same run (guard/authority): a wrong
secret, key, run or endpoint is refused; a MUNGE credential made by another uid, or for another
run, is refused; node 0's secret file must be this user's alone. Real torch TCPStores, a real
munged where it is installed (root: a credential made as another uid)."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hpctorch.guard import authority
from hpctorch.guard.authority import AuthError, Seal
from hpctorch.plan.types import Plan

from ..conftest import require


def _plan(node: int = 0, port: int = 29400, run_id: str = "slurm-42") -> Plan:
    return Plan(mode="per-node", scheduler="slurm", job_id="42", nodes=("n1", "n2"), node_rank=node, nproc_per_node=(1, 1),
                master_addr="127.0.0.1", master_port=port, rdzv_backend="static", rdzv_timeout=60, run_id=run_id, iface="lo",
                simulated=False, max_restarts=0, workers=(), common_env={})


@pytest.fixture
def store() -> Iterator[object]:
    from torch.distributed import TCPStore

    served = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    yield served


@pytest.fixture(autouse=True)
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own secret folder and its own node-0 secrets."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(authority, "_made", {})


def test_a_sealed_value_opens_only_under_its_secret_run_and_key() -> None:
    seal = Seal(b"k" * 32, "slurm-42", "file")
    sealed = seal.seal("hpctorch/x/verdict", "ok")
    assert seal.open("hpctorch/x/verdict", sealed) == b"ok"
    with pytest.raises(AuthError, match="not sealed with this job's secret"):
        Seal(b"j" * 32, "slurm-42", "file").open("hpctorch/x/verdict", sealed)
    with pytest.raises(AuthError, match="not sealed"):
        seal.open("hpctorch/x/pack", sealed)  # moved to another key
    with pytest.raises(AuthError, match="not sealed"):
        Seal(b"k" * 32, "slurm-43", "file").open("hpctorch/x/verdict", sealed)  # replayed from another run
    with pytest.raises(AuthError, match="not sealed"):
        seal.open("hpctorch/x/verdict", sealed[:-2] + b"no")  # the value changed
    with pytest.raises(AuthError, match="carries no hpctorch seal"):
        seal.open("hpctorch/x/verdict", b"ok")


def test_another_node_learns_node_0s_seal_from_the_store_and_checks_every_record(store) -> None:  # type: ignore[no-untyped-def]
    node0 = authority.sealed(store, _plan(0, store.port), 5, serve=True)
    node0.set("hpctorch/slurm-42/stage/pack", '{"digest": "abc"}')
    node1 = authority.sealed(store, _plan(1, store.port), 5, serve=False)
    assert node1.get("hpctorch/slurm-42/stage/pack") == b'{"digest": "abc"}'
    assert node1.compare_set("hpctorch/slurm-42/first", "", "node2: failed") == b"node2: failed"
    assert node0.compare_set("hpctorch/slurm-42/first", "", "node1: failed") == b"node2: failed"  # the first claim stands
    store.set("hpctorch/slurm-42/stage/pack", '{"digest": "evil"}')  # a stranger rewrites it
    with pytest.raises(AuthError, match="carries no hpctorch seal"):
        node1.get("hpctorch/slurm-42/stage/pack")
    assert node1.multi_get(["hpctorch/slurm-42/first"]) == [b"node2: failed"]


def test_a_squatters_store_is_not_node_0(store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The squatter publishes its own record (its own secret file elsewhere): this user's nodes
    read this user's file, find no match, and refuse."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "squatter"))
    authority.publish(store, _plan(0, store.port))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(authority, "_made", {})
    authority._write_secret_file(_plan(0, store.port), os.urandom(32))  # this user's own node 0, elsewhere
    with pytest.raises(AuthError, match="does not match this job's secret file: it is not this job's node 0"):
        authority.verify(store, _plan(1, store.port), 5)


def test_a_record_for_another_endpoint_or_run_is_refused(store) -> None:  # type: ignore[no-untyped-def]
    authority.publish(store, _plan(0, port=29401))  # this job's genuine record, replayed at another port
    with pytest.raises(AuthError, match="does not match"):
        authority.verify(store, _plan(1, store.port), 5)
    with pytest.raises(AuthError, match="no hpctorch authority record within"):
        authority.verify(store, _plan(1, store.port, run_id="slurm-43"), 0.5)


def test_a_secret_file_others_can_read_is_refused(store) -> None:  # type: ignore[no-untyped-def]
    authority.publish(store, _plan(0, store.port))
    os.chmod(authority.secret_path(authority.secret_dirs(_plan())["home"], "slurm-42"), 0o644)
    with pytest.raises(AuthError, match="is not this user's alone"):
        authority.verify(store, _plan(1, store.port), 5)


def test_without_node_0s_record_the_wait_is_bounded(store) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    with pytest.raises(AuthError, match="within 1 s"):
        authority.verify(store, _plan(1, store.port), 1)
    assert time.monotonic() - started < 30  # a hang guard only


@pytest.mark.parametrize("client", ["torch", "hpctorch"])
def test_a_store_that_closes_the_connection_before_its_record_is_no_verdict(client: str) -> None:
    """Node 0's hpctorch hands its port to rank 0's store: a node that connected a moment before
    sees the connection closed while it waits for the record. That says nothing about who serves
    the port (StoreGone, at once, to try again), unlike a store that never shows a record."""
    import threading

    from torch.distributed import TCPStore

    from hpctorch import storeclient

    served = [TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)]
    port = served[0].port
    reached = (TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10)) if client == "torch"
               else storeclient.connect("127.0.0.1", port, 10))
    threading.Timer(0.5, served.clear).start()  # the server goes while the client waits for the record
    started = time.monotonic()
    with pytest.raises(authority.StoreGone, match="closed the connection before its authority record was read"):
        authority.verify(reached, _plan(1, port), 60)
    assert time.monotonic() - started < 30  # not the record's 60 s: the verdict would have waited those out


def test_without_a_writable_home_the_secret_is_kept_in_the_jobs_shared_folder(store, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A container that binds no home (Charliecloud): the submit directory's .hpctorch, which
    every node of the job shares, holds it; the record names the folder, each node derives it."""
    not_a_folder = tmp_path / "home-is-a-file"  # no home to write (root writes through any mode)
    not_a_folder.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(not_a_folder / "state"))
    shared = tmp_path / "submit" / ".hpctorch" / "slurm-42.agreement"
    plans = [replace(_plan(n, store.port), agreement_dir=str(shared)) for n in (0, 1)]
    authority.sealed(store, plans[0], 5, serve=True).set("k", "v")
    assert authority.sealed(store, plans[1], 5, serve=False).get("k") == b"v"
    assert (tmp_path / "submit" / ".hpctorch" / "secrets" / "slurm-42").stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(authority, "_made", {})
    with pytest.raises(AuthError, match="node 0 cannot keep this run's secret: no MUNGE daemon answers"):
        authority.publish(store, _plan(0, store.port))  # no shared folder either


def test_the_munge_socket_is_slurms(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nAuthType=auth/munge\nAuthInfo=ttl=60,socket=/run/site/munge.sock\n")
    assert authority.munge_socket({"SLURM_CONF": str(conf)}) == "/run/site/munge.sock"
    assert authority.munge_socket({"HPCTORCH_MUNGE_SOCKET": "/x", "SLURM_CONF": str(conf)}) == "/x"


@pytest.fixture
def munged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A munged of the test's own, its socket where another uid can reach it (pytest's folders are 0700)."""
    require(shutil.which("munged") is not None and shutil.which("mungekey") is not None, "needs munge (apt install munge)")
    require(os.geteuid() == 0, "needs root: munged runs as root here, and a credential is made as another uid")
    folder = Path(tempfile.mkdtemp(prefix="hpctorch-test-munge-"))
    folder.chmod(0o755)
    key, sock = folder / "munge.key", folder / "munge.socket"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={sock}", f"--pid-file={folder / 'pid'}",
                    f"--log-file={folder / 'log'}", f"--seed-file={folder / 'seed'}"], check=True, capture_output=True, timeout=30)
    monkeypatch.setenv("HPCTORCH_MUNGE_SOCKET", str(sock))
    try:
        yield str(sock)
    finally:
        subprocess.run(["kill", (folder / "pid").read_text().strip()], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def test_munge_carries_the_secret_to_the_same_user_only(store, munged: str) -> None:  # type: ignore[no-untyped-def]
    assert authority.munge_works()
    node0 = authority.sealed(store, _plan(0, store.port), 5, serve=True)
    assert node0.seal_.mechanism == "munge"
    assert not os.path.exists(authority.secret_path(authority.secret_dirs(_plan())["home"], "slurm-42"))  # nothing on disk
    node0.set("hpctorch/slurm-42/verdict", "")
    for _ in range(2):  # a node's second process decodes the same credential: munged says replayed, still this user's
        assert authority.sealed(store, _plan(1, store.port), 5, serve=False).get("hpctorch/slurm-42/verdict") == b""
    with pytest.raises(AuthError, match="made for .*not this run and endpoint"):
        authority.verify(store, _plan(1, store.port + 1), 5)


def test_a_credential_made_by_another_uid_is_refused(store, munged: str) -> None:  # type: ignore[no-untyped-def]
    """Another user's node 0: its credential, restricted to this user's uid so this user can
    decode it, still says who made it."""
    payload = '{"binding": "%s", "secret": "%s"}' % (authority.binding(_plan(1, store.port)), "00" * 32)
    made = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "munge", "--socket", munged,
                           "--restrict-uid", str(os.getuid())], input=payload, capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    store.set(authority.record_key(_plan()), '{"by": "munge", "credential": "%s"}' % made.stdout.strip())
    with pytest.raises(AuthError, match=f"served by another user \\(MUNGE says uid 65534, this job runs as uid {os.getuid()}\\)"):
        authority.verify(store, _plan(1, store.port), 5)



def test_munge_starts_beside_a_thread_that_sets_variables() -> None:
    """The watchdog's thread runs unmunge while the main one may set environment variables: a
    program started with the inherited environment then failed to exec ('Bad address', once on
    the cluster; about a quarter of starts here). Started with a copy of its own, none fails."""
    import threading

    stop = threading.Event()

    def set_variables() -> None:
        number = 0
        while not stop.is_set():
            os.environ[f"HPCTORCH_TEST_STORM_{number % 200}"] = "x" * (number % 64)
            os.environ.pop(f"HPCTORCH_TEST_STORM_{(number * 7) % 200}", None)
            number += 1

    setter = threading.Thread(target=set_variables, daemon=True)
    setter.start()
    try:
        for _ in range(200):
            assert authority._run(["cat"], "same").stdout == "same"  # AuthError ('could not run: Bad address') before
    finally:
        stop.set()
        setter.join(timeout=30)
        for name in [n for n in os.environ if n.startswith("HPCTORCH_TEST_STORM_")]:
            del os.environ[name]

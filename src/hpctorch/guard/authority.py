"""Only this user's job: every record that steers a node is authenticated.

Anyone who reaches node 0's port can read and write torch's TCPStore, and the port is derived
from the job id: another user on node 0 can bind it first and *be* node 0. So node 0 makes a
secret for the run and hands it only to processes of the same user, through what the site
already trusts, and every record a node acts on carries an HMAC-SHA256 of the run, the key and
the value under that secret (``Seal``; ``SealedStore`` seals and checks transparently):

- ``munge``: node 0 puts a MUNGE credential in the store, restricted to its own uid (munge -U),
  whose payload names the run, the master endpoint and the secret. A node accepts it only if
  munged decodes it, says it was made by this node's uid (a credential made by anyone else says
  so), and the payload names this node's run and endpoint (a credential of another run, or
  replayed at another port, does not). Slurm sites run munged on every node.
- ``file``: without a MUNGE daemon, the secret in a 0600 file in this user's own 0700 folder of
  the home directory, which clusters share across nodes (one machine trivially), else of the job's
  shared folder (a container that binds no home): the path is derived from the run id and the
  folder's name, never read from the store; the store holds only a MAC of the binding.

Counters (``add``: beats, arrivals, the watchdog's state) and appended lists are not sealed: a
stranger can make them lie about liveness or stall a run, not make a node run anything or stop
it (the watchdog's abort is sealed, and state without it is ignored). torch's own rendezvous keys
are torch's protocol, outside this (the threat model: docs/threat-model.md).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence

from .. import storeclient
from ..errors import HpctorchError
from ..host.folders import private_dir, read_without_link, replace_file, sweep, why_unsafe
from ..host.processes import own_environment
from ..plan.types import Plan

MAC_HEX = 32
"""128 bits of HMAC-SHA256: forging one is 2^128 tries, each a round trip to the store."""
TAG = b"hpct1:"
MUNGE_TIMEOUT_S = 10.0
MUNGE_TTL_S = 3600
"""A node may read node 0's credential minutes after it was made (staging, a slow start)."""
SECRET_KEPT_S = 7 * 86400.0
"""A run's secret file outlives any job that could still read it (a requeue is a new run)."""
SECRET_TEXT = re.compile(r"[0-9a-f]{64}")


class AuthError(HpctorchError):
    """A record, or node 0 itself, did not authenticate: one line, what was found."""


class StoreGone(AuthError):
    """The store closed the connection before its record was read: no verdict on who serves it.
    Node 0's hpctorch hands its port over to rank 0's store (``start.masterport``), so a node
    that connected a moment before meets a closed connection, and tries again."""


def _lost(exc: BaseException) -> bool:
    """A connection that failed or was closed (torch's DistNetworkError, our client's StoreLost),
    as against a record that did not come in time."""
    return isinstance(exc, (ConnectionError, storeclient.StoreLost)) or type(exc).__name__ == "DistNetworkError"


class Seal:
    """HMAC-SHA256 under the run's secret, over the run id, the key and the value."""

    def __init__(self, secret: bytes, run_id: str, mechanism: str) -> None:
        self._secret, self.run_id, self.mechanism = secret, run_id, mechanism

    def tag(self, key: str, value: bytes) -> bytes:
        body = b"\0".join((self.run_id.encode(), key.encode(), value))
        return hmac.new(self._secret, body, hashlib.sha256).hexdigest()[:MAC_HEX].encode()

    def seal(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else value
        return TAG + self.tag(key, data) + b":" + data

    def open(self, key: str, sealed: bytes) -> bytes:
        """The value, once its tag checks; else AuthError naming the key."""
        if not sealed.startswith(TAG) or len(sealed) < len(TAG) + MAC_HEX + 1:
            raise AuthError(f"the record {key} in node 0's store carries no hpctorch seal: someone other than this job wrote it",
                            _FIX)
        tag, data = sealed[len(TAG):len(TAG) + MAC_HEX], sealed[len(TAG) + MAC_HEX + 1:]
        if not hmac.compare_digest(tag, self.tag(key, data)):
            raise AuthError(f"the record {key} in node 0's store is not sealed with this job's secret: someone other than this "
                            "job wrote it", _FIX)
        return data


_FIX = ("if another user shares these nodes, ask them to stop; hpctorch starts no worker on records it cannot "
        "authenticate (see 'Only your own job' in docs/threat-model.md)")


class SealedStore:
    """A store whose values are sealed on the way in and checked on the way out; counters,
    appends, checks and waits pass through."""

    def __init__(self, store, seal: Seal) -> None:  # type: ignore[no-untyped-def]
        self.store, self.seal_ = store, seal

    def set(self, key: str, value: str | bytes) -> None:
        self.store.set(key, self.seal_.seal(key, value))

    def get(self, key: str) -> bytes:
        return self.seal_.open(key, bytes(self.store.get(key)))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [self.seal_.open(key, bytes(value)) for key, value in zip(keys, self.store.multi_get(list(keys)))]

    def get_plain(self, key: str) -> bytes:
        """An appended list's or a counter's value: never sealed."""
        return bytes(self.store.get(key))

    def opened(self, keys: Sequence[str]) -> list[bytes | None]:
        """``multi_get``, with None for each value that does not check (one planted record
        must not hide the others)."""
        values: list[bytes | None] = []
        for key, value in zip(keys, self.store.multi_get(list(keys))):
            try:
                values.append(self.seal_.open(key, bytes(value)))
            except AuthError:
                values.append(None)
        return values

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """``expected`` "" means unset, as in torch; the value now there, checked."""
        sealed_expected = self.seal_.seal(key, expected) if expected not in ("", b"") else expected
        now = bytes(self.store.compare_set(key, sealed_expected, self.seal_.seal(key, desired)))
        return self.seal_.open(key, now)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.store, name)


def plain(store):  # type: ignore[no-untyped-def]
    """The store under a seal, for what is never sealed: appended lists, counters."""
    return store.store if isinstance(store, SealedStore) else store


# ---- the secret --------------------------------------------------------------------------

_made: dict[str, Seal] = {}
SECRET_FILE_ENV = "HPCTORCH_RUN_SECRET_FILE"
"""In node 0's rank 0 when hpctorch on its node served the store first (``start.masterport``): a
0600 file of the node's private folder with the run's secret, so both serve under one seal."""


def node0_seal(run_id: str) -> Seal:
    """Node 0's seal for ``run_id``, made once per process (every store this process serves in
    this run shares it), or the one hpctorch on this node handed over (``SECRET_FILE_ENV``)."""
    if run_id not in _made:
        import secrets  # node 0 alone makes a secret: the others import nothing they do not need before their copy

        handed = os.environ.get(SECRET_FILE_ENV)
        secret = _handed_secret(handed) if handed else None
        _made[run_id] = Seal(secret or secrets.token_bytes(32), run_id, "munge" if munge_works() else "file")
    return _made[run_id]


def hand_secret(run_id: str, path: str) -> None:
    """Node 0's hpctorch: this run's secret for its rank 0, in a 0600 file at ``path``."""
    replace_file(path, node0_seal(run_id)._secret.hex())


def _handed_secret(path: str) -> bytes | None:
    """The secret in ``path`` if it is this user's alone and holds one; else None (a new one is made)."""
    try:
        facts, text = read_without_link(path)
    except OSError:
        return None
    if facts.st_uid != os.getuid() or facts.st_mode & 0o077 or not SECRET_TEXT.fullmatch(text.strip()):
        return None
    return bytes.fromhex(text.strip())


def binding(plan: Plan) -> str:
    """What a node-0 record is valid for: this run, this master endpoint, this user."""
    return f"{plan.run_id}|{plan.master_addr}:{plan.master_port}|{os.getuid()}"


def _binding_mac(secret: bytes, bound: str) -> str:
    return hmac.new(secret, bound.encode(), hashlib.sha256).hexdigest()


def record_key(plan: Plan) -> str:
    return f"hpctorch/{plan.run_id}/authority"


def publish(store, plan: Plan) -> Seal:  # type: ignore[no-untyped-def]
    """Node 0: the record by which the others authenticate this store; the seal to use."""
    seal = node0_seal(plan.run_id)
    bound = binding(plan)
    if seal.mechanism == "munge":
        payload = json.dumps({"binding": bound, "secret": seal._secret.hex()})
        token = {"by": "munge", "credential": munge_encode(payload)}
    else:
        token = {"by": "file", "in": _write_secret_file(plan, seal._secret),
                 "mac": _binding_mac(seal._secret, bound)}
    store.set(record_key(plan), json.dumps(token))
    return seal


def verify(store, plan: Plan, timeout_s: float) -> Seal:  # type: ignore[no-untyped-def]
    """Another node: node 0's record, authenticated, gives the seal; else AuthError in one line."""
    key = record_key(plan)
    where = f"{plan.master_addr}:{plan.master_port}"
    try:
        store.wait([key], datetime.timedelta(seconds=max(0.1, timeout_s)))
        token = json.loads(bytes(store.get(key)))
    except (ValueError, TypeError):
        raise AuthError(f"node 0's store at {where} holds no readable hpctorch authority record", _FIX) from None
    except Exception as exc:  # noqa: BLE001 - torch's and our client's timeouts differ in kind
        if _lost(exc):
            raise StoreGone(f"node 0's store at {where} closed the connection before its authority record was read "
                            f"({first_line(exc)})", "try again: the store may be moving to rank 0's process") from None
        raise AuthError(f"the store at {where} gave no hpctorch authority record within {timeout_s:.0f} s "
                        f"({first_line(exc)}): it is not this job's node 0",
                        _FIX) from None
    bound = binding(plan)
    by = token.get("by") if isinstance(token, dict) else None
    if by == "munge":
        seal = _accept_munge(str(token.get("credential", "")), bound, plan.run_id, where)
    elif by == "file":
        secret = _read_secret_file(plan, str(token.get("in", "home")), timeout_s, where)
        if not hmac.compare_digest(str(token.get("mac", "")), _binding_mac(secret, bound)):
            raise AuthError(f"the authority record at {where} does not match this job's secret file: it is not this job's "
                            "node 0", _FIX)
        seal = Seal(secret, plan.run_id, "file")
    else:
        raise AuthError(f"the authority record at {where} names no known mechanism ({by!r})", _FIX)
    return seal


def run_seal(store, plan: Plan, timeout_s: float) -> Seal:  # type: ignore[no-untyped-def]
    """This run's seal in this process: node 0's own where it was made here, else node 0's
    record in ``store`` authenticated."""
    made = _made.get(plan.run_id)
    return made if made is not None else verify(store, plan, timeout_s)


def first_line(exc: BaseException) -> str:
    """An exception's first line, or its kind where it says nothing (torch's store errors run to C++ traces)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def sealed(store, plan: Plan, timeout_s: float, serve: bool) -> SealedStore:  # type: ignore[no-untyped-def]
    """``store`` with this run's seal: published here when this node serves it, else checked."""
    seal = publish(store, plan) if serve else verify(store, plan, timeout_s)
    return SealedStore(store, seal)


# ---- MUNGE -------------------------------------------------------------------------------

def munge_socket(env: Mapping[str, str] | None = None) -> str | None:
    """The socket Slurm talks to munged through (slurm.conf's AuthInfo socket=), else munge's default."""
    env = os.environ if env is None else env
    if env.get("HPCTORCH_MUNGE_SOCKET"):
        return env["HPCTORCH_MUNGE_SOCKET"]
    for conf in (env.get("SLURM_CONF"), "/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"):
        if not conf:
            continue
        try:
            with open(conf, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    found = re.match(r"\s*AuthInfo\s*=\s*(\S+)", line, re.I)
                    socket_opt = re.search(r"(?:^|,)socket=([^,\s]+)", found.group(1)) if found else None
                    if socket_opt:
                        return socket_opt.group(1)
        except OSError:
            continue
        break
    return None


def _munge_argv(tool: str) -> list[str] | None:
    path = shutil.which(tool)
    if path is None:
        return None
    socket_path = munge_socket()
    return [path, *(["--socket", socket_path] if socket_path else [])]


def munge_works() -> bool:
    """Whether munged answers here (a credential made and decoded within a few seconds)."""
    try:
        munge_decode(munge_encode("probe"))
    except (AuthError, HpctorchError):
        return False
    return True


def munge_encode(payload: str) -> str:
    argv = _munge_argv("munge")
    if argv is None:
        raise AuthError("munge is not installed on this node", _FIX)
    done = _run([*argv, "--restrict-uid", str(os.getuid()), "--ttl", str(MUNGE_TTL_S)], payload)
    if done.returncode != 0:
        raise AuthError(f"munge could not make a credential: {done.stderr.strip().splitlines()[-1:] or '?'}", _FIX)
    return done.stdout.strip()


def munge_decode(credential: str, where: str = "this node") -> tuple[dict[str, str], str]:
    """(metadata, payload) of a credential munged accepts. A replayed one is accepted: this
    host decoded it before (several processes of one node do); the payload's binding, not
    munged's replay cache, ties a credential to one run and one endpoint."""
    argv = _munge_argv("unmunge")
    if argv is None:
        raise AuthError("unmunge is not installed on this node, so node 0's MUNGE credential cannot be checked", _FIX)
    done = _run(argv, credential)
    if "Unauthorized credential" in done.stderr:  # restricted to its maker's uid: made by someone else
        raise AuthError(f"the store at {where} is served by another user: its MUNGE credential is restricted to a uid other than "
                        f"this job's ({os.getuid()})", _FIX)
    head, _, payload = done.stdout.partition("\n\n")
    meta = dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in head.splitlines()) if k.strip())
    status = meta.get("STATUS", "")
    if done.returncode not in (0, 17) or not status.startswith(("Success", "Replayed")):
        raise AuthError(f"munged rejected node 0's credential ({status or done.stderr.strip() or 'no answer'})", _FIX)
    return meta, payload


def _accept_munge(credential: str, bound: str, run_id: str, where: str) -> Seal:
    meta, payload = munge_decode(credential, where)
    uid = re.search(r"\((\d+)\)", meta.get("UID", ""))
    if uid is None or int(uid.group(1)) != os.getuid():
        raise AuthError(f"the store at {where} is served by another user (MUNGE says uid {uid.group(1) if uid else '?'}, "
                        f"this job runs as uid {os.getuid()}): it is not this job's node 0", _FIX)
    try:
        said = json.loads(payload)
        secret = bytes.fromhex(said["secret"])
    except (ValueError, KeyError, TypeError):
        raise AuthError(f"node 0's credential at {where} carries no readable payload", _FIX) from None
    if said.get("binding") != bound:
        raise AuthError(f"node 0's credential at {where} was made for {said.get('binding')!r}, not this run and endpoint "
                        f"({bound!r}): a record replayed from another job or port", _FIX)
    return Seal(secret, run_id, "munge")


def _run(argv: list[str], stdin: str) -> subprocess.CompletedProcess:
    try:
        # From the watchdog's thread too: with an environment of its own (own_environment says why).
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=MUNGE_TIMEOUT_S, env=own_environment())
    except subprocess.TimeoutExpired:
        raise AuthError(f"{os.path.basename(argv[0])} did not answer within {MUNGE_TIMEOUT_S:.0f} s (is munged running?)",
                        _FIX) from None
    except OSError as exc:
        raise AuthError(f"{argv[0]} could not run: {exc.strerror or exc}", _FIX) from None


# ---- the secret file: the shared home, else the job's shared folder ---------------------------

def secret_dirs(plan: Plan) -> dict[str, str]:
    """Where node 0 may keep the run's secret, by name, in order: this user's state folder in the
    home directory (clusters share it), else the job's shared folder (the submit directory's
    .hpctorch, where a container binds no home). Each node derives the path itself."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    dirs = {"home": os.path.join(state, "hpctorch", "job-secrets")}
    if plan.agreement_dir:
        dirs["shared"] = os.path.join(os.path.dirname(plan.agreement_dir), "secrets")
    return dirs


def secret_path(folder: str, run_id: str) -> str:
    return os.path.join(folder, re.sub(r"[^A-Za-z0-9._-]", "_", run_id))


def _write_secret_file(plan: Plan, secret: bytes) -> str:
    """The secret in the first of ``secret_dirs`` this user can write; the name of that folder."""
    reasons = []
    for name, folder in secret_dirs(plan).items():
        try:
            os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
            private_dir(folder)
            replace_file(secret_path(folder, plan.run_id), secret.hex())  # a rerun of the same run id replaces the earlier one
        except (OSError, HpctorchError) as exc:
            reasons.append(f"{folder}: {getattr(exc, 'strerror', None) or exc}")
            continue
        sweep(folder, ("",), SECRET_KEPT_S)  # earlier runs' secrets, once per run by node 0
        return name
    raise AuthError(f"node 0 cannot keep this run's secret: no MUNGE daemon answers, and no folder for it is writable "
                    f"({'; '.join(reasons)})", "run munged (Slurm sites do), or give the nodes a shared, writable home or "
                    "submit directory (--rendezvous-dir)")


def _read_secret_file(plan: Plan, name: str, timeout_s: float, where: str) -> bytes:
    """The secret node 0 wrote in its folder ``name``, once the shared file system shows it."""
    folder = secret_dirs(plan).get(name)
    if folder is None:
        raise AuthError(f"the authority record at {where} names a secret folder this node does not have ({name!r})", _FIX)
    path = secret_path(folder, plan.run_id)
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while True:
        unsafe = why_unsafe(folder) if os.path.lexists(folder) else None
        if unsafe:
            raise AuthError(f"this job's secret folder {folder} cannot be trusted: {unsafe}", _FIX)
        try:
            facts, text = read_without_link(path)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise AuthError(f"node 0 at {where} is not authenticated: no MUNGE credential, and its secret file {path} did "
                                f"not appear within {timeout_s:.0f} s", "share the home directory between the nodes, or run "
                                "munged (Slurm sites do)") from None
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)
            continue
        if facts.st_uid != os.getuid() or facts.st_mode & 0o077:
            raise AuthError(f"this job's secret file {path} is not this user's alone (owner uid {facts.st_uid}, mode "
                            f"{facts.st_mode & 0o777:o})", _FIX)
        if SECRET_TEXT.fullmatch(text.strip()):
            return bytes.fromhex(text.strip())
        if time.monotonic() >= deadline:
            raise AuthError(f"this job's secret file {path} holds no secret", _FIX)
        time.sleep(pause)  # being replaced this moment

"""hpctorch's private folders on this node: where stack dumps, faulthandler files, the
per-task relay and the node's polling files live.

/tmp, /dev/shm and TMPDIR are shared with every user of the machine, and the folders'
names are predictable (``hpctorch-<uid>``): another user can create one first, or put a
symbolic link there, and so feed this user's job a master address or a library. So a
folder is used only once ``private_dir`` has created it 0700 or found it, without following
links, to be a real folder of this user's that no one else can write; anything else is one
line naming the folder, and never used.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time

from ..errors import HpctorchError
from .processes import alive


def stack_file(directory: str, pid: int) -> str:
    """A worker's faulthandler file: named by host and pid, so two nodes' pid 4242 never
    share one where the folder is on a shared file system."""
    return os.path.join(directory, f"{_host()}-{pid}.stack")


RANK_KEYS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS")
"""What ``rank_file`` holds: every variable a standby's start lacks (``start.standby.RANK_VARS``),
and its local rank (its zygote's environment is local rank 0's): ``hpctorch stacks`` finds the
job's nodes and store by them."""


def rank_file(directory: str, pid: int) -> str:
    """Beside a worker's faulthandler file: its rank variables, written by a worker that was a
    warm standby (its /proc/PID/environ is the one it was started with, before its attempt)."""
    return os.path.join(directory, f"{_host()}-{pid}.rank")


def node_dir() -> str:
    """hpctorch's folder for this user on this node (a path only: ``private_dir`` makes it):
    under ``polling_root``, whatever TMPDIR says (some sites point it at a shared scratch file
    system, where two nodes' files would meet), else in the temporary directory. It holds the
    per-task relay, workers' faulthandler files, stack dumps, the one-machine file store and
    the MPICH library name bridge."""
    import tempfile

    return os.path.join(polling_root() or tempfile.gettempdir(), f"hpctorch-{_user()}")


def polling_root() -> str | None:
    """Where a node's own processes meet through files they poll every few milliseconds:
    /dev/shm, in memory and on this node whatever TMPDIR says (some sites point it at a shared
    scratch file system), where it is there and writable; else None (the temporary directory)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def private_dir(path: str) -> str:
    """``path``, created 0700 if missing, or checked if there: a folder, not a link, owned by
    this user, writable by no one else. A folder of ours readable by others is narrowed to
    0700. Anything else: HpctorchError."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:  # a parent that is not one of ours (a TMPDIR not made yet)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return private_dir(path)
    unsafe = why_unsafe(path)
    if unsafe:
        raise HpctorchError(f"hpctorch's folder {path} {unsafe}",
                            "remove it (ask an administrator if another user made it): hpctorch never uses a folder that someone "
                            "else could have prepared")
    if hasattr(os, "getuid") and stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def why_unsafe(path: str) -> str | None:
    """Why ``path`` must not be trusted (read from, written to, put on a search path), or
    None. Looked at without following links."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "is missing"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if not hasattr(os, "getuid"):
        return None  # Windows: the per-user temporary directory is the user's own
    if info.st_uid != os.getuid():
        return f"belongs to {_owner(info.st_uid)}, not to you"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def create_private_file(path: str) -> int:
    """A new file only this user can read, never through a link (O_EXCL, O_NOFOLLOW): its fd."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)


def read_without_link(path: str) -> tuple[os.stat_result, str]:
    """A file's owner and mode, and its text, read without following a link (OSError else)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, encoding="utf-8") as handle:
        return os.fstat(handle.fileno()), handle.read()


def replace_file(path: str, text: str) -> None:
    """``path`` replaced whole: a new file (0600, never through a link) renamed over it, so a
    reader sees the old text or the new one, never a part."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        os.remove(temporary)  # a crashed writer's with the same pid: the folder is ours
    except FileNotFoundError:
        pass
    with open(create_private_file(temporary), "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, path)


def sweep(folder: str, suffixes: tuple[str, ...], max_age_s: float, prefix: str = "") -> None:
    """Remove what earlier runs left in ``folder`` (one of ours): entries named ``prefix...suffix``
    untouched for ``max_age_s``, files or folders. One directory scan; errors are ignored (a
    neighbouring node may sweep the same shared folder at the same time)."""
    import shutil

    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(suffixes)):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime <= max_age_s:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.remove(entry.path)
        except OSError:
            pass


def faulthandler_dir() -> str:
    """Where workers' faulthandler files go (``HPCTORCH_STACKS_DIR``): node-local memory
    where there is /dev/shm (never a shared TMPDIR); created here, and this host's files of
    processes that are gone (killed before they could remove their own) removed. Another
    node's files are never touched."""
    path = private_dir(os.path.join(private_dir(node_dir()), "faulthandler"))
    mine = f"{_host()}-"
    for name in os.listdir(path):
        pid = name.removeprefix(mine).removesuffix(".stack")
        if name.startswith(mine) and pid.isdigit() and not alive(int(pid)):
            try:
                os.remove(os.path.join(path, name))
            except OSError:
                pass
    return path



def stragglers_dir(run_id: str, node_rank: int) -> str:
    """Where a node's workers leave their time inside collectives for its watchdog
    (``HPCTORCH_STRAGGLERS_DIR``): node-local memory, one folder per run and node (the nodes of a
    one-machine test share the machine), created here; other runs' folders older than a day are
    swept."""
    parent = private_dir(os.path.join(private_dir(node_dir()), "stragglers"))
    sweep(parent, ("",), 86400.0)
    return private_dir(os.path.join(parent, f"{_safe(run_id)}-{node_rank}"))


NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "fuse.sshfs", "panfs", "wekafs",
                        "fuse.glusterfs", "9p", "virtiofs")
"""File systems other machines reach: a copy "on this node" there would be one more shared copy."""


def local_scratch(mounts: str = "/proc/mounts") -> str:
    """Node-local storage for a staged environment: /tmp where it is local, else /dev/shm."""
    return "/dev/shm" if file_system_of("/tmp", mounts) in NETWORK_FILE_SYSTEMS and polling_root() else "/tmp"


def file_system_of(path: str, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system ``path`` lies on (the longest mount point above it), if known."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def stage_dir(root: str) -> str:
    """This user's folder for staged environments under ``root`` (``--stage-dir``), one per host:
    a folder given on a shared file system, or a one-machine test's shared /tmp, never mixes two
    nodes' copies. Created 0700 at each level, or checked."""
    mine = private_dir(os.path.join(root, f"hpctorch-stage-{_user()}"))
    return private_dir(os.path.join(mine, _host()))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "run"


def _user() -> str:
    return str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"

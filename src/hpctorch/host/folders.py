"""hpctorch's private folders on this node: where stack dumps, faulthandler files, the
per-task relay and the node's polling files live."""

from __future__ import annotations

import os


def stack_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.stack")


def dump_dir() -> str:
    """hpctorch's private directory for this user on this node (stack files, the file
    rendezvous on one machine, the MPICH library name bridge)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"hpctorch-{_user()}")


def polling_root() -> str | None:
    """Where a node's own processes meet through files they poll every few milliseconds:
    /dev/shm, in memory and on this node whatever TMPDIR says (some sites point it at a shared
    scratch file system), where it is there and writable; else None (the temporary directory)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def polling_dir() -> str:
    """hpctorch's private directory for this user under ``polling_root``."""
    root = polling_root()
    return os.path.join(root, f"hpctorch-{_user()}") if root else dump_dir()


def _user() -> str:
    return str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")


def faulthandler_dir() -> str:
    """Where workers' faulthandler files go (``HPCTORCH_STACKS_DIR``); created here, and the
    files of processes that are gone (killed before they could remove their own) removed."""
    path = os.path.join(dump_dir(), "faulthandler")
    os.makedirs(path, mode=0o700, exist_ok=True)
    for name in os.listdir(path):
        pid = name.removesuffix(".stack")
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.remove(os.path.join(path, name))
            except OSError:
                pass
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: not ours to judge
    return True

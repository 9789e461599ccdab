"""A worker's uncaught exception, as the user should meet it.

The worker entry (``_worker.py``) runs the script through runpy, inside hpctorch's own wrappers
(the straggler watch times collectives): a plain traceback would show those frames within the
user's, and torch's excepthook would prefix every line a second time. Here the traceback is
printed as ``python train.py`` would print it (hpctorch's and runpy's frames left out, chained
exceptions kept), and torch's error file (``TORCHELASTIC_ERROR_FILE``, the format of torch's
``@record``) gets the exception and where in the user's code it was raised, which the closing
line names: ``rank 1 (local rank 1) raised KeyError: 'missing_column' at train.py:4``.
No torch at import (the standard library and hpctorch's own folders): imported by every worker.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import time
import traceback

OWN = os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0] + os.sep
"""hpctorch's package folder: its frames are not the user's."""
RECORD = "hpctorch"


def _ours(filename: str) -> bool:
    return filename.startswith(OWN) or filename.startswith("<frozen runpy") or os.path.basename(filename) == "runpy.py"


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})


def _trimmed(error: traceback.TracebackException, seen: set[int] | None = None) -> traceback.TracebackException:
    """``error`` and its causes without hpctorch's and runpy's frames."""
    seen = seen if seen is not None else set()
    if id(error) in seen:
        return error
    seen.add(id(error))
    error.stack = traceback.StackSummary.from_list([frame for frame in error.stack if not _ours(frame.filename)])
    for linked in (error.__cause__, error.__context__):
        if linked is not None:
            _trimmed(linked, seen)
    return error


def where(stack: traceback.StackSummary) -> str | None:
    """The innermost frame in the user's code (not the standard library, not an installed package)."""
    libraries = _library_dirs()
    frames = [f for f in stack if not _ours(f.filename)]
    mine = [f for f in frames if not os.path.realpath(f.filename).startswith(libraries)] or frames
    if not mine:
        return None
    name = mine[-1].filename
    shown = os.path.relpath(name) if not os.path.relpath(name).startswith("..") else name
    return f"{shown}:{mine[-1].lineno}"


def report(error: BaseException) -> None:
    """Print ``error`` as the user's own traceback and record it in torch's error file."""
    trimmed = _trimmed(traceback.TracebackException.from_exception(error))
    text = "".join(trimmed.format())
    sys.stderr.write(text)
    sys.stderr.flush()
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = str(error).strip().splitlines()
    summary = f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    data = {"message": {"message": summary, "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}},
            RECORD: {"exception": summary, "where": where(trimmed.stack), "time": time.time()}}
    from ..host.folders import replace_file

    try:
        # Whole or not at all: torch's agent reads the file of every rank it stops, and one torn by
        # the SIGTERM that stopped this rank mid-write made that agent raise, ending the job.
        replace_file(path, json.dumps(data))
    except OSError:
        pass  # the closing line then names the exit code only


def tolerate_torn_error_files() -> None:
    """In the agent: a worker's error file that does not parse reads as none. torch's ``@record``
    writes it in place (``report`` replaces it whole), so a rank stopped mid-write (the agent's
    SIGTERM to the survivors of a failure) leaves it empty or cut; torch's agent then raised
    reading it back for the stopped rank (``ProcessFailure.__post_init__``, torch 2.1 to 2.13)
    and stopped, closing the rendezvous on every node: a failure that restarts cleanly ended the
    job. The torn file is kept beside as ``error.json.torn``."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    original = ProcessFailure.__post_init__
    if getattr(original, "_hpctorch", False):
        return

    def __post_init__(self) -> None:  # type: ignore[no-untyped-def]
        if _unreadable(self.error_file):  # set aside first: torch would log its parse error's traceback, then raise
            try:
                os.replace(self.error_file, self.error_file + ".torn")
            except OSError:  # cannot be: the fields torch sets, said plainly
                self.error_file_data, self.message, self.timestamp = {"message": ""}, f"exit code {self.exitcode}", int(time.time())
                return
        original(self)  # a torn file set aside: as for a rank that wrote none, its exit code or signal

    __post_init__._hpctorch = True  # type: ignore[attr-defined]
    ProcessFailure.__post_init__ = __post_init__  # type: ignore[method-assign]


def _unreadable(path: str) -> bool:
    """Whether ``path`` is there and torch's ``ProcessFailure`` could not read it: not JSON, or
    without the message and timestamp torch takes from it."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        message = data["message"]
        int(message["extraInfo"]["timestamp"] if isinstance(message, dict) else data.get("timestamp", 0))
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return False


def _record(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle).get(RECORD)
    except (OSError, ValueError, AttributeError):
        return {}
    return record if isinstance(record, dict) else {}


def raised_at(path: str) -> float | None:
    """When (wall clock) the worker whose error file this is raised, if it did: the first failure
    is the first to raise, not the first to exit (a rank's exit after an exception can take longer
    than its peers' exits from the broken collective it caused)."""
    at = _record(path).get("time")
    return float(at) if isinstance(at, (int, float)) else None


def read(path: str) -> str | None:
    """What a worker's error file says it raised, and where: ``KeyError: 'x' at train.py:4``."""
    record = _record(path)
    exception = str(record.get("exception") or "")[:300]
    if not exception:
        return None
    from ..terminal import printable

    found = record.get("where")
    return printable(f"{exception}{f' at {found}' if found else ''}", lines=False)

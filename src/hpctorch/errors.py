"""The one exception type for problems the user can fix, and the one line an OSError becomes."""

from __future__ import annotations

import errno


class HpctorchError(Exception):
    """A user-facing problem: what went wrong and how to fix it.

    The CLI prints it as one line and exits with ``exit_code`` (2 unless a command documents
    another); anything else that escapes is a bug and keeps its traceback.
    """

    def __init__(self, cause: str, fix: str = "", exit_code: int = 2) -> None:
        self.cause = cause
        self.fix = fix
        self.exit_code = exit_code
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.cause}; fix: {self.fix}" if self.fix else self.cause


_OS_FIXES = {
    errno.ENOSPC: "free space there (df -h), or point TMPDIR or --log-dir at a file system with room",
    errno.EDQUOT: "free space in your quota there, or point TMPDIR or --log-dir elsewhere",
    errno.EACCES: "give yourself access to that path, or choose another",
    errno.EPERM: "give yourself access to that path, or choose another",
    errno.ENOTDIR: "a folder is needed there: remove or rename the file in its way",
    errno.EROFS: "choose a path on a writable file system",
}


def os_error_line(exc: OSError) -> str:
    """An OSError as one line: what the system said, where, and what to do."""
    where = f": {exc.filename}" if exc.filename else ""
    fix = _OS_FIXES.get(exc.errno or 0, "check that path")
    return f"{exc.strerror or exc}{where}; fix: {fix}"

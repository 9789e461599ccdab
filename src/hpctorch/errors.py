"""The one exception type for problems the user can fix."""

from __future__ import annotations


class HpctorchError(Exception):
    """A user-facing problem: what went wrong and how to fix it.

    The CLI prints it as one line and exits with status 2; anything else that
    escapes is a bug and keeps its traceback.
    """

    def __init__(self, cause: str, fix: str = "") -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.cause}; fix: {self.fix}" if self.fix else self.cause

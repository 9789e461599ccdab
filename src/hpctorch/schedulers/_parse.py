"""Reading integers from environment mappings with errors that name the variable."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HpctorchError


def env_int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    """``int(env[name])``, None when unset; a clear error when it is not a number."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise HpctorchError(
            f"{name}={raw!r} is not a whole number",
            f"unset {name} or give it an integer value",
        ) from None
    if value < minimum:
        raise HpctorchError(f"{name}={value} is below {minimum}", f"unset {name} or fix its value")
    return value


def check_rank(name: str, value: int | None, size_name: str, size: int) -> None:
    """A rank variable must be below the size it indexes."""
    if value is not None and value >= size:
        raise HpctorchError(
            f"{name}={value} is out of range for {size_name}={size}",
            "the launcher's variables contradict each other; unset the stale ones",
        )

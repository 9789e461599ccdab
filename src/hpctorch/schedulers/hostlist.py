"""Slurm hostlist syntax: expand ``nid[0001-0003],gpu[1-2]-ib[0-1]`` and compress back.

Pure functions. Behaviour follows Slurm's own ``scontrol show hostnames`` and
``scontrol show hostlist``: order is preserved, duplicates are kept, zero padding
follows the width of the range's lower bound, several bracket groups in one name
expand as a cartesian product (leftmost group varies slowest).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable

from ..errors import HpctorchError

_SEPARATORS = ",\n\t "
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")
# A guard against typos such as n[1-100000000]; the largest machines have ~10^4 nodes.
MAX_HOSTS = 1_000_000


def _malformed(expr: str, why: str) -> HpctorchError:
    return HpctorchError(
        f"malformed hostlist {expr!r}: {why}",
        "write names like 'node1,node2' or ranges like 'node[1-4,7]' or 'nid[0001-0010]'",
    )


def _split_top_level(expr: str) -> list[str]:
    """Split on separators that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expr:
        if char == "[":
            if depth:
                raise _malformed(expr, "nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise _malformed(expr, "']' without '['")
            depth = 0
        if char in _SEPARATORS and not depth:
            if current:
                parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise _malformed(expr, "'[' is never closed")
    if current:
        parts.append("".join(current))
    return parts


def _expand_range_list(expr: str, body: str) -> list[str]:
    """``1,3-5,010`` -> ['1', '3', '4', '5', '010'] with zero padding kept."""
    values: list[str] = []
    for item in body.split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise _malformed(expr, f"{item!r} is not a number or a range 'A-B'")
        if not dash:
            values.append(low)
            continue
        start, stop = int(low), int(high)
        if stop < start:
            raise _malformed(expr, f"range {item!r} runs backwards")
        if len(values) + stop - start + 1 > MAX_HOSTS:
            raise _malformed(expr, f"it names more than the {MAX_HOSTS} hosts allowed")
        width = len(low)
        values.extend(f"{number:0{width}d}" for number in range(start, stop + 1))
    return values


def _expand_name(expr: str, name: str) -> list[str]:
    # re.split with one group alternates literal text and bracket bodies.
    pieces: list[list[str]] = []
    for index, chunk in enumerate(re.split(r"\[([^\]]*)\]", name)):
        if index % 2:
            pieces.append(_expand_range_list(expr, chunk))
        elif chunk:
            pieces.append([chunk])
    if math.prod(len(piece) for piece in pieces) > MAX_HOSTS:
        raise _malformed(expr, f"it names more than the {MAX_HOSTS} hosts allowed")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand(expr: str) -> list[str]:
    """All host names of a hostlist expression, in order, duplicates kept."""
    if not expr or not expr.strip():
        raise _malformed(expr, "it is empty")
    names: list[str] = []
    for part in _split_top_level(expr):
        names.extend(_expand_name(expr, part))
    if not names:
        raise _malformed(expr, "it names no host")
    return names


def _split_number(name: str) -> tuple[str, str | None]:
    match = _TRAILING_NUMBER.match(name)
    if match is None:
        return name, None
    return match.group(1), match.group(2)


def _ranges(digits: list[str]) -> str:
    """['1','2','3','5'] -> '1-3,5': merge ascending runs that keep one width."""
    runs: list[list[str]] = []
    for text in digits:
        if runs:
            first, last = runs[-1][0], runs[-1][-1]
            width = len(first)
            if int(text) == int(last) + 1 and f"{int(text):0{width}d}" == text:
                runs[-1].append(text)
                continue
        runs.append([text])
    return ",".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def compress(names: Iterable[str]) -> str:
    """The shortest Slurm hostlist for ``names`` that keeps their order."""
    groups: list[tuple[str, list[str] | None]] = []
    for name in names:
        if not name or any(c in name for c in _SEPARATORS + "[]"):
            raise HpctorchError(
                f"{name!r} is not a host name", "give plain host names such as 'node1 node2'"
            )
        prefix, number = _split_number(name)
        if number is not None and groups and groups[-1][0] == prefix and groups[-1][1] is not None:
            groups[-1][1].append(number)
        else:
            groups.append((prefix, [number] if number is not None else None))
    out: list[str] = []
    for prefix, numbers in groups:
        if numbers is None:
            out.append(prefix)
        elif len(numbers) == 1:
            out.append(prefix + numbers[0])
        else:
            out.append(f"{prefix}[{_ranges(numbers)}]")
    return ",".join(out)


def display(names: Iterable[str]) -> str:
    """For people: compressed when a hostlist can hold the names, else listed as they are
    (names with spaces, say)."""
    names = list(names)
    try:
        return compress(names)
    except Exception:  # noqa: BLE001 - any name compress refuses
        return ", ".join(names)

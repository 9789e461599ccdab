"""Text other processes wrote, on this terminal: control characters escaped."""

from __future__ import annotations

from hpctorch.guard.agreement import disagreement_error
from hpctorch.stacks.groups import summary
from hpctorch.terminal import printable


def test_control_characters_are_escaped_and_plain_text_kept() -> None:
    assert printable("node2: ok — 100 %\tdone") == "node2: ok — 100 %\tdone"
    assert printable("a\x1b[31mred\x07\x00\x7f\x9b") == "a\\x1b[31mred\\x07\\x00\\x7f\\x9b"
    assert printable("two\nlines\r") == "two\nlines\\x0d"
    assert printable("two\nlines", lines=False) == "two\\x0alines"


def test_a_disagreement_and_a_stack_summary_cannot_carry_escapes() -> None:
    line = disagreement_error(["node 1 (\x1b]0;x\x07) planned 4 workers"]).line()
    assert "\x1b" not in line and "\\x1b]0;x\\x07" in line
    merged = [{"ranks": [0], "hosts": ["n1"], "methods": ["py-spy"], "text": 'train.py:3 in "\x1b[2J"'}]
    assert all("\x1b" not in row for row in summary(merged, 1, None))

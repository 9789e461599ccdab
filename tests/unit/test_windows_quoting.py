"""Command lines shown to copy (plan's command and relaunch rows) quoted for the platform
they run on: Windows paths with spaces, backslashes and quotes survive CreateProcess."""

from __future__ import annotations

import subprocess

import pytest

from hpctorch.plan.render import command_line

CASES = [
    ([r"C:\Program Files\Python311\python.exe", "-u", r"C:\my data\train.py"],
     r'"C:\Program Files\Python311\python.exe" -u "C:\my data\train.py"'),
    ([r"C:\py\python.exe", r"D:\out dir" + "\\"], r'C:\py\python.exe "D:\out dir\\"'),
    (["python", 'say "hi"', r"a\\b"], r'python "say \"hi\"" a\\b'),
    (["python", ""], 'python ""'),
]


@pytest.mark.parametrize("argv, line", CASES)
def test_windows_command_lines(argv: list[str], line: str) -> None:
    assert command_line(argv, "win32") == line


@pytest.mark.parametrize("argv, _line", CASES)
def test_windows_lines_parse_back_to_the_same_words(argv: list[str], _line: str) -> None:
    # CommandLineToArgvW's rules, as the C runtime applies them (the inverse of list2cmdline).
    assert _parse_windows(command_line(argv, "win32")) == argv


def test_posix_command_lines_use_shell_quoting() -> None:
    assert command_line(["python", "/my data/train.py", "it's"], "linux") == "python '/my data/train.py' 'it'\"'\"'s'"


def _parse_windows(line: str) -> list[str]:
    """The Microsoft C runtime's argv parsing (2008+ rules, without the "" inside quotes quirk)."""
    words, word, quoted, i, started = [], [], False, 0, False
    while i < len(line):
        c = line[i]
        if c == "\\":
            j = i
            while j < len(line) and line[j] == "\\":
                j += 1
            count = j - i
            if j < len(line) and line[j] == '"':
                word.append("\\" * (count // 2))
                if count % 2:
                    word.append('"')
                    i = j + 1
                else:
                    i = j
                started = True
                continue
            word.append("\\" * count)
            i, started = j, True
            continue
        if c == '"':
            quoted, started = not quoted, True
        elif c in " \t" and not quoted:
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(c)
            started = True
        i += 1
    if started:
        words.append("".join(word))
    return words


def test_the_parser_agrees_with_pythons_own_quoting() -> None:
    assert _parse_windows(subprocess.list2cmdline(["a b", "c"])) == ["a b", "c"]

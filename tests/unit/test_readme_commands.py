"""Every hpctorch command line the README shows (its indented examples) parses as hpctorch's own
command line does: a renamed or dropped option in the code shows up here, not in a user's hands."""

from __future__ import annotations

import shlex

import pytest

from hpctorch.cli.parser import parser, stage_paths

from ..conftest import ROOT


LAUNCHERS = {"hpctorch", "srun", "mpirun", "mpiexec", "jsrun", "flux"}
"""What an example line starts with when it runs hpctorch (the rest are outputs and code)."""


def command_lines() -> list[str]:
    """The README's indented example lines that run hpctorch (continuations joined, comments and
    prompts dropped); lines with a placeholder (``...``) are left out."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        command = line.split(" #", 1)[0].strip().removeprefix("$ ")
        if not line.startswith("    ") or " ... " in command or command.split(" ", 1)[0] not in LAUNCHERS:
            continue
        words = shlex.split(command)
        if "hpctorch" in words and words.index("hpctorch") + 1 < len(words):
            found.append(shlex.join(words[words.index("hpctorch") + 1:]))
    return found


def test_the_readme_shows_commands() -> None:
    assert len(command_lines()) >= 15
    assert {line.split()[0] for line in command_lines()} >= {"run", "plan", "submit", "stacks", "hostlist", "badnodes", "stage", "timeline"}


@pytest.mark.parametrize("line", command_lines())
def test_each_command_parses(line: str) -> None:
    argv = shlex.split(line)
    top = parser(argv[0])
    args, extras = top.parse_known_args(stage_paths(top, argv))
    assert not extras, (line, extras)
    assert args.command == argv[0]

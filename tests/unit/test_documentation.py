"""The README and the documentation (docs/, the site `make docs` builds): every hpctorch command
line they show (their indented examples) parses as hpctorch's own command line does, and every
option of every command is in them: a renamed, dropped or new option shows up here, not in a
user's hands."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from hpctorch.cli.parser import parser, stage_paths

from ..conftest import ROOT


LAUNCHERS = {"hpctorch", "srun", "mpirun", "mpiexec", "jsrun", "flux"}
"""What an example line starts with when it runs hpctorch (the rest are outputs and code)."""


def documentation() -> str:
    """The README and every page of docs/."""
    return "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def command_lines() -> list[str]:
    """The documentation's indented example lines that run hpctorch (continuations joined,
    comments and prompts dropped); lines with a placeholder (``...``) are left out."""
    text = documentation().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        command = line.split(" #", 1)[0].strip().removeprefix("$ ")
        if not line.startswith("    ") or " ... " in command or command.split(" ", 1)[0] not in LAUNCHERS:
            continue
        words = shlex.split(command)
        if "hpctorch" in words and words.index("hpctorch") + 1 < len(words):
            found.append(shlex.join(words[words.index("hpctorch") + 1:]))
    return found


def test_the_documentation_shows_commands() -> None:
    assert len(command_lines()) >= 20
    assert {line.split()[0] for line in command_lines()} >= {"run", "plan", "submit", "stacks", "hostlist", "badnodes", "stage", "timeline",
                                                             "--version"}


@pytest.mark.parametrize("line", command_lines())
def test_each_command_parses(line: str) -> None:
    argv = shlex.split(line)
    if argv in (["--version"], ["-V"]):  # answered before the parser
        from hpctorch.cli.main import main

        assert main(argv) == 0
        return
    top = parser(argv[0])
    args, extras = top.parse_known_args(stage_paths(top, argv))
    assert not extras, (line, extras)
    assert args.command == argv[0]


def test_every_option_is_documented() -> None:
    """Each option of every command, by one of its names as a word of its own (torchrun's
    underscore spellings count by their dashed form)."""

    readme = documentation()
    missing = []

    def walk(command: argparse.ArgumentParser, path: str) -> None:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            elif action.option_strings and action.help != argparse.SUPPRESS and "--help" not in action.option_strings:
                names = [n.replace("_", "-") for n in action.option_strings]
                if not any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", readme) for n in names):
                    missing.append(f"{path}: {action.option_strings[0]}")

    walk(parser(), "")
    assert not missing, missing


def options_of(command: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``command`` and of its own subcommands (badnodes add's)."""
    found = set()
    for action in command._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= options_of(sub)
    return found


def test_every_option_a_command_in_the_text_names_exists() -> None:
    """The commands quoted in the text (`hpctorch run --stage-env`, mostly partial): each option
    they name is one their command has."""
    wrong = []
    for span in re.findall(r"`([^`\n]+)`", documentation()):
        words = span.replace("=", " ").split()
        if "hpctorch" not in words or words[0] not in LAUNCHERS or words.index("hpctorch") + 1 >= len(words):
            continue
        command = words[words.index("hpctorch") + 1]
        if command.startswith("-"):
            continue
        known = options_of(parser(command)._subparsers._group_actions[0].choices[command])  # type: ignore[union-attr]
        wrong += [f"{span}: {word}" for word in words[words.index("hpctorch") + 2:] if word.startswith("--") and word not in known]
    assert not wrong, wrong

"""Environment fixtures: ``KEY=VALUE`` lines, '#' comments citing where they came from."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def load_env(relative: str, **overrides: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in (FIXTURES / relative).read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    env.update(overrides)
    return env

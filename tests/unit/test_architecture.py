"""The layout's promises (ARCHITECTURE.md): launcher knowledge stays in its module, and
modules stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import hpctorch
from hpctorch.schedulers import DETECTORS, hostfile, mpi, torchelastic

PACKAGE = Path(hpctorch.__file__).parent
# The job-script writer names the schedulers it writes scripts for; nothing else may.
ALLOWED = {PACKAGE / "submit" / "jobscript.py"}


def launcher_names() -> set[str]:
    names = {m.LAUNCHER.name for m in DETECTORS if hasattr(m, "LAUNCHER")}
    names |= {launcher.name for launcher, *_ in mpi.FLAVOURS}
    names |= {torchelastic.TORCHRUN.name, torchelastic.BY_HAND.name, hostfile.LAUNCHER.name}
    return names - {"env"}  # "env" is also a plain word (report keys): checked by the test below


def test_every_launcher_module_describes_its_launcher() -> None:
    for module in DETECTORS:
        if module is mpi:
            assert mpi.FLAVOURS
        elif module is torchelastic:
            assert torchelastic.TORCHRUN and torchelastic.BY_HAND
        else:
            assert module.LAUNCHER.name, module.__name__


def test_no_module_outside_schedulers_compares_a_launcher_name() -> None:
    names = launcher_names() | {"env"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "schedulers" or path in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Constant) and side.value in names:
                        found.append(f"{path.name}:{node.lineno} compares with {side.value!r}")
            elif isinstance(node, ast.Dict):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and key.value in launcher_names():
                        found.append(f"{path.name}:{node.lineno} keys a table by {key.value!r}")
    assert not found, found


def test_no_module_is_over_450_lines() -> None:
    long = {p.name: n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long


# The pipeline's stages in import order (ARCHITECTURE.md): each may import the package root's
# shared modules ("core"), itself and the stages before it, never one after it. submit is apart: it writes
# job scripts and needs no decision of the pipeline.
STAGES = ("schedulers", "host", "plan", "stacks", "guard", "screen", "stage", "start", "doctor")
ALLOWED_IMPORTS = {stage: {"core", *STAGES[:i + 1]} for i, stage in enumerate(STAGES)}
ALLOWED_IMPORTS |= {"core": {"core"}, "submit": {"core", "schedulers", "submit"}, "cli": {"core", *STAGES, "submit", "cli"}}
ENTRIES = {"hpctorch", "hpctorch.__main__", "hpctorch._worker"}  # may import any stage


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "core"


def imports_of(path: Path) -> set[str]:
    """Every hpctorch module ``path`` imports, at the top or inside a function."""
    module = module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists()
                          or (PACKAGE.parent / candidate.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m == "hpctorch" or m.startswith("hpctorch.")} - {module}


def test_stages_import_only_the_stages_before_them() -> None:
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        if module in ENTRIES:
            continue
        stage = stage_of(module)
        for target in imports_of(path):
            if target != "hpctorch" and stage_of(target) not in ALLOWED_IMPORTS[stage]:
                wrong.append(f"{module} ({stage}) imports {target} ({stage_of(target)})")
    assert not wrong, wrong


def test_every_stage_says_what_it_holds_and_may_import() -> None:
    for stage in ALLOWED_IMPORTS.keys() - {"core"}:
        doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text())) or ""
        assert "import" in doc, f"{stage}/__init__.py: say what it holds and what it may import"


def test_no_two_modules_import_each_other_in_a_circle() -> None:
    graph = {module_name(p): imports_of(p) - {"hpctorch"} for p in PACKAGE.rglob("*.py")}
    graph = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    circles = []
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*trail[trail.index(target):], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state and module not in ENTRIES:
            visit(module, [module])
    assert not circles, circles

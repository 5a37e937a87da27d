"""The layering rule, by import inspection: proxy <- harnesses <- rollout <- train <- ui/cli.

Every `import` in src/ (at module level, in functions and under TYPE_CHECKING alike) may
name only its own layer or one below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import harnessrl

SRC = Path(harnessrl.__file__).resolve().parent

# The floor of each top-level part of the package; a part not listed fails the test, so a
# new folder has to be placed on a floor deliberately.
FLOORS = {
    "types": 0, "errors": 0, "models": 0, "settings": 0,
    "proxy": 1,
    "harnesses": 2,
    "rollout": 3,
    "train": 4, "openenv": 4,
    "ui": 5, "reports": 5, "demo": 5, "cli": 5, "docgen": 5, "__main__": 5,
}


def _part(module: str) -> str:
    """`harnessrl.proxy.app` -> `proxy`; the package itself is the floor-0 `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "types"


def _module_of(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    return ".".join(p for p in rel.parts if p != "__init__")


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return [(line, name) for line, name in found
            if name == "harnessrl" or name.startswith("harnessrl.")]


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "bundled_tasks" not in p.parts)


def test_every_part_has_a_floor():
    parts = {_part(_module_of(p)) for p in _sources()}
    assert parts <= set(FLOORS), f"place these on a floor in FLOORS: {parts - set(FLOORS)}"


def test_no_import_runs_back_up_the_layers():
    upward = []
    for path in _sources():
        module = _module_of(path)
        floor = FLOORS.get(_part(module), 0)
        for line, name in _imports(path, module):
            if FLOORS.get(_part(name), 0) > floor:
                upward.append(f"{path.relative_to(SRC.parent)}:{line}: {module} imports {name}")
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_the_inspection_sees_an_upward_import(tmp_path: Path):
    """The check itself can fail: a proxy module importing the runner is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from harnessrl.rollout.runner import Runner\n")
    [(line, name)] = _imports(bad, "harnessrl.proxy.bad")
    assert (line, name) == (2, "harnessrl.rollout.runner")
    assert FLOORS[_part(name)] > FLOORS[_part("harnessrl.proxy.bad")]


@pytest.mark.parametrize(("module", "relative", "expected"), [
    ("harnessrl.proxy.app", "from .store import TraceStore", "harnessrl.proxy.store"),
    ("harnessrl.proxy.engines.vllm", "from ..store import X", "harnessrl.proxy.store"),
])
def test_relative_imports_resolve(tmp_path: Path, module: str, relative: str, expected: str):
    source = tmp_path / "m.py"
    source.write_text(relative + "\n")
    assert _imports(source, module) == [(1, expected)]

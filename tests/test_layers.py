"""The layering rule, by import inspection: store, http <- proxy <- harnesses <- rollout <-
train <- ui/cli.

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
    "store": 1, "http": 1,  # the libraries under the capture service
    "proxy": 2,
    "harnesses": 3,
    "rollout": 4,
    "train": 5, "openenv": 5,
    "ui": 6, "reports": 6, "demo": 6, "cli": 6, "__main__": 6,
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


@pytest.mark.parametrize(("module", "source", "imported"), [
    ("harnessrl.store.bad", "from harnessrl.proxy.sessions import S", "harnessrl.proxy.sessions"),
    ("harnessrl.store.bad", "from ..proxy import app", "harnessrl.proxy"),
    ("harnessrl.http.bad", "import harnessrl.proxy.engines.vllm", "harnessrl.proxy.engines.vllm"),
    ("harnessrl.http.bad", "from harnessrl.rollout import runner", "harnessrl.rollout"),
])
def test_the_bottom_layer_may_not_import_the_proxy(tmp_path: Path, module: str, source: str,
                                                   imported: str):
    """store/ and http/ sit under the proxy: one of their modules importing the proxy (or
    anything above it) is an upward import."""
    bad = tmp_path / "bad.py"
    bad.write_text(source + "\n")
    [(line, name)] = _imports(bad, module)
    assert (line, name) == (1, imported)
    assert FLOORS[_part(name)] > FLOORS[_part(module)]
    assert FLOORS[_part("harnessrl.types")] < FLOORS[_part(module)]  # types.py is below them


@pytest.mark.parametrize(("module", "relative", "expected"), [
    ("harnessrl.proxy.app", "from .sessions import Sessions", "harnessrl.proxy.sessions"),
    ("harnessrl.proxy.engines.vllm", "from ..relay import X", "harnessrl.proxy.relay"),
    ("harnessrl.store.writer", "from .reader import TraceReader", "harnessrl.store.reader"),
])
def test_relative_imports_resolve(tmp_path: Path, module: str, relative: str, expected: str):
    source = tmp_path / "m.py"
    source.write_text(relative + "\n")
    assert _imports(source, module) == [(1, expected)]


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module of ours an imported name is: itself, or the package/module it is in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (module level, in functions and under
    TYPE_CHECKING alike; `from package import module` names the module, not the package)."""
    sources = {_module_of(p): p for p in _sources()}
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        targets = {_resolve(name, modules) for name in _imported_names(path, module, modules)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def _imported_names(path: Path, module: str, modules: set[str]) -> list[str]:
    """Every dotted name of ours imported; `from a import b` is `a.b` when b is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            names += [f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name
                      for a in node.names]
    return [n for n in names if n == "harnessrl" or n.startswith("harnessrl.")]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    circles = _cycles(_graph())
    assert not circles, "modules that import each other (at any depth):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle():
    """The check itself can fail: a -> b -> c -> a is one circle, d outside it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_vocabulary_knows_nothing_of_settings_or_the_command_line():
    """types.py, the wire's and the store's vocabulary, imports no other harnessrl module and
    no argparse: the flags of `Sampling` are declared beside the commands (cli/common.py)."""
    tree = ast.parse((SRC / "types.py").read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert [n for n in names if n.startswith("harnessrl") or n == "argparse"] == []
    assert names  # the walk sees its imports (msgspec, typing)

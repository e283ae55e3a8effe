"""The package boundaries, read from the source: every import statement (at the top of a module,
inside a function, or under TYPE_CHECKING) and every `importlib.import_module("...")` of a literal.

- api/ is the HTTP service and the domain: it never imports workers/ (work is handed over by task
  name through api/core/queue.py) nor the operator tools in ftplane/;
- trainer/ runs inside the training container: it imports nothing from api/, workers/ or ftplane/
  (HTTP is its only contract with them);
- no import cycle among the modules of api/, workers/ and trainer/.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "workers", "trainer", "ftplane")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # what it imports, as written (absolute, relative imports resolved)

    def __str__(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imports_of(module: str, path: Path) -> Iterator[Import]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from pkg import name`: the submodule when `name` is one, else the package itself
                submodule = f"{base}.{alias.name}"
                yield Import(module, node.lineno, submodule if submodule in modules() else base)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(module, node.lineno, node.args[0].value)


@cache
def all_imports() -> tuple[Import, ...]:
    return tuple(found for module, path in modules().items() for found in imports_of(module, path))


def top(name: str) -> str:
    return name.split(".")[0]


def known(target: str) -> str | None:
    """The module of ours `target` names (the longest prefix that is one), if any."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules():
            return candidate
    return None


def crossings(source: str, forbidden: set[str]) -> list[str]:
    return sorted({str(i) for i in all_imports() if top(i.module) == source and top(i.target) in forbidden})


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that comes back to its first module) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [cycle_in(graph, component) for component in components]


def cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def test_the_walk_sees_the_code() -> None:
    found = modules()
    assert {"api.main", "api.core.queue", "workers.celery_app", "trainer.train", "ftplane.cli"} <= set(found)
    assert any(top(i.target) == "api" for i in all_imports() if top(i.module) == "workers")


def test_api_imports_neither_workers_nor_the_operator_tools() -> None:
    found = crossings("api", {"workers", "ftplane"})
    assert not found, "api/ hands work over through api/core/queue.py, by task name:\n" + "\n".join(found)


def test_trainer_imports_nothing_of_the_control_plane() -> None:
    found = crossings("trainer", {"api", "workers", "ftplane"})
    assert not found, "trainer/ talks to the control plane over HTTP only:\n" + "\n".join(found)


def test_no_import_cycle_among_api_workers_and_trainer() -> None:
    inside = {"api", "workers", "trainer"}
    graph: dict[str, set[str]] = {m: set() for m in modules() if top(m) in inside}
    for found in all_imports():
        target = known(found.target)
        if found.module in graph and target in graph and target != found.module:
            graph[found.module].add(target)
    loops = cycles(graph)
    assert not loops, "import cycles:\n" + "\n".join(" -> ".join(loop) for loop in loops)

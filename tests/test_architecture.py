"""The package boundaries, read from the source: every import statement (at the top of a module,
inside a function, or under TYPE_CHECKING) and every `importlib.import_module("...")` of a literal.

Modules are named as they are imported: trainer/ is the package `ftplane.trainer` (ftplane/trainer
links to it), so that a user's own `trainer.py` never shadows the node side.

- api/ is the HTTP service and the domain: it never imports workers/ (work is handed over by task
  name through api/core/queue.py) nor the operator tools in ftplane/; of the node side, only the
  contract (ftplane/contract.py);
- the node side (ftplane.trainer, ftplane.sdk, ftplane.contract) runs inside the training
  container: it imports nothing from api/, workers/ or the operator tools (HTTP and the contract
  are its only ties to them), and nothing but the standard library, httpx and the training
  libraries (torch, NVRx, NVML): a training image installs it without the control plane's packages;
- the contract imports only the standard library;
- nothing imports the bare name `trainer`;
- no import cycle among our modules.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.support.paths import REPO

PACKAGES = ("api", "workers", "ftplane", "trainer")
NODE_SIDE = ("ftplane.trainer", "ftplane.sdk", "ftplane.contract", "ftplane")  # "ftplane": its __init__ only
CONTRACT = "ftplane.contract"
# what the node side may import besides the standard library and itself (the frameworks its callbacks are for)
NODE_SIDE_LIBRARIES = {"httpx", "torch", "nvidia_resiliency_ext", "numpy", "pynvml", "lightning", "transformers"}
# workers/ may read the node side's /proc helpers (the local backend watches the agents' processes)
WORKERS_FROM_NODE_SIDE = {CONTRACT, "ftplane.trainer.agent.processes"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # what it imports, as written (absolute, relative imports resolved)

    def __str__(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[0] == "trainer":
        parts = ("ftplane", *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    link = REPO / "ftplane" / "trainer"
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if link not in path.parents  # walked once, as trainer/
    }


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


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_node_side(name: str) -> bool:
    return name == "ftplane" or any(within(name, side) for side in NODE_SIDE[:-1])


def is_operator_tool(name: str) -> bool:
    return top(name) == "ftplane" and not is_node_side(name)


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
    assert {"api.main", "api.core.queue", "workers.celery_app", "ftplane.trainer.train", "ftplane.cli"} <= set(found)
    assert {CONTRACT, "ftplane.sdk", "ftplane.trainer.agent.node"} <= set(found)
    assert any(top(i.target) == "api" for i in all_imports() if top(i.module) == "workers")


def test_api_imports_neither_workers_nor_the_operator_tools() -> None:
    found = sorted(
        str(i)
        for i in all_imports()
        if top(i.module) == "api"
        and (top(i.target) == "workers" or (top(i.target) == "ftplane" and not within(i.target, CONTRACT)))
    )
    assert not found, "api/ hands work over through api/core/queue.py, by task name:\n" + "\n".join(found)


def test_workers_import_of_the_node_side_only_the_contract_and_process_helpers() -> None:
    found = sorted(
        str(i)
        for i in all_imports()
        if top(i.module) == "workers"
        and top(i.target) == "ftplane"
        and not any(within(i.target, allowed) for allowed in WORKERS_FROM_NODE_SIDE)
    )
    assert not found, "workers/ may use the contract and the /proc helpers of the node side:\n" + "\n".join(found)


def test_the_node_side_imports_nothing_of_the_control_plane() -> None:
    found = sorted(
        str(i)
        for i in all_imports()
        if is_node_side(i.module) and (top(i.target) in {"api", "workers"} or is_operator_tool(i.target))
    )
    assert not found, "the node side talks to the control plane over HTTP and the contract only:\n" + "\n".join(found)


def test_the_node_side_needs_only_the_standard_library_httpx_and_training_libraries() -> None:
    allowed = set(sys.stdlib_module_names) | NODE_SIDE_LIBRARIES | {"ftplane"}
    found = sorted(str(i) for i in all_imports() if is_node_side(i.module) and top(i.target) not in allowed)
    assert not found, "a training image installs the node side with httpx only:\n" + "\n".join(found)


def test_the_contract_imports_only_the_standard_library() -> None:
    found = sorted(
        str(i)
        for i in all_imports()
        if within(i.module, CONTRACT) and top(i.target) not in set(sys.stdlib_module_names)
    )
    assert not found, "the contract is imported on both sides: standard library only:\n" + "\n".join(found)


def test_nothing_imports_the_shadowable_name_trainer() -> None:
    found = sorted(str(i) for i in all_imports() if top(i.target) == "trainer")
    assert not found, "trainer/ is imported as ftplane.trainer (a user's trainer.py would shadow it):\n" + "\n".join(
        found
    )


def test_no_import_cycle_among_our_modules() -> None:
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for found in all_imports():
        target = known(found.target)
        if target in graph and target != found.module:
            graph[found.module].add(target)
    loops = cycles(graph)
    assert not loops, "import cycles:\n" + "\n".join(" -> ".join(loop) for loop in loops)

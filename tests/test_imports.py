"""No import cycle between scrapy-ha's modules.

Every ``import`` of a scrapy_ha module counts, at module level and inside functions (an
import in a function is a cycle that waits for its first call); imports under
``if TYPE_CHECKING:`` do not, since they never run. ``from scrapy_ha import name`` counts as
an import of the submodule *name* when there is one, else of the package itself (its
``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import scrapy_ha

PACKAGE = Path(scrapy_ha.__file__).parent


def module_name(path: Path) -> str:
    parts = ["scrapy_ha", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported(module: str, tree: ast.AST) -> set[str]:
    """The scrapy_ha modules *module* imports when it runs (TYPE_CHECKING blocks left out)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "scrapy_ha")
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source.split(".")[0] == "scrapy_ha":
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    found.add(sub if sub in MODULES else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found & set(MODULES)


GRAPH = {name: imported(name, ast.parse(path.read_text())) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            strong(node)
    return groups


def test_the_walker_sees_module_and_function_level_imports():
    """A test that cannot fail is no test: the walker finds a cycle it is shown."""
    tree = ast.parse(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from scrapy_ha import metakeys\n"
        "if TYPE_CHECKING:\n"
        "    from scrapy_ha.config.scheduler import ConfigError\n"
        "def f():\n"
        "    from scrapy_ha.retry import RetryMiddleware\n"
    )
    assert imported("scrapy_ha.scheduler", tree) == {"scrapy_ha.metakeys", "scrapy_ha.retry"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_middlewares_do_not_import_the_scheduler():
    """They reach it through scrapy_ha.middlewares.registry, which imports no scrapy_ha module."""
    for name in ("retry", "proxy", "checkpoint", "cookies", "parent", "useragent"):
        assert "scrapy_ha.scheduler" not in GRAPH[f"scrapy_ha.middlewares.{name}"], name
    assert GRAPH["scrapy_ha.middlewares.registry"] == set()


def test_no_import_cycle():
    assert cycles(GRAPH) == []

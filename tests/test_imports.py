"""The package's imports keep its architecture (docs/architecture.md): no cycle, and no
subpackage reaching up to one above it.

Every ``import`` of a scrapy_ha module counts, at module level and inside functions (an
import in a function is a cycle that waits for its first call). ``from scrapy_ha.p import
name`` counts as an import of the submodule *name* when there is one, else of ``p``. Importing
``scrapy_ha.p.q`` from outside the package ``scrapy_ha.p`` runs ``p``'s ``__init__`` first, so
it counts as an import of ``scrapy_ha.p`` too (the root ``scrapy_ha`` excepted: it imports
only the version when it is imported, and its ``Scheduler`` and ``Addon`` on first use).

Run-time imports must form no cycle. Imports under ``if TYPE_CHECKING:`` never run, but they
tie a module to another's names: counted with them, the modules must form no knot either (a
helper that names the class it serves instead of the small protocol it needs).
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
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = module in PACKAGES
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _with_packages(module: str, target: str) -> set[str]:
    """*target*, and the packages above it that an import from *module* runs first."""
    found = {target}
    parts = target.split(".")
    for n in range(2, len(parts)):
        package = ".".join(parts[:n])
        if package in PACKAGES and not (module == package or module.startswith(package + ".")):
            found.add(package)
    return found


def imports(module: str, tree: ast.AST, *, typing: bool = False) -> set[str]:
    """The scrapy_ha modules *module* imports when it runs; with *typing*, also those it
    imports for type checking only."""
    found: set[str] = set()

    def add(target: str) -> None:
        found.update(_with_packages(module, target))

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "scrapy_ha":
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source.split(".")[0] == "scrapy_ha":
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    add(sub if sub in MODULES else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found & set(MODULES)


# kept for the tests below and for readers: the old name of the run-time walk
def imported(module: str, tree: ast.AST) -> set[str]:
    return imports(module, tree)


TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
GRAPH = {name: imports(name, tree) for name, tree in TREES.items()}
TYPED_GRAPH = {name: imports(name, tree, typing=True) for name, tree in TREES.items()}

#: The layers of the package, lowest first: a module imports (at run time or for type
#: checking) only modules of its own layer or of layers below it. The architecture's
#: picture (docs/architecture.md) draws the same order.
LAYERS: list[tuple[str, ...]] = [
    # names shared by every layer: Redis keys, meta keys, failure classes, the version,
    # and the spiders (which need no other module)
    (
        "scrapy_ha._version",
        "scrapy_ha.keys",
        "scrapy_ha.key_types",
        "scrapy_ha.metakeys",
        "scrapy_ha.verdict",
        "scrapy_ha.spiders",
    ),
    ("scrapy_ha.codec",),  # requests to JSON and back
    ("scrapy_ha.config",),  # every setting, validated
    ("scrapy_ha.store",),  # a crawl's data in Redis, for every process
    ("scrapy_ha.deadletters",),  # what becomes of dead letters
    ("scrapy_ha.sinks",),  # the item stream's consumers and their sinks
    ("scrapy_ha.middlewares",),  # the downloader and spider middlewares
    ("scrapy_ha.scheduler",),  # the scheduler: the shell and its session
    ("scrapy_ha.ops",),  # what the operator's tools share
    ("scrapy_ha.dashboard",),  # the web page
    ("scrapy_ha.cli",),  # the command
    ("scrapy_ha.demo",),  # the demo and the test harness
    # the public faces, the add-on and the package itself: nothing inside imports them
    (
        "scrapy_ha",
        "scrapy_ha.addon",
        "scrapy_ha.parent",
        "scrapy_ha.retry",
        "scrapy_ha.revisit",
        "scrapy_ha.proxy",
        "scrapy_ha.checkpoint",
        "scrapy_ha.cookies",
        "scrapy_ha.useragent",
        "scrapy_ha.dlq",
        "scrapy_ha.stats",
        "scrapy_ha.items",
    ),
]


def layer(module: str) -> int:
    """The index in LAYERS of the longest name that is *module* or a package above it."""
    best, found = -1, None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), index
    assert found is not None, f"{module} is in no layer of LAYERS"
    return found


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


def test_the_walker_sees_function_level_type_only_and_package_imports():
    """A test that cannot fail is no test: the walker finds what it is shown."""
    tree = ast.parse(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from scrapy_ha import metakeys\n"
        "if TYPE_CHECKING:\n"
        "    from scrapy_ha.config.validate import ConfigError\n"
        "def f():\n"
        "    from scrapy_ha.middlewares.retry import RetryMiddleware\n"
    )
    module = "scrapy_ha.scheduler.shell"
    runs = {"scrapy_ha.metakeys", "scrapy_ha.middlewares.retry", "scrapy_ha.middlewares"}
    assert imports(module, tree) == runs
    typed = runs | {"scrapy_ha.config.validate", "scrapy_ha.config"}
    assert imports(module, tree, typing=True) == typed
    # inside a package, a sibling's import does not count the package (it runs already)
    sibling = ast.parse("from scrapy_ha.scheduler import engine\n")
    assert imports(module, sibling) == {"scrapy_ha.scheduler.engine"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert layer("scrapy_ha.scheduler.session.keeper") > layer("scrapy_ha.store.queue")


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_no_knot_counting_type_only_imports():
    """A helper names the small protocol it needs (``scheduler.session.shell.Shell``,
    ``middlewares.registry.CrawlScheduler``, ``scheduler.solo.Announcer``), not the class
    that serves it."""
    assert cycles(TYPED_GRAPH) == []


def test_every_module_is_in_a_layer_and_imports_none_above_it():
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in TYPED_GRAPH.items()
        for target in targets
        if layer(target) > layer(module)
    )
    assert upward == []


def test_the_middlewares_do_not_name_the_scheduler():
    """They reach it through scrapy_ha.middlewares.registry, which imports no scrapy_ha
    module when it runs."""
    for name in ("retry", "proxy", "checkpoint", "cookies", "parent", "useragent"):
        names = TYPED_GRAPH[f"scrapy_ha.middlewares.{name}"]
        assert not any(n.startswith("scrapy_ha.scheduler") for n in names), name
    assert GRAPH["scrapy_ha.middlewares.registry"] == set()


def test_the_session_knows_the_shell_by_its_protocol_only():
    """The background task imports what the two halves share (the engine's facts, the
    outbox it drains, the view of Redis it fills); the shell's class never, and its helpers
    only for the types of the protocol it is handed."""
    for module, targets in GRAPH.items():
        if module.startswith("scrapy_ha.scheduler.session"):
            shell_side = {
                t
                for t in targets
                if t.startswith("scrapy_ha.scheduler.")
                and not t.startswith("scrapy_ha.scheduler.session")
            }
            shared = {"engine", "outbox", "remote"}
            assert shell_side <= {f"scrapy_ha.scheduler.{m}" for m in shared}, module
    assert "scrapy_ha.scheduler.shell" not in set().union(
        *(t for m, t in TYPED_GRAPH.items() if m.startswith("scrapy_ha.scheduler.session"))
    )


def test_no_module_over_400_lines():
    """A module past a few screens usually holds two jobs (STYLE.md)."""
    long = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 400
    }
    assert long == {}

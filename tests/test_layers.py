"""The package's layers (docs/architecture.md): every ``transformer_lab`` import, at module level
or inside a function, goes to the same package or a lower layer, and no modules import each other
in a cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import transformer_lab

PACKAGE = Path(transformer_lab.__file__).parent

# Lowest first. Packages on one line are siblings: they may not import each other.
LAYERS: list[set[str]] = [
    {"errors", "processes"},  # processes: fork helpers (no tlab imports)
    {"data"},                  # corpora and tokenizers (no torch)
    {"components", "tasks"},
    {"config"},
    {"model"},
    {"measures", "mutants", "interop"},  # mutants: broken components; interop: HF models
    {"results"},
    {"training"},
    {"routines"},
    {"app"},
    {"cli", "api"},
    {"testing"},               # pytest assertions over the Python API
    {"run", "__main__", "__init__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top(module: str) -> str:
    """``transformer_lab.app.job`` -> ``app``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (type-only imports run
    at no time, so they make no cycle)."""
    nodes, stack = [], [tree]
    while stack:
        node = stack.pop()
        nodes.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) \
                    and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)
    return nodes


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("transformer_lab"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("transformer_lab"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def test_every_package_has_a_layer():
    tops = {_top(name) for name in _graph()}
    assert tops <= set(RANK), f"packages without a layer: {sorted(tops - set(RANK))}"


def test_imports_only_go_down():
    upward = []
    for importer, imported in _graph().items():
        for module in imported:
            a, b = _top(importer), _top(module)
            if a != b and RANK.get(b, -1) >= RANK.get(a, -1):
                upward.append(f"{importer} -> {module}")
    assert not upward, "imports that go up or sideways:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for child in graph[node]:
            if state.get(child) == "open":
                cycles.append(" -> ".join([*stack[stack.index(child):], child]))
            elif child not in state:
                visit(child, [*stack, child])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_components_are_pure_torch():
    for path in (PACKAGE / "components").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "omegaconf" not in text and "import hydra" not in text \
            and "from hydra" not in text, path


def test_hydra_through_its_public_api_only():
    """No ``hydra._internal``, no plugin's private ``_impl`` module, no edit of the
    ConfigStore's ``repo`` anywhere in the package."""
    private = re.compile(r"hydra\._internal|\._impl\b|\.repo\b")
    users = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                   if private.search(p.read_text(encoding="utf-8")))
    assert users == [], users


def _foreign_names(tree: ast.Module) -> set[str]:
    """The names a module binds to what it imports from other packages."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names
                      if not a.name.startswith("transformer_lab")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 \
                and not (node.module or "").startswith("transformer_lab"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _assigned(node: ast.AST) -> list[ast.expr]:
    """What ``node`` assigns to or deletes (``setattr(x, ...)`` as ``x.?``)."""
    if isinstance(node, ast.Assign | ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("setattr", "delattr") and node.args:
        targets = [ast.Attribute(value=node.args[0], attr="?")]
    else:
        return []
    return [t for target in targets
            for t in (target.elts if isinstance(target, ast.Tuple) else [target])]


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_no_assignment_into_another_packages_module():
    """Nothing in the package replaces an attribute of what it imports from another package
    (``hydra_utils.run_and_report = ...``, ``OptunaSweeperImpl.setup = ...``); the one
    exception is this process's own ``sys.argv``, set while ``hydra.main`` reads it."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        foreign = _foreign_names(tree)
        for node in ast.walk(tree):
            for target in _assigned(node):
                text = ast.unparse(target) if isinstance(target, ast.Attribute) else ""
                if text and _root(target) in foreign and text != "sys.argv":
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text}")
    assert found == [], found


def test_the_assignment_check_finds_a_patch():
    """The check above on a module that patches Hydra finds the patch (and not sys.argv)."""
    tree = ast.parse("import sys\nimport hydra._internal.utils as hydra_utils\n"
                     "from plugin import Impl\nsys.argv = []\n"
                     "hydra_utils.run_and_report = print\nImpl.setup, x = None, 1\n"
                     "setattr(Impl, 'launch', None)\n")
    foreign = _foreign_names(tree)
    patched = [ast.unparse(t) for node in ast.walk(tree) for t in _assigned(node)
               if isinstance(t, ast.Attribute) and _root(t) in foreign]
    assert sorted(patched) == ["Impl.?", "Impl.setup", "hydra_utils.run_and_report",
                               "sys.argv"]

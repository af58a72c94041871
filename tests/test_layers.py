"""The package's layering: import-linter's contracts (pyproject.toml), no import cycles, and
no module outside ``storages/`` reading a storage's private state."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

import torchrl_ext.storages

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold(monkeypatch):
    monkeypatch.chdir(ROOT)  # import-linter reads pyproject.toml from the working directory
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("torchrl_ext")  # counts function-level and TYPE_CHECKING imports
    edges = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    assert _cycles(edges) == []


def _storage_private_names() -> set[str]:
    """Private names the package's storage modules define or set (``self._x = ...``, ``def _x``)."""
    names = set()
    for info in pkgutil.walk_packages(torchrl_ext.storages.__path__, "torchrl_ext.storages."):
        tree = ast.parse(inspect.getsource(importlib.import_module(info.name)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def _foreign_private_reads(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``obj._x`` and ``getattr(obj, "_x")`` in ``source`` for ``_x`` in ``names``, ``obj`` not
    ``self``/``cls``/``super()`` (a class's own state is its own business)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in names \
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_storage_privacy_rule_finds_planted_reads():
    names = {"_loads", "_pos_np"}
    planted = "a = storage._pos_np\nb = getattr(storage, '_loads', 0)\nc = self._loads\nd = storage.positions\n"
    assert [line for line, _ in _foreign_private_reads(planted, names)] == [1, 2]


def test_no_module_outside_storages_reads_a_storages_private_state():
    """Samplers, writers and buffers use the storages' public contract (``positions``,
    ``gather``, ``flat_leaves``, ``load_count``, ...), never their private attributes."""
    names = _storage_private_names()
    package = ROOT / "torchrl_ext"
    found = [
        f"{path.relative_to(ROOT)}:{line} {text}"
        for path in sorted(package.rglob("*.py"))
        if package / "storages" not in path.parents and path.name != "_compat.py"
        for line, text in _foreign_private_reads(path.read_text(), names)
    ]
    assert not found, "use the storage's public API:\n" + "\n".join(found)

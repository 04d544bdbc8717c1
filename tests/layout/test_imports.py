"""The layout's rules, read from the code's own imports (parsed with ``ast``, nothing imported).

- No library module imports ``tss_opt.cli``: commands are thin wrappers over the library.
- No import cycle between packages (each folder under ``tss_opt/`` is a package with its
  subpackages; a top-level module such as ``tss_opt/errors.py`` is a unit of its own). Imports inside functions
  count too; imports under ``if TYPE_CHECKING:`` do not (they never run).
- No import cycle between any two modules (strongly connected components of the module graph;
  ``from pkg import name`` is an edge to ``pkg/__init__``).
- ``import tss_opt.config`` loads no torch, transformers, optuna, sqlalchemy or metric library.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "tss_opt"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The top-level package a module belongs to (``tss_opt.decoding`` for everything under
    ``tss_opt/decoding/``, subpackages included), or itself for a top-level module. Between a
    package and its own subpackages only module cycles count (see the module-cycle test)."""
    parts = module.split(".")
    if len(parts) < 2:
        return module
    top = ".".join(parts[:2])
    return top


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, type_checking: bool = False) -> set[str]:
    """Project modules imported by ``tree`` (relative imports resolved); imports under
    ``if TYPE_CHECKING:`` only with ``type_checking``."""
    found: set[str] = set()
    package = module if (PKG.parent / Path(*module.split(".")) / "__init__.py").exists() else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tss_opt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == "tss_opt":
                found.add(name)
                # `from tss_opt.x import y` may import the submodule tss_opt.x.y
                for a in node.names:
                    sub = f"{name}.{a.name}"
                    p = PKG.parent / Path(*sub.split("."))
                    if p.with_suffix(".py").exists() or p.is_dir():
                        found.add(sub)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph(type_checking: bool = False) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PKG.rglob("*.py")):
        module = _module_name(path)
        for imported in _imports(ast.parse(path.read_text(), str(path)), module, type_checking):
            edges[module].add(imported)
    return edges


def _with_package_inits(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` plus the edge Python adds at run time: importing ``a.b.c`` first runs the
    ``__init__`` of ``a.b`` (a module's own ancestors excepted: they are running already)."""
    out: dict[str, set[str]] = defaultdict(set, {m: set(v) for m, v in edges.items()})
    packages = {m for m in edges} | {i for v in edges.values() for i in v}
    for m, imports in edges.items():
        for i in imports:
            parts = i.split(".")
            for n in range(2, len(parts)):
                anc = ".".join(parts[:n])
                if anc in packages and m != anc and not m.startswith(anc + "."):
                    out[m].add(anc)
    return out


def test_no_library_module_imports_the_cli() -> None:
    offenders = sorted(
        f"{m} imports {i}"
        for m, imports in _graph().items()
        if not (m == "tss_opt.__main__" or m == "tss_opt.cli" or m.startswith("tss_opt.cli."))
        for i in imports
        if i == "tss_opt.cli" or i.startswith("tss_opt.cli.")
    )
    assert offenders == []


def _package_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    units: dict[str, set[str]] = defaultdict(set)
    for m, imports in edges.items():
        for i in imports:
            a, b = _unit(m), _unit(i)
            if a != b:
                units[a].add(b)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(units.get(u, ())):
            if state.get(v) == 1:
                cycles.append(stack[stack.index(v) :] + [v])
            elif v not in state:
                dfs(v)
        stack.pop()
        state[u] = 2

    for u in sorted(units):
        if u not in state:
            dfs(u)
    return cycles


def test_no_import_cycle_between_packages() -> None:
    assert _package_cycles(_graph()) == []


def test_cycle_check_can_fail() -> None:
    # The check itself finds a planted cycle (and ignores a child importing its parent).
    edges = {
        "tss_opt.search.run": {"tss_opt.mapping.io"},
        "tss_opt.mapping.io": {"tss_opt.search.result"},
        "tss_opt.decoding.drafters.pld": {"tss_opt.decoding.tree"},
    }
    assert _package_cycles(edges) == [["tss_opt.mapping", "tss_opt.search", "tss_opt.mapping"]]


@pytest.mark.timeout(120)
def test_config_import_is_light() -> None:
    heavy = ["torch", "transformers", "optuna", "sqlalchemy", "nltk", "sacrebleu", "rouge_score"]
    code = (
        "import sys, tss_opt.config\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _module_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` restricted to project modules, with ``from pkg import name`` (``name``
    defined in ``pkg/__init__.py``) already an edge to ``pkg`` itself (``_imports`` adds the
    package; the submodule only when one of that name exists)."""
    modules = set(edges) | {i for imports in edges.values() for i in imports}
    return {m: {i for i in edges.get(m, ()) if i in modules and i != m} for m in modules}


def _module_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; a
    child importing its own package's ``__init__`` while that ``__init__`` imports the
    child counts too (it is a real import-time circle)."""
    graph = _module_graph(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(out)


def test_no_import_cycle_between_modules() -> None:
    assert _module_cycles(_graph()) == []


def test_no_import_cycle_at_any_scale() -> None:
    # Issue 33: no cycle even counting imports inside functions, imports under TYPE_CHECKING and
    # the package __init__ an import runs first (tree_sizing once closed a lazy cycle through
    # decoding/drafters/__init__, training/data and training/generated one under TYPE_CHECKING).
    assert _module_cycles(_with_package_inits(_graph(type_checking=True))) == []


def test_package_init_edges_can_close_a_cycle() -> None:
    # x imports a submodule of package y, whose __init__ imports x: a cycle only at run time.
    edges = {
        "tss_opt.d.x": {"tss_opt.d.y.leaf"},
        "tss_opt.d.y": {"tss_opt.d.y.leaf", "tss_opt.d.x"},
        "tss_opt.d.y.leaf": set(),
    }
    assert _module_cycles(edges) == []
    assert _module_cycles(_with_package_inits(edges)) == [["tss_opt.d.x", "tss_opt.d.y"]]


def test_module_cycle_check_can_fail() -> None:
    # A planted circle inside one package, one through a package __init__, and a chain that is
    # no circle: only the two circles are found.
    edges = {
        "tss_opt.decoding.drafters.registry": {"tss_opt.decoding.drafters.taps"},
        "tss_opt.decoding.drafters.taps": {"tss_opt.decoding.drafters.registry", "tss_opt.decoding.tree"},
        "tss_opt.evaluation": {"tss_opt.evaluation.evaluator"},
        "tss_opt.evaluation.evaluator": {"tss_opt.evaluation"},
        "tss_opt.decoding.tree": set(),
        "tss_opt.report.tables": {"tss_opt.report.results"},
    }
    assert _module_cycles(edges) == [
        ["tss_opt.decoding.drafters.registry", "tss_opt.decoding.drafters.taps"],
        ["tss_opt.evaluation", "tss_opt.evaluation.evaluator"],
    ]
    assert _module_cycles({k: v for k, v in edges.items() if k != "tss_opt.evaluation"}) == [
        ["tss_opt.decoding.drafters.registry", "tss_opt.decoding.drafters.taps"],
    ]


def test_from_package_import_name_is_an_edge_to_the_package() -> None:
    # `from tss_opt.decoding import TargetModel` (a name of decoding/__init__) is an edge to
    # the package module tss_opt.decoding; `from tss_opt.decoding import engine` also to the
    # submodule.
    tree = ast.parse("from tss_opt.decoding import TargetModel\nfrom tss_opt.decoding import engine\n")
    assert _imports(tree, "tss_opt.report.heldout") == {"tss_opt.decoding", "tss_opt.decoding.engine"}

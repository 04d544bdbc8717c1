"""The layout's rules, read from the code's own imports and names (parsed with ``ast``, nothing
imported).

An edge from one module to another is an import (inside functions too; under
``if TYPE_CHECKING:`` where a rule says so) or a *string reference*: a string literal that is a
dotted path into the project (``"tss_opt.cli.train_drafter.train"``, a registry's or a
``_target_``'s way of naming code without importing it), or whose f-string starts with one. A
module may not name what it may not import. Prose that mentions a module (an error message
telling the user to run ``python -m tss_opt.cli.export``, a docstring) is no edge. The shipped
``conf/*.yaml`` are configuration, not library code: their ``_target_`` names anything.

- The top layers are the commands (``tss_opt.cli``, ``tss_opt.__main__``) and, under them, the
  assembly that builds a run from the composed configuration (``tss_opt.assembly``). Nothing
  below a top layer imports or names it, not even under ``TYPE_CHECKING``.
- No cycle between packages (each folder under ``tss_opt/`` is a package with its
  subpackages; a top-level module such as ``tss_opt/errors.py`` is a unit of its own), counting
  imports under ``TYPE_CHECKING`` and string references: a package that names another only for
  its types or by a string still depends on it.
- No import cycle between any two modules (strongly connected components of the module graph;
  ``from pkg import name`` is an edge to ``pkg/__init__``).
- ``import tss_opt.config`` loads no torch, transformers, optuna, sqlalchemy or metric library.
"""

from __future__ import annotations

import ast
import re
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


# A string that is a dotted path into the project and nothing else (an f-string's leading part
# ending in a dot counts: f"tss_opt.cli.{name}").
_DOTTED = re.compile(r"tss_opt(?:\.[A-Za-z_]\w*)+(?:\.|:[A-Za-z_]\w*)?")


def _resolve(dotted: str) -> str | None:
    """The module or package a dotted path names (its longest prefix that is one), or ``None``
    when nothing below ``tss_opt`` matches (a logger or key that merely starts with the name)."""
    parts = dotted.split(":")[0].rstrip(".").split(".")
    for n in range(len(parts), 1, -1):
        p = PKG.parent / Path(*parts[:n])
        if p.with_suffix(".py").exists() or (p / "__init__.py").exists():
            return ".".join(parts[:n])
    return None


def _string_refs(tree: ast.AST) -> set[str]:
    """Project modules named by string literals of ``tree`` (see the module docstring); a
    docstring is no reference, nor a logger's name (``logging.getLogger("tss_opt.search")``:
    a namespace for log lines, which imports nothing)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    docstrings |= {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "getLogger"
        for arg in node.args
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            texts = [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []
            prefix = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts, prefix = [node.value], False
        else:
            continue
        for text in texts:
            match = _DOTTED.fullmatch(text.strip()) if not prefix else _DOTTED.match(text)
            if match is not None and (not prefix or match.end() == len(text)):
                module = _resolve(match.group(0))
                if module is not None:
                    found.add(module)
    return found


def _graph(type_checking: bool = False, strings: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports (under ``TYPE_CHECKING`` too with
    ``type_checking``) and, with ``strings``, names by a string."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PKG.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        edges[module] |= _imports(tree, module, type_checking)
        if strings:
            edges[module] |= {m for m in _string_refs(tree) if m != module}
    return edges


def _every_edge() -> dict[str, set[str]]:
    return _graph(type_checking=True, strings=True)


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


# The top layers, highest first: each may be imported or named only by itself and the ones above.
TOP_LAYERS = ("tss_opt.__main__", "tss_opt.cli", "tss_opt.assembly")


def _within(module: str, unit: str) -> bool:
    return module == unit or module.startswith(unit + ".")


def _upward_edges(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for m, named in edges.items():
        for i in named:
            for rank, top in enumerate(TOP_LAYERS):
                if _within(i, top) and not any(_within(m, t) for t in TOP_LAYERS[: rank + 1]):
                    out.append(f"{m} -> {i}")
    return sorted(out)


def test_nothing_below_a_top_layer_imports_or_names_it() -> None:
    assert _upward_edges(_every_edge()) == []


def test_upward_edge_check_can_fail() -> None:
    # A drafter naming a command by string, the runtime importing the assembly for a type, a
    # command using the assembly (allowed) and the assembly naming a command (not).
    tree = ast.parse(
        '''"""Docstring naming tss_opt.cli.train_drafter: prose."""
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from tss_opt.assembly import Assembly
TRAINER = "tss_opt.cli.train_drafter.main"
HINT = "run python -m tss_opt.cli.export first"
LOG = "tss_opt.nothing_here"
log = logging.getLogger("tss_opt.cli")
TARGET = f"tss_opt.decoding.drafters.{'eagle'}"
'''
    )
    assert _string_refs(tree) == {"tss_opt.cli.train_drafter", "tss_opt.decoding.drafters"}
    assert _imports(tree, "tss_opt.runtime.router_setup", type_checking=True) == {"tss_opt.assembly"}
    edges = {
        "tss_opt.decoding.drafters.eagle": _string_refs(tree),
        "tss_opt.runtime.router_setup": {"tss_opt.assembly"},
        "tss_opt.cli.serve": {"tss_opt.assembly.serving"},
        "tss_opt.assembly.runtime": {"tss_opt.cli.common"},
    }
    assert _upward_edges(edges) == [
        "tss_opt.assembly.runtime -> tss_opt.cli.common",
        "tss_opt.decoding.drafters.eagle -> tss_opt.cli.train_drafter",
        "tss_opt.runtime.router_setup -> tss_opt.assembly",
    ]


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


def test_no_cycle_between_packages() -> None:
    # Counting imports under TYPE_CHECKING and string references: a package that names another
    # for its types or by a dotted path still depends on it.
    assert _package_cycles(_every_edge()) == []


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
    # No cycle even counting imports inside functions, imports under TYPE_CHECKING, string
    # references and the package __init__ an import runs first: a lazy import (or a lazy
    # re-export by name) breaks no cycle, it only postpones it to the first call.
    assert _module_cycles(_with_package_inits(_every_edge())) == []


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

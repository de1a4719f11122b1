"""The house's layers (DESIGN.md §5), read from the package's imports: every `import` and
`from ... import` under medusa/, lazy ones inside functions and TYPE_CHECKING ones included,
plus the programs a module starts by name (`python_module("medusa...")`, `python -m medusa...`).

An import only ever goes down a layer (a few named exceptions at most), the offline and the online
side share nothing above layer 1, and no Python files import each other in a circle.

The upward imports allowed (ALLOWED_UPWARD, at most 3): one. The program that each recording of
`medusa materialize` runs (medusa.engine.startup_report) builds an engine from the configuration
the user gave, so, like `medusa run`, it registers the plug-ins a configuration may name
(medusa.plugins: Prism's elastic KV cache, the C2C alpha tuner) before it starts the engine. The
engine's library code imports none of them (tests/test_engine_imports.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import medusa

PACKAGE = Path(medusa.__file__).resolve().parent

# DESIGN §5, bottom to top, by the first name under medusa.
LAYERS = {
    "": 1,  # medusa/__init__.py
    "env": 1,
    "errors": 1,  # the error tree every layer raises from
    "child": 1,  # command lines of child processes
    "scratch": 1,  # scratch directories
    "progress": 1,  # progress of long steps: rich on a terminal, a plain line per step otherwise
    "trace": 1,
    "artifact": 1,
    "cuda": 1,
    "weights": 1,
    "materialize": 2,
    "restore": 2,
    "engine": 3,
    "prism": 4,
    "weaver": 4,
    "c2c": 4,
    "tessera": 4,
    "integrations": 4,
    "plugins": 4,  # registers the research packages' plug-ins: with them
    "serve": 5,
    "commands": 6,
    "doctor": 6,  # `medusa doctor`
    "cli": 6,
}
OFFLINE_ONLINE = ("materialize", "restore")
CLI = "medusa.cli"  # layer 2: both use layer 1 only

# (module, package it imports from a higher layer): why. At most 3.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("medusa.engine.startup_report", "medusa.plugins"): "a program: registers what a config names",
}


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of the package at ROOT."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module NAME refers to: itself, or the nearest package or module above it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names one import statement brings in."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
            base = ".".join([*parts, base] if base else parts)
        yield base
        yield from (f"{base}.{a.name}" for a in node.names)


def _started(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Modules a file starts as programs: python_module(NAME, ...) and [..., "-m", NAME, ...].
    Not the CLI (medusa.child.medusa_cli): any layer may run `medusa ...` as a user does."""
    consts = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value.value, str)
    }

    def text(arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return consts.get(arg.id) if isinstance(arg, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (
                f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            ) == "python_module":
                name = text(node.args[0])
                if name and name != CLI:
                    yield name, node.lineno
        elif isinstance(node, ast.List):
            words = [text(e) for e in node.elts]
            for i, w in enumerate(words[:-1]):
                if w == "-m" and words[i + 1] and words[i + 1] != CLI:
                    yield str(words[i + 1]), node.lineno


def import_graph(root: Path = PACKAGE, *, started: bool = False) -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: first line}. Importing a.b.c also runs the
    packages a.b and a (their __init__.py), so those count too, except the importer's own
    packages. started: also the modules it starts as programs (dependencies as imports are)."""
    modules = module_files(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        names = [
            (name, node.lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for name in _imported(node, module, is_package)
        ]
        if started:
            names += list(_started(tree))
        own = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
        edges: dict[str, int] = {}
        for name, line in names:
            target = _resolve(name, modules) if name.split(".")[0] == root.name else None
            while target and target not in own:
                if target in modules:  # not a namespace package (no __init__.py)
                    edges.setdefault(target, line)
                target = target.rpartition(".")[0]
        graph[module] = edges
    return graph


def layer(module: str) -> int:
    room = module.split(".")[1] if "." in module else ""
    assert room in LAYERS, f"medusa/{room}: give it a layer of DESIGN §5 in LAYERS"
    return LAYERS[room]


def package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def upward_imports() -> dict[tuple[str, str], str]:
    """(module, higher package) -> where: every import that goes up a layer."""
    out = {}
    for module, edges in import_graph(started=True).items():
        for target, line in edges.items():
            if layer(target) > layer(module):
                out.setdefault((module, package(target)), f"{module}:{line} imports {target}")
    return out


def circles(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_imports_only_go_down_the_layers():
    assert len(ALLOWED_UPWARD) <= 3, "DESIGN §5 allows at most 3 named exceptions"
    up = upward_imports()
    known = set(ALLOWED_UPWARD)
    new = [where for key, where in up.items() if key not in known]
    assert not new, "imports from a lower layer to a higher one (DESIGN §5):\n" + "\n".join(new)
    stale = sorted(known - up.keys())
    assert not stale, f"no longer imported: remove from ALLOWED_UPWARD: {stale}"


def test_offline_and_online_share_only_layer_1():
    graph = import_graph(started=True)
    crossed = [
        f"{module}:{line} imports {target}"
        for module, edges in graph.items()
        for target, line in edges.items()
        if {package(module), package(target)} == {f"medusa.{p}" for p in OFFLINE_ONLINE}
    ]
    assert not crossed, "materialize/ and restore/ share names through layer 1:\n" + "\n".join(
        crossed
    )


def test_no_import_circles():
    graph = import_graph()
    found = circles(graph)
    lines = [
        f"{m}:{line} imports {t}"
        for c in found
        for m in sorted(c)
        for t, line in graph[m].items()
        if t in c
    ]
    assert not found, "modules that import each other (through packages too):\n" + "\n".join(lines)


def test_the_walk_sees_lazy_type_checking_relative_and_started_imports(tmp_path):
    pkg = tmp_path / "medusa"
    files = {
        "__init__.py": "",
        "low/__init__.py": "from medusa.low import base\n",
        "low/base.py": "from . import other\n",
        "low/other.py": "",
        "high.py": "def f():\n    import medusa.low.base\n",
        "hint.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from medusa import high\n",
        "starter.py": 'NAME = "medusa.hint"\ndef f():\n    python_module(NAME)\n'
        '    return ["python", "-m", "medusa.high"]\n',
        "a.py": "import medusa.b\n",
        "b.py": "def f():\n    from medusa.a import x\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg, started=True)
    assert graph["medusa.high"] == {"medusa.low.base": 2, "medusa.low": 2}  # and its package
    assert graph["medusa.low.base"] == {"medusa.low.other": 1}  # not its own package
    assert graph["medusa.hint"] == {"medusa.high": 3}
    assert graph["medusa.starter"] == {"medusa.hint": 3, "medusa.high": 4}
    assert "medusa.starter" not in import_graph(pkg)["medusa.starter"]
    assert circles(import_graph(pkg)) == [{"medusa.a", "medusa.b"}]

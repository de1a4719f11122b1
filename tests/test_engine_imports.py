"""The engine depends on no research system: no module under medusa/engine/ imports Weaver, Prism,
C2C or Tessera, at its top or inside a function, by absolute or relative name (they plug into the
engine's seams instead: medusa.plugins, medusa.engine.step_hooks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "medusa" / "engine"
RESEARCH = ("medusa.weaver", "medusa.prism", "medusa.c2c", "medusa.tessera")


def package_of(path: Path) -> list[str]:
    """The package a relative import in `path` starts from."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1]


def imported(source: str, package: list[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, relative ones resolved from `package`;
    `from pkg import x` counts as pkg.x too (x may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def research(names: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [
        (n, m) for n, m in names if m in RESEARCH or m.startswith(tuple(p + "." for p in RESEARCH))
    ]


def test_no_engine_module_imports_a_research_system():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 10  # the walk found the engine
    bad = [
        f"{f.relative_to(ROOT)}:{line}: {name}"
        for f in files
        for line, name in research(imported(f.read_text(), package_of(f)))
    ]
    assert not bad, "the engine imports a research system:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "where", "names"),
    [
        (
            "from medusa.prism.kv_cache import ElasticKV",
            "medusa/engine/x.py",
            "medusa.prism.kv_cache",
        ),
        ("def f():\n    import medusa.weaver.hot as h", "medusa/engine/x.py", "medusa.weaver.hot"),
        ("def f():\n    from ..c2c import alpha_tuner", "medusa/engine/x.py", "medusa.c2c"),
        ("from ... import tessera", "medusa/engine/loader/x.py", "medusa.tessera"),
        ("from .. import prism", "medusa/engine/x.py", "medusa.prism"),
        ("import medusa.c2c", "medusa/engine/x.py", "medusa.c2c"),
    ],
)
def test_the_walk_finds_every_form_of_import(source, where, names):
    """The check itself: each form of import of a research system is caught, lazy and relative
    ones included, and the engine's own imports are not."""
    text = source + "\nfrom .config import EngineConfig\nfrom medusa.engine import sequence\n"
    hits = [m for _, m in research(imported(text, package_of(ROOT / where)))]
    assert names in hits
    assert not [m for m in hits if m.startswith("medusa.engine")]

"""medusa/env.py is the one list of MEDUSA_* variables: every one declared there is in env.ALL."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from medusa import env


def test_every_declared_variable_is_listed_once():
    declared = {v.name for v in vars(env).values() if isinstance(v, env.EnvVar)}
    listed = [v.name for v in env.ALL]
    assert sorted(listed) == sorted(declared)
    assert all(name.startswith("MEDUSA_") for name in listed)


_ROOT = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"""["'](MEDUSA_[A-Z0-9_]*[A-Z0-9])["']""")  # a quoted name: a variable


def _sources() -> list[Path]:
    files = list((_ROOT / "medusa").rglob("*.py"))
    for folder in ("csrc", "interpose", "runtime"):
        files += [p for p in (_ROOT / folder).rglob("*") if p.suffix in (".c", ".h", ".cu", ".cpp")]
    return files


def test_every_variable_the_code_names_is_declared():
    declared = {v.name for v in env.ALL}
    named = {
        f"{m.group(1)} ({p.relative_to(_ROOT)})"
        for p in _sources()
        for m in _NAME.finditer(p.read_text(errors="replace"))
        if m.group(1) not in declared
    }
    assert named == set(), "declare these in medusa/env.py (and env.ALL)"


def _reads_a_medusa_variable(node: ast.AST) -> bool:
    """os.environ.get("MEDUSA_..."), os.getenv("MEDUSA_..."), os.environ["MEDUSA_..."] read."""
    key: ast.AST | None = None
    if isinstance(node, ast.Call) and node.args:
        f = ast.unparse(node.func)
        if f in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
            key = node.args[0]
    elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        if ast.unparse(node.value) in ("os.environ", "environ"):
            key = node.slice
    return (
        isinstance(key, ast.Constant)
        and isinstance(key.value, str)
        and key.value.startswith("MEDUSA_")
    )


def test_the_package_reads_medusa_variables_through_env_only():
    readers = [
        f"{p.relative_to(_ROOT)}:{n.lineno}"
        for p in (_ROOT / "medusa").rglob("*.py")
        if p.name != "env.py"
        for n in ast.walk(ast.parse(p.read_text()))
        if _reads_a_medusa_variable(n)
    ]
    assert readers == [], "read these through medusa.env (EnvVar.get)"

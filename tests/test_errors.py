"""One error tree: every error Medusa defines is a MedusaError, on the branch that says what the
caller should do; the command line prints one as a message, not a traceback."""

from __future__ import annotations

import functools
import importlib
import inspect
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import medusa
from medusa.artifact import load_artifact
from medusa.cli import _InOrder
from medusa.errors import (
    BusyError,
    EngineDeadError,
    FallbackError,
    MedusaError,
    RefusedError,
)

# Modules that import an optional extra at the top; their errors are checked where it is installed.
_EXTRAS = ("ray", "vllm")


@functools.cache
def _our_exceptions() -> dict[str, type[BaseException]]:
    """Every public exception class defined under medusa/, by dotted name (walked once)."""
    found: dict[str, type[BaseException]] = {}
    root = Path(medusa.__file__).parent
    for path in sorted(root.rglob("*.py")):  # every file: some packages have no __init__.py
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            if e.name and e.name.split(".")[0] in _EXTRAS:
                continue
            raise
        for cls_name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == name
                and not cls_name.startswith("_")
            ):
                found[f"{name}.{cls_name}"] = obj
    return found


def test_every_error_medusa_defines_is_a_medusa_error() -> None:
    found = _our_exceptions()
    assert len(found) >= 25, sorted(found)  # the walk reached the package
    strays = sorted(name for name, cls in found.items() if not issubclass(cls, MedusaError))
    assert strays == [], f"not under MedusaError: {strays}"


@pytest.mark.parametrize(
    ("name", "branch"),
    [
        ("medusa.artifact.errors.ArtifactError", RefusedError),
        ("medusa.trace.validate.TraceError", RefusedError),
        ("medusa.engine.loader.errors.ModelError", RefusedError),
        ("medusa.restore.restorer.RestoreError", FallbackError),
        ("medusa.weights.errors.WeightStoreError", FallbackError),
        ("medusa.serve.gateway.errors.Unavailable", BusyError),
        ("medusa.prism.pages.OutOfPages", BusyError),
        ("medusa.serve.async_engine.EngineFailed", EngineDeadError),
    ],
)
def test_an_error_sits_on_the_branch_that_says_what_to_do(name: str, branch: type) -> None:
    found = _our_exceptions()
    cls = next((c for n, c in found.items() if n.rsplit(".", 1)[1] == name.rsplit(".", 1)[1]), None)
    assert cls is not None, f"{name} is gone; update this test to its new home"
    assert issubclass(cls, branch)


def test_errors_keep_the_builtin_base_callers_caught() -> None:
    found = {n.rsplit(".", 1)[1]: c for n, c in _our_exceptions().items()}
    assert issubclass(found["ArtifactError"], ValueError)
    assert issubclass(found["RestoreError"], RuntimeError)
    assert issubclass(found["LinkError"], ConnectionError)


def test_an_error_that_escapes_a_command_is_printed_as_a_message(tmp_path: Path) -> None:
    broken = tmp_path / "art"
    broken.mkdir()
    (broken / "manifest.json").write_text("{}")

    group = _InOrder()

    @group.command()
    def show() -> None:
        load_artifact(broken)  # a command that does not catch what it calls

    result = CliRunner().invoke(group, ["show"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ")
    assert str(broken) in result.output
    assert "Traceback" not in result.output


def test_a_click_usage_error_is_not_taken_for_ours() -> None:
    group = _InOrder()

    @group.command()
    @click.option("--n", type=int)
    def count(n: int) -> None:  # pragma: no cover - click refuses the option first
        raise AssertionError

    result = CliRunner().invoke(group, ["count", "--n", "x"])
    assert result.exit_code == 2 and "Invalid value for '--n'" in result.output

"""The kit brings what the GPU checks import and the lent machine's image lacks: the closure of
the package's dependencies through each wheel's Requires-Dist, stopped at the image's packages,
without extras, without what no check imports. (Building a real kit needs PyPI: .ci/run's
scripts/gpu/offline_check.sh does it.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

LIB = Path(__file__).parents[2] / "scripts" / "gpu" / "lib"


@pytest.fixture
def kit(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(LIB))
    import kit  # scripts/gpu/lib/kit.py

    yield kit
    sys.modules.pop("kit", None)
    sys.modules.pop("kit_parts", None)


def test_the_closure_stops_at_the_image_and_follows_no_extras(kit):
    R = kit.Requirement
    image = {"click": None, "typing-extensions": None, "numpy": "2.0.0", "anyio": "3.0.0"}
    dists = {
        "uvicorn": {"version": "0.54.0", "requires_dist": [
            "click>=7.0", "h11>=0.8", "uvloop>=0.15; extra == 'standard'",
            "typing-extensions>=4.0; python_version < '3.11'"]},
        "h11": {"version": "0.16.0"},
        "pydantic": {"version": "2.14.4", "requires_dist": [
            "pydantic-core==2.50.5", "typing-extensions>=4.16.0"]},
        "pydantic-core": {"version": "2.50.5", "requires_dist": ["typing-extensions>=4.16.0"]},
        "starlette": {"version": "1.10.0", "requires_dist": ["anyio<5,>=4.0.0", "numpy"]},
        "anyio": {"version": "4.16.0"}, "click": {"version": "8.5.1"},
        "typing-extensions": {"version": "4.16.0"}, "numpy": {"version": "2.0.0"},
        "cryptography": {"version": "46.0.0"},
    }  # fmt: skip
    roots = [R("uvicorn"), R("pydantic>=2"), R("starlette"), R("cryptography>=42")]
    needed, fallback = kit.closure(roots, dists, image)
    # anyio: the image's known 3.0.0 is below starlette's bound; numpy 2.0.0 satisfies
    assert needed == {
        "uvicorn": "0.54.0",
        "h11": "0.16.0",
        "pydantic": "2.14.4",
        "pydantic-core": "2.50.5",
        "starlette": "1.10.0",
        "anyio": "4.16.0",
    }
    # image packages of unknown version that the closure bounds: brought, used only if too old
    assert fallback == {"click": "8.5.1", "typing-extensions": "4.16.0"}


def test_the_roots_are_the_dependencies_the_image_lacks(kit):
    image = kit.read_image()
    roots = {kit.canon(r.name): r for r in kit.roots(image)}
    assert {"fastapi", "uvicorn", "pydantic", "zstandard", "gguf"} <= roots.keys()
    assert "cryptography" not in roots  # only --sign/--trust import it
    assert not roots["uvicorn"].extras
    assert not roots.keys() & image.keys()


def test_a_bad_image_line_names_the_line(kit, tmp_path):
    bad = tmp_path / "image.txt"
    bad.write_text("torch==2.11.0\ntorch >= 2\n")
    with pytest.raises(kit.KitError, match=r"image.txt:2: 'torch >= 2' is not 'name' or"):
        kit.read_image(bad)

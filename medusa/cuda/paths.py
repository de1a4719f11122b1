"""Where the built C libraries and the CUDA headers they were compiled against are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from medusa import env

_DIST = "medusa-coldstart"


def _candidates() -> Iterator[Path]:
    if env.LIB_DIR.get():
        yield Path(env.LIB_DIR.get())
    yield Path(__file__).resolve().parent.parent / "_lib"
    # NOTE: only when the package's own directory has none (a source checkout): importing
    # importlib.metadata costs 20 ms of every worker's start.
    from importlib import metadata

    try:
        yield Path(str(metadata.distribution(_DIST).locate_file("medusa/_lib")))
    except metadata.PackageNotFoundError:
        pass


@cache
def lib_dir() -> Path:
    """The directory holding libsimcuda.so; raises with the fix when there is none."""
    tried = []
    for d in _candidates():
        tried.append(d)
        if (d / "libsimcuda.so").is_file():
            return d
    raise FileNotFoundError(
        "libsimcuda.so was not found in "
        + ", ".join(str(d) for d in tried)
        + ". Install the package (`pip install .` in the repository) or set MEDUSA_LIB_DIR."
    )


def library(name: str) -> Path:
    path = lib_dir() / f"lib{name}.so"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the package")
    return path


@cache
def build_info() -> dict[str, object]:
    """How the C libraries were built: CUDA header directory and source, compiler."""
    info: dict[str, object] = json.loads((lib_dir() / "build_info.json").read_text())
    return info


def include_dirs() -> list[Path]:
    """Headers a C program needs to use simcuda: NVIDIA's, then simcuda's own."""
    return [Path(str(build_info()["cuda_include_dir"])), lib_dir() / "include"]

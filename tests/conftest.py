from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from medusa import env
from medusa.cuda.toolchain import compile_program
from medusa.serve.gateway.private_dir import shm_dir
from tests.docs.materialized import Materialized
from tests.processes import ENGINE_OPTS, clean_env, without_medusa

PROGRAMS = Path(__file__).parent / "cuda" / "programs"

# The suite runs with simcuda's race checker on, in this process (libsimcuda reads it when it
# loads) and in every process a test starts: a missing wait between streams fails the test.
# The children keep it (and the schedule seed): tests.processes.SUITE_SIM.
os.environ.setdefault(env.SIM_RACECHECK.name, "1")


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cprogs")


@pytest.fixture(scope="session")
def cprog(build_dir: Path) -> Callable[..., Path]:
    """Compiles tests/cuda/programs/<name>.c against simcuda and its test kernels."""

    def build(name: str, **kw: object) -> Path:
        libs = kw.pop("libs", ("simcuda", "simcuda_testkernels"))
        src_dir = Path(kw.pop("src_dir", PROGRAMS))  # type: ignore[arg-type]
        return compile_program(src_dir / f"{name}.c", build_dir, libs=libs, **kw)  # type: ignore[arg-type]

    return build


@pytest.fixture(scope="session")
def run() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs a program with extra environment; fails the test on a crash or non-zero exit."""

    def go(
        prog: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        full_env = without_medusa(os.environ, "MEDUSA_SIM_")
        full_env.update(env or {})
        res = subprocess.run(
            [str(prog), *args], env=full_env, capture_output=True, text=True, timeout=120
        )
        if check and res.returncode != 0:
            raise AssertionError(f"{prog.name} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
        return res

    return go


def lines(out: str) -> dict[str, str]:
    """'label: value' lines of a program's output, as a dict."""
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


@pytest.fixture(scope="session")
def engine_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 materialized with ENGINE_OPTS, once per session."""
    out = tmp_path_factory.mktemp("art") / "smollm2"
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "materialize", *ENGINE_OPTS, "--out", str(out)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert "decode  3, batch sizes [4, 2, 1]" in res.stdout
    assert "prefill 2, tokens [128, 64]" in res.stdout  # the default buckets
    return out


@pytest.fixture(scope="session")
def materialized(tmp_path_factory: pytest.TempPathFactory) -> Materialized:
    """The `medusa materialize` commands docs pages and tests run word for word, each run once
    a session (tests/docs/materialized.py)."""
    return Materialized(tmp_path_factory.mktemp("materialized"))


@pytest.fixture
def shm_path() -> Iterator[Path]:
    """A fresh private directory (mode 0700) in /dev/shm, removed after the test: where Weaver
    exchange regions go, as a gateway's do. A GPU's driver pins a registered region's pages for
    writing, which Linux (6.5 on) refuses for a file on a disk filesystem (so does simcuda)."""
    d = Path(tempfile.mkdtemp(prefix="medusa-test-", dir=shm_dir()))
    yield d
    shutil.rmtree(d, ignore_errors=True)

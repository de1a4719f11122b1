"""What a new user trips over first: each mistake ends the command at once, with one line that
names the input and the fix, and no traceback."""

from __future__ import annotations

import ctypes.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.child import medusa_cli, python_code
from tests.processes import without_medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def run_medusa(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = without_medusa(os.environ)
    full_env.update(env)
    return subprocess.run(
        medusa_cli(*args), capture_output=True, text=True, timeout=120, env=full_env, cwd=cwd
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_busy_port_is_refused_before_anything_starts():
    with _listening() as other:
        port = other.getsockname()[1]
        res = run_medusa("run", "--demo", "hi", "--port", str(port))
    assert res.returncode == 1
    assert f"port {port} is in use; pass --port" in res.stderr
    assert "assistant:" not in res.stdout  # never another server's answer
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("model", ["some-unknown-model", "/tmp/no_such_model.gguf"])
def test_run_with_a_model_that_does_not_exist_exits_with_the_fix(model):
    res = run_medusa("run", model, "--port", "1")
    assert res.returncode == 1
    assert f"{model}: does not exist; pass 'smollm2', a .gguf file" in res.stderr
    assert "Traceback" not in res.stderr


def test_run_with_a_missing_artifact_directory_exits(tmp_path):
    missing = tmp_path / "nope"
    res = run_medusa("run", "--artifact", str(missing))
    assert res.returncode == 1
    assert f"--artifact {missing}: no such directory" in res.stderr
    assert "medusa materialize" in res.stderr


def test_a_model_that_fails_to_load_ends_the_server(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    res = run_medusa("run", str(bad), "--port", str(_free_port()))
    assert res.returncode == 1
    assert "medusa run: the engine failed to start" in res.stderr
    assert str(bad) in res.stderr
    assert "Traceback" not in res.stderr


def test_materialize_names_a_missing_model_before_recording():
    res = run_medusa("materialize", "/tmp/no_such_model.gguf")
    assert res.returncode == 1
    assert "/tmp/no_such_model.gguf: does not exist" in res.stderr
    assert "recording" not in res.stderr and "Traceback" not in res.stderr


def test_require_artifact_prints_the_reason_without_a_traceback(tmp_path):
    res = run_medusa(
        "run", "--artifact", str(tmp_path), "--require-artifact", "--port", str(_free_port())
    )
    assert res.returncode == 3
    assert "no manifest.json" in res.stderr and "--require-artifact" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(
    ctypes.util.find_library("cuda") is not None, reason="this machine has a CUDA driver"
)
def test_cuda_without_a_driver_says_so():
    res = run_medusa("doctor", MEDUSA_DEVICE="cuda")
    assert res.returncode == 1
    assert "no CUDA driver" in res.stderr and "MEDUSA_DEVICE=sim" in res.stderr


def test_demo_prints_the_answer_and_keeps_stderr_quiet():
    res = run_medusa("run", "--demo", "What is the capital of France?", "--port", str(_free_port()))
    assert res.returncode == 0, res.stderr
    assert "assistant: " in res.stdout and "Paris" in res.stdout
    assert res.stderr == ""


def test_children_import_the_same_medusa_wherever_they_start(tmp_path):
    """A directory holding another `medusa` (a checkout, say) must not take over a child."""
    (tmp_path / "medusa").mkdir()
    (tmp_path / "medusa" / "__init__.py").write_text("raise SystemExit('wrong medusa imported')\n")
    res = subprocess.run(
        python_code("import medusa; print(medusa.__file__)"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    import medusa

    assert res.stdout.strip() == medusa.__file__
    assert run_medusa("--version", cwd=tmp_path).returncode == 0


def test_help_lists_commands_in_the_order_a_user_runs_them():
    out = run_medusa("--help").stdout
    commands = [line for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert [line.split()[0] for line in commands][:4] == ["doctor", "run", "materialize", "gateway"]
    assert not [line for line in commands if line.endswith("...")]  # no summary cut short
    assert "medusa run --artifact DIR" in out


def test_the_restore_re_exec_imports_this_medusa_and_leaves_no_trace_behind(tmp_path):
    """`run --artifact` re-executes itself under the recorder: from a directory holding another
    `medusa`, the child still runs this one, and its restore trace is removed when it stops."""
    (tmp_path / "medusa").mkdir()
    (tmp_path / "medusa" / "__init__.py").write_text("raise SystemExit('wrong medusa imported')\n")
    empty = tmp_path / "not-an-artifact"
    empty.mkdir()
    res = run_medusa(
        "run", "--artifact", str(empty), "--require-artifact", "--port", str(_free_port()),
        cwd=tmp_path, TMPDIR=str(tmp_path),
    )  # fmt: skip
    assert res.returncode == 3, res.stderr
    assert "wrong medusa" not in res.stderr and "no manifest.json" in res.stderr
    assert not list(tmp_path.glob("medusa-restore-*"))


def test_a_benchmark_asked_for_help_prints_it_instead_of_running():
    bench = Path(__file__).parents[2] / "scripts" / "bench" / "simcuda.py"
    res = subprocess.run(
        [sys.executable, str(bench), "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and res.stdout.startswith("usage:")
    assert "median" not in res.stdout.split("\n\n", 1)[0]  # the usage line, not a result table

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
from tests.docs.session import Session
from tests.processes import GENERAL, materialize_general, without_medusa

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


def test_a_long_prompt_is_refused_naming_the_flag_that_takes_it_and_that_flag_does():
    long_prompt = "word " * 700  # over 511 tokens: one step's budget at default settings
    args = ("run", "--demo", long_prompt, "--enforce-eager", "--port", str(_free_port()))
    res = run_medusa(*args)
    assert res.returncode == 1
    assert (
        "this engine takes at most 511 (max_model_len=2048, max_num_batched_tokens=512): start "
        "it with --max-prefill-chunk 512 (models.yaml: engine: {max_prefill_chunk: 512}) to "
        "prefill prompts of up to 2047 tokens in chunks" in res.stderr
    )
    chunked = run_medusa(*args, "--max-prefill-chunk", "512")
    assert chunked.returncode == 0, chunked.stderr
    assert "assistant:" in chunked.stdout


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


# --- the command line behaves as click users expect -------------------------------------------


@pytest.mark.parametrize("command", ["run", "materialize"])
def test_a_mistyped_option_is_named_with_the_closest_real_one(command):
    from click.testing import CliRunner

    from medusa.cli import main

    res = CliRunner().invoke(main, [command, "--max-seqs", "4"])
    assert res.exit_code == 2
    assert "No such option '--max-seqs'" in res.output and "--max-num-seqs" in res.output


def test_vllm_arguments_follow_the_double_dash():
    from click.testing import CliRunner

    from medusa.cli import main

    res = CliRunner().invoke(main, ["run", "--engine", "vllm", "--trust-remote-code"])
    assert res.exit_code == 2 and "No such option '--trust-remote-code'" in res.output
    # the reference engine's own --tensor-parallel-size: vLLM's goes after --
    res = CliRunner().invoke(main, ["run", "--engine", "vllm", "--tensor-parallel-size", "2"])
    assert res.exit_code == 2 and "--tensor-parallel-size: the reference engine's" in res.output
    assert "pass vLLM's own after --" in res.output
    usage = " ".join(CliRunner().invoke(main, ["run", "-h"]).output.split())
    assert (
        "arguments after -- go to vllm serve: medusa run --engine vllm MODEL -- --seed 3" in usage
    )


@pytest.mark.e2e
def test_materialize_into_an_unwritable_place_says_where_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = run_medusa("materialize", "--out", str(blocker / "art"))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"Error: --out {blocker / 'art'}: cannot write there ({blocker} is not a directory); "
        "pass --out a directory you can write"
    ]


@pytest.mark.e2e
def test_gateway_on_a_busy_port_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "models.yaml").write_text(
        "models:\n  m: {}\nslices: [{name: s0, memory_gb: 2, sms: 8}]\nwarm_pool: 1\n"
    )
    with _listening() as other:
        port = other.getsockname()[1]
        res = run_medusa("gateway", "--config", str(tmp_path / "models.yaml"), "--port", str(port))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [f"Error: port {port} is in use; pass --port"]


# --- models.yaml: typed, unknown keys refused, slices inline or in a file ---------------------


def test_models_yaml_takes_slices_inline_or_from_a_file(tmp_path):
    from medusa.serve.gateway.config import load_config
    from medusa.serve.gateway.slices import simulated_slices

    inline = tmp_path / "inline.yaml"
    inline.write_text(
        "models:\n  m: {}\nslices: [{name: s0, memory_gb: 2, sms: 8}, {profile: 1g.12gb}]\n"
    )
    (tmp_path / "slices.yaml").write_text(
        "slices: [{name: s0, memory_gb: 2, sms: 8}, {profile: 1g.12gb}]\n"
    )
    listed = tmp_path / "file.yaml"
    listed.write_text("models:\n  m: {}\nslices: slices.yaml\n")
    for cfg in (inline, listed):
        found = simulated_slices(load_config(cfg).slices)
        assert [(s.id, s.kind) for s in found] == [("s0", "2gb.8sm"), ("sim1", "1g.12gb")]


def test_an_unknown_engine_setting_in_models_yaml_names_it_and_the_known_ones(tmp_path):
    from medusa.serve.gateway.config import ConfigError, load_config

    cfg = tmp_path / "models.yaml"
    cfg.write_text("models:\n  m: {engine: {max_seqs: 4}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert "models.m.engine: unknown setting(s) ['max_seqs']; known: [" in str(e.value)
    assert "'max_num_seqs'" in str(e.value) and "'block_size'" in str(e.value)
    cfg.write_text("models:\n  m: {engine: {block_size: 12}}\n")
    with pytest.raises(ConfigError, match=r"models\.m\.engine: block_size=12: use a power of two"):
        load_config(cfg)
    cfg.write_text(
        "models:\n  m: {engine: {block_size: 32, capture_sizes: [1, 2], kv_memory: elastic,"
        " serve_while_loading: true, enforce_eager: false, prefill_graph_sizes: []}}\n"
    )
    args = load_config(cfg).models["m"].worker_args()
    assert args == ["--block-size", "32", "--capture-sizes", "1,2", "--kv-memory", "elastic",
                    "--prefill-graph-sizes", "", "--serve-while-loading"]  # fmt: skip


# --- the artifact decides ----------------------------------------------------------------------

HOST_EXAMPLE = "medusa materialize --weights host --max-num-seqs 4 --out a"


@pytest.fixture(scope="module")
def host_artifact(tmp_path_factory, materialized) -> Path:
    """The issue's example, docs/materialize.md's `medusa materialize --weights host
    --max-num-seqs 4 --out a`, run as that page runs it (once a session, for both)."""
    root = tmp_path_factory.mktemp("unit")
    status, printed = Session(root, [], materialized).execute(HOST_EXAMPLE)
    assert status == 0, printed
    return root / "a"


@pytest.mark.e2e
def test_run_artifact_restores_with_the_artifacts_settings_and_no_flag(host_artifact):
    res = run_medusa("run", "--artifact", str(host_artifact), "--demo", "hi",
                     "--port", str(_free_port()), MEDUSA_LOG_LEVEL="INFO")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "assistant: " in res.stdout and "graph_restore" in res.stdout
    assert ", restored)" in res.stderr and "artifact not used" not in res.stderr


@pytest.mark.e2e
def test_a_flag_the_artifact_decides_otherwise_is_refused_before_start_up(host_artifact):
    res = run_medusa("run", "--artifact", str(host_artifact), "--demo", "hi",
                     "--max-num-seqs", "8", "--port", str(_free_port()))  # fmt: skip
    assert res.returncode == 2 and res.stdout == ""
    assert (
        f"Error: --max-num-seqs 8: the artifact {host_artifact} was materialized with "
        "max_num_seqs 4; drop --max-num-seqs (the artifact's 4 is used), or materialize again "
        "with --max-num-seqs 8 (or pass --allow-fallback to start the normal way with it)"
    ) in res.stderr
    same = run_medusa("run", "--artifact", str(host_artifact), "--weights", "device",
                      "--port", str(_free_port()))  # fmt: skip
    assert same.returncode == 2 and "--weights device: the artifact" in same.stderr


@pytest.mark.e2e
def test_allow_fallback_starts_the_normal_way_with_the_flags_given(host_artifact):
    res = run_medusa("run", "--artifact", str(host_artifact), "--demo", "hi", "--allow-fallback",
                     "--enforce-eager", "--port", str(_free_port()))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "assistant: " in res.stdout and "graph_restore" not in res.stdout
    assert (
        "artifact not used, starting the normal way: engine configuration mismatch: "
        "enforce_eager=True here, False when materialized" in res.stderr
    )


@pytest.mark.e2e
def test_inspect_prints_the_settings_the_artifact_runs_with(host_artifact):
    res = run_medusa("inspect", str(host_artifact))
    assert res.returncode == 0, res.stderr
    assert "runs with model smollm2 (the default), loaded from its weight store" in res.stdout
    assert "weights host, max_num_seqs 4, max_model_len 2048," in res.stdout


@pytest.mark.e2e
def test_the_gateway_takes_the_artifacts_settings_from_artifact_alone(tmp_path, host_artifact):
    from medusa.serve.gateway.config import ConfigError, load_config

    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"models:\n  m: {{artifact: {host_artifact}}}\n")
    m = load_config(cfg).models["m"]
    assert m.engine["weights"] == "host" and m.engine["max_num_seqs"] == 4
    assert m.worker_args()[:2] == ["--artifact", str(host_artifact)]
    assert "--max-num-seqs" in m.worker_args() and "host" in m.worker_args()
    # on an elastic slice the worker needs kv_memory elastic: it starts the normal way, as before
    shared = m.worker_args({"kv_memory": "elastic"})
    assert "--allow-fallback" in shared and shared[shared.index("--kv-memory") + 1] == "elastic"
    cfg.write_text(f"models:\n  m: {{artifact: {host_artifact}, engine: {{max_num_seqs: 8}}}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert str(e.value).startswith(
        f"{cfg}: models.m.engine.max_num_seqs 8: the artifact {host_artifact} was materialized "
        "with max_num_seqs 4; drop models.m.engine.max_num_seqs (the artifact's 4 is used), or "
        "materialize again with --max-num-seqs 8"
    )


# --- help reads as written ----------------------------------------------------------------------


def test_a_python_m_program_names_itself_as_it_is_run():
    res = subprocess.run(
        [sys.executable, "-m", "medusa.weaver.pair", "--help"],
        capture_output=True, text=True, timeout=60, env=without_medusa(os.environ),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python -m medusa.weaver.pair ")


def test_a_command_program_restores_under_medusa_trace_record_as_the_readme_says(tmp_path):
    art = tmp_path / "art"
    materialize_general(GENERAL, art)
    bare = subprocess.run(
        [sys.executable, str(GENERAL), "restore", str(art)],
        capture_output=True, text=True, timeout=120, env=without_medusa(os.environ),
    )  # fmt: skip
    assert bare.returncode == 1
    assert "start it with `medusa trace record --mode restore -o restore-%p.mtr -- COMMAND`" in (
        bare.stderr
    )
    trace = str(tmp_path / "restore-%p.mtr")
    res = run_medusa("trace", "record", "--mode", "restore", "-o", trace, "--",
                     sys.executable, str(GENERAL), "restore", str(art))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:2] == ["y", "24480.00"]  # what the recorded run computes


# --- long steps say they started -----------------------------------------------------------------


# python -m medusa.weaver.pair's lines: tests/weaver/test_pair.py (one run of it checks both).

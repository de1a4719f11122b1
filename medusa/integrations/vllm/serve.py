"""`medusa run --engine vllm --artifact DIR`: `vllm serve` with the plugin restoring from DIR."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from medusa.artifact.store import ArtifactError, read_manifest
from medusa.integrations.vllm.materialize import strip_kv_size
from medusa.trace import recorder_env


def _vllm_cli() -> list[str]:
    exe = Path(sys.executable).with_name("vllm")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("vllm")
    if found:
        return [found]
    return [sys.executable, "-c", "from vllm.entrypoints.cli.main import main; main()"]


def recorded_argv(artifact: Path, trust: str | None = None) -> list[str]:
    """The vLLM arguments the artifact was materialized with, less the KV size (the plugin sets
    that from the artifact once it has checked the memory is free).

    NOTE: these arguments reach `vllm serve` (--trust-remote-code, another model...): the manifest
    is read with every check its loader makes, signature included when `trust` names a key."""
    manifest = read_manifest(artifact, trust)
    if manifest["kind"] != "vllm":
        raise ArtifactError(
            f"{artifact} is a {manifest.get('kind')!r} artifact; `--engine vllm` needs one made "
            "by `medusa materialize --engine vllm`"
        )
    return strip_kv_size(list(manifest["engine"]["argv"]))


def serve_command(
    artifact: str | None,
    model: str | None,
    extra: list[str],
    host: str,
    port: int,
    require: bool,
    trust: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that serve through vLLM, restoring from artifact."""
    env = dict(os.environ)
    if artifact:
        art = Path(artifact).resolve()
        argv = recorded_argv(art, trust)
        if model and model != argv[0]:
            raise ArtifactError(
                f"{artifact} is for model {argv[0]!r}, not {model!r}: leave MODEL out or "
                "materialize this model"
            )
        trace_dir = tempfile.mkdtemp(prefix="medusa-restore-")
        env = recorder_env(os.path.join(trace_dir, "restore-%p.mtr"), mode="restore", base=env)
        env["MEDUSA_ARTIFACT"] = str(art)
        # A forked child stops recording (and so could not map its allocations): spawn vLLM's
        # engine-core process instead, a fresh process the recorder starts in.
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        if require:
            env["MEDUSA_REQUIRE_ARTIFACT"] = "1"
        if trust:
            env["MEDUSA_TRUST"] = str(Path(trust).resolve())
    elif model:
        argv = [model]
    else:
        raise ArtifactError("name a MODEL or an --artifact to serve through vLLM")
    cmd = [*_vllm_cli(), "serve", *argv, *extra, "--host", host, "--port", str(port)]
    return cmd, env

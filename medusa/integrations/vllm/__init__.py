"""Medusa as a vLLM general plugin (`vllm.general_plugins` entry point `medusa`).

In every vLLM process the plugin marks the worker's start-up phases for the recorder. Two
environment variables turn on the rest (`medusa materialize --engine vllm` and `medusa run
--engine vllm` set them):

- MEDUSA_VLLM_SIDECAR=FILE: record. Captures are numbered, piecewise graph wrappers numbered, and
  the KV size and every captured graph (under its descriptor, with its output tensors) are written
  to FILE for materialize to join with the trace.
- MEDUSA_ARTIFACT=DIR: restore. The KV-cache size comes from the artifact (vLLM skips profiling)
  and GPUModelRunner.capture_model builds the recorded graphs instead of capturing; anything that
  does not fit falls back to a normal capture with the reason logged.

Loading is idempotent: vLLM may call `register` more than once per process. Supported: vLLM 0.32
and 0.33 with the V2 model runner (its default). Before patching anything the plugin checks every
patch point (points.py); a vLLM whose points differ is left alone, with the reason logged.
Nothing the plugin does may end vLLM's start-up: a failure is logged and vLLM starts as usual,
unless MEDUSA_REQUIRE_ARTIFACT=1 makes it an error.
"""

from __future__ import annotations

import logging

from medusa import env
from medusa.errors import RefusedError

log = logging.getLogger("medusa.vllm")
_registered = False


class UnsupportedVllm(RefusedError, RuntimeError):
    """The installed vLLM's patch points are not those the plugin was written against."""


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        _install()
    # NOTE: vLLM calls general plugins unguarded (load_general_plugins): anything raised here
    # would end its start-up, in every process.
    except Exception as e:
        if env.REQUIRE_ARTIFACT.get():
            raise
        log.warning("medusa plugin not installed, vLLM starts as usual: %s", e)


def _install() -> None:
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as e:  # vLLM without its GPU worker (a CPU build): nothing to mark
        log.info("medusa plugin: no GPU worker in this vLLM (%s); phase marks not installed", e)
        return
    from medusa.integrations.vllm.phases import install_phase_marks

    _check_version()
    recording = bool(env.VLLM_SIDECAR.get())
    artifact = env.ARTIFACT.get()
    if recording or artifact:
        from vllm.platforms import current_platform

        from medusa.integrations.vllm.capture import install_graph_wrapper

        if not install_graph_wrapper(current_platform):
            log.warning(
                "medusa plugin: platform %s has its own graph wrapper; piecewise graphs are "
                "neither recorded nor restored",
                type(current_platform).__name__,
            )
    # Order matters: the phase marks go on last, outermost, so a restore runs inside its phase.
    if recording:
        from medusa.integrations.vllm.recording import install_recording

        install_recording(Worker, GPUModelRunner)
    if artifact:
        from medusa.integrations.vllm.kv_size import install_kv_size
        from medusa.integrations.vllm.restore import install_restore

        install_kv_size(Worker, artifact)
        install_restore(GPUModelRunner, artifact)
    install_phase_marks(Worker, GPUModelRunner)


def _check_version() -> None:
    """Refuses a vLLM whose patch points differ; warns about one that was not tested."""
    import vllm

    from medusa.integrations.vllm.points import TESTED, check_patch_points

    problems = check_patch_points()
    if problems:
        raise UnsupportedVllm(
            f"vLLM {vllm.__version__} differs from the versions the plugin supports "
            f"({', '.join(v + 'x' for v in TESTED)}) at: {'; '.join(problems)}"
        )
    if not vllm.__version__.startswith(TESTED):
        log.warning(
            "medusa plugin: vLLM %s has the patch points of %s but was not tested; a restore "
            "that does not fit falls back to a normal start",
            vllm.__version__,
            ", ".join(v + "x" for v in TESTED),
        )

"""Medusa as a vLLM general plugin (`vllm.general_plugins` entry point `medusa`).

In every vLLM process the plugin marks the worker's start-up phases for the recorder, so that
`medusa materialize --engine vllm` sees them; with MEDUSA_ARTIFACT set it takes the KV-cache size
from the artifact (after checking free memory) so vLLM skips its profiling pass. Loading is
idempotent: vLLM may call `register` more than once per process.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("medusa.vllm")
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from medusa.integrations.vllm.phases import install_phase_marks

    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as e:  # vLLM without its GPU worker (a CPU build): nothing to mark
        log.info("medusa plugin: no GPU worker in this vLLM (%s); phase marks not installed", e)
        return
    install_phase_marks(Worker)
    if os.environ.get("MEDUSA_ARTIFACT"):
        from medusa.integrations.vllm.restore import install_kv_size

        install_kv_size(Worker, os.environ["MEDUSA_ARTIFACT"])

"""The research systems' plug-ins for the engine's seams, registered in one place. The engine
imports none of them; an engine whose config names one (kv_memory="elastic": Prism's elastic KV
cache) refuses to start until it is registered. A process that builds engines from a
configuration it was given calls `register()` first: `medusa run`, the start-up `medusa
materialize` records, Tessera's processes. Layer: with the research packages it imports."""

from __future__ import annotations

from medusa.engine.kv_cache import register_kv_cache
from medusa.prism.kv_cache import ElasticKV


def register() -> None:
    """Registers every plug-in an EngineConfig can name; calling it again changes nothing."""
    register_kv_cache("elastic", ElasticKV)

"""The research systems' plug-ins for the engine's seams, registered in one place. The engine
imports none of them; an engine whose config names one (kv_memory="elastic": Prism's elastic KV
cache; tune_alpha: C2C's alpha tuner, a step hook) refuses to start until it is registered. A
process that builds engines from a configuration it was given calls `register()` first: `medusa
run`, the start-up `medusa materialize` records, Tessera's processes. Layer: with the research
packages it imports. (Weaver's hooks are not named by a config: medusa.weaver.hot pairs an engine,
medusa.weaver.cold makes one a receiver.)"""

from __future__ import annotations

from medusa.c2c.alpha_tuner import AlphaTuner
from medusa.engine.kv_cache import register_kv_cache
from medusa.engine.step_hooks import register_step_hook
from medusa.prism.kv_cache import ElasticKV


def register() -> None:
    """Registers every plug-in an EngineConfig can name; calling it again changes nothing."""
    register_kv_cache("elastic", ElasticKV)
    register_step_hook("alpha_tuner", AlphaTuner.for_engine)

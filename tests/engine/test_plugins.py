"""The engine stands alone: in a process that imported only the engine, a configuration naming a
research system's plug-in is refused before any work, saying what to call, and no research
package was loaded (tests/prism/test_elastic_engine.py starts one registered by medusa.plugins)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ALONE = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
try:
    LLMEngine(EngineConfig(**json.loads(sys.argv[1])))
    error = None
except ValueError as e:
    error = str(e)
research = ("medusa.prism", "medusa.weaver", "medusa.c2c", "medusa.tessera")
loaded = sorted(m for m in sys.modules if m.startswith(research))
print(json.dumps({"error": error, "loaded": loaded}))
"""


def _alone(config: dict[str, object]) -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", ALONE, json.dumps(config)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"kv_memory": "elastic"}, "kv_memory='elastic': no KV cache of that kind is registered"),
        ({"weights": "host", "tune_alpha": True}, "the step hook 'alpha_tuner' is not registered"),
    ],
)
def test_an_unregistered_plugin_is_refused_with_what_to_do(config, says):
    out = _alone(config)
    assert out["loaded"] == []
    assert says in str(out["error"]) and "medusa.plugins.register()" in str(out["error"])

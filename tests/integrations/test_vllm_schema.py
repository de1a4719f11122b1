"""The vLLM section of an artifact round-trips through save/load, and its checks name the fix.
(No vLLM needed.)"""

from __future__ import annotations

import json

import pytest

from medusa.artifact import load_artifact, save_artifact
from medusa.integrations.vllm.schema import check_section, compile_cache_ref, vllm_section


def test_the_vllm_section_round_trips_and_references_the_compile_cache(tmp_path):
    cache = tmp_path / "torch_compile_cache" / "abc"
    cache.mkdir(parents=True)
    (cache / "graph.py").write_text("def f(): pass\n")
    ref = compile_cache_ref(cache)
    graphs = [
        {
            "kind": "full",
            "graph": 0,
            "key": {
                "type": "BatchExecutionDescriptor",
                "fields": {"cg_mode": {"enum": "CUDAGraphMode", "name": "FULL"}, "num_tokens": 8},
            },
        },
        {
            "kind": "piecewise",
            "graph": 1,
            "wrapper": 0,
            "output": {
                "t": "tensor",
                "alloc": 7,
                "offset": 0,
                "dtype": "bfloat16",
                "shape": [8, 576],
                "stride": [576, 1],
                "bytes": 9216,
            },
            "key": {
                "type": "BatchDescriptor",
                "fields": {
                    "num_tokens": 8,
                    "num_reqs": None,
                    "uniform": False,
                    "has_lora": False,
                    "num_active_loras": 0,
                },
            },
        },
    ]
    section = vllm_section(
        version="0.32.0",
        kv_cache_memory_bytes=8 << 30,
        cudagraph_mode="FULL_AND_PIECEWISE",
        graphs=graphs,
        compile_cache=ref,
    )
    manifest = {
        "kind": "vllm",
        "vllm": section,
        "model": {"identity": "vllm:0", "name": "m"},
        "engine": {"name": "vllm", "argv": []},
        "device": {},
        "graphs": {"count": 0, "keys": [], "nodes": 0, "templates": 0},
        "relocations": {},
        "kernels": {"count": 0, "exported": 0, "hidden": 0, "images_saved": 0},
    }
    out = save_artifact(tmp_path / "art", manifest, {"graphs": []}, {})
    back = load_artifact(out).manifest["vllm"]
    assert back == json.loads(json.dumps(section))
    check_section(back, vllm_version="0.32.0")
    with pytest.raises(
        ValueError, match="made with vLLM 0.32.0, this is 0.33.0: materialize again"
    ):
        check_section(back, vllm_version="0.33.0")
    (cache / "graph.py").write_text("def f(): return 1\n")
    assert compile_cache_ref(cache)["sha256"] != ref["sha256"]  # a changed cache is noticed
    with pytest.raises(ValueError, match=r"graphs\[0\]: needs kind"):
        vllm_section(
            version="0.32.0",
            kv_cache_memory_bytes=1,
            cudagraph_mode="FULL",
            graphs=[{"graph": 0}],
            compile_cache=ref,
        )

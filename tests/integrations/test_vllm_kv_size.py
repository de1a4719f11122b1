"""The vLLM plugin's KV size follows the device: an artifact records what profiling measured
outside the KV cache, and a restore subtracts that from the memory vLLM may use on the device it
lands on, with no profiling forward. The rule runs everywhere; the last test runs it inside the
real vLLM's Worker.determine_available_memory (the optional lane)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from medusa.integrations.vllm.kv_size import kv_bytes_for
from medusa.integrations.vllm.schema import check_section
from medusa.restore.errors import RestoreError

GiB = 1 << 30
SECTION = {  # profiled on a device where vLLM could use 8 GiB: 5 GiB outside the KV cache
    "version": 3,
    "vllm_version": "0.32.0",
    "kv_cache_memory_bytes": 3 * GiB,
    "kv_budget": {"requested_memory": 8 * GiB, "non_kv_bytes": 5 * GiB},
}


@pytest.mark.parametrize("requested", [6 * GiB, 8 * GiB, 12 * GiB])
def test_the_kv_size_is_what_the_device_allows_beyond_the_recorded_non_kv_memory(requested):
    kv, how = kv_bytes_for(SECTION, requested, free=requested)
    assert kv == requested - 5 * GiB
    assert "derived without profiling" in how and "5120 MiB outside the KV cache" in how


def test_a_device_with_no_room_beyond_the_model_is_refused_naming_the_sizes():
    with pytest.raises(RestoreError, match=r"may use 5120 MiB .* needs 5120 MiB outside"):
        kv_bytes_for(SECTION, 5 * GiB, free=6 * GiB)


def test_an_artifact_without_a_profiling_record_uses_its_size_only_where_it_is_free():
    old = {k: v for k, v in SECTION.items() if k != "kv_budget"}
    assert kv_bytes_for(old, 8 * GiB, free=4 * GiB)[0] == 3 * GiB
    with pytest.raises(RestoreError, match="needs 3072 MiB, 2048 MiB are free"):
        kv_bytes_for(old, 8 * GiB, free=2 * GiB)


def test_a_damaged_budget_or_an_older_section_is_refused_with_materialize_again():
    with pytest.raises(ValueError, match="kv_budget .* damaged; materialize again"):
        check_section({**SECTION, "kv_budget": {"requested_memory": -1}}, vllm_version="0.32.0")
    with pytest.raises(ValueError, match="version 2; this medusa reads 3: materialize again"):
        check_section({**SECTION, "version": 2}, vllm_version="0.32.0")


# Inside the real vLLM (on its CPU platform): the plugin's size reaches vLLM's own knob before
# vLLM measures, vLLM returns it unchanged and runs no profiling forward (one profile_run, the
# compile warm-up vLLM keeps on that path).
WORKER = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace as NS
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_worker import Worker
    from medusa.integrations.vllm import kv_size

    section = json.loads(sys.argv[1])
    kv_size.open_artifact = lambda path: NS(manifest={"vllm": section})
    torch.cuda.mem_get_info = lambda: (64 << 30, 80 << 30)
    kv_size.install_kv_size(Worker, "/artifact")
    cfg = VllmConfig()
    for requested in map(int, sys.argv[2:]):
        runs = []
        w = NS(cache_config=NS(kv_cache_memory_bytes=None, gpu_memory_utilization=0.9),
               requested_memory=requested, vllm_config=cfg, randomize_dummy_inputs=False,
               model_runner=NS(profile_run=lambda **kw: runs.append(kw)),
               init_snapshot=NS(free_memory=requested, total_memory=requested),
               model_config=NS(multimodal_config=None), parallel_config=NS())
        try:
            print(json.dumps([Worker.determine_available_memory(w), len(runs)]))
        except Exception as e:
            print(json.dumps([type(e).__name__, str(e)]))
""")


@pytest.mark.e2e
def test_the_real_vllm_worker_takes_the_derived_size_without_profiling():
    pytest.importorskip("vllm.v1.worker.gpu_worker")
    sizes = [4 * GiB + 5 * GiB, 8 * GiB, 12 * GiB + 5 * GiB, 5 * GiB]
    res = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(SECTION), *map(str, sizes)],
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "MEDUSA_REQUIRE_ARTIFACT": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = [json.loads(line) for line in res.stdout.strip().splitlines()[-4:]]
    assert out[:3] == [[4 * GiB, 1], [3 * GiB, 1], [12 * GiB, 1]]
    assert out[3][0] == "RestoreError" and "no room is left for a KV cache" in out[3][1]

"""The one rule that sizes the KV cache (medusa.engine.kv_size), for a profiling start and for a
restore alike: what it allocates on devices of several sizes, and the refusal, naming the sizes
and the fixes, when not even one sequence at max_model_len fits."""

from __future__ import annotations

import pytest

from medusa.engine.config import EngineConfig
from medusa.engine.kv_size import KVCacheTooSmall, KVSize, blocks_that_fit

GiB, MiB = 1 << 30, 1 << 20
BLOCK = 737280  # SmolLM2's block of 16 tokens, float32
CONFIG = EngineConfig(max_model_len=2048, gpu_memory_utilization=0.9)


@pytest.mark.parametrize("total", [4 * GiB, 8 * GiB, 12 * GiB])
def test_the_cache_takes_the_share_of_the_device_left_after_what_is_held_and_the_peak(total):
    held, peak = 650 * MiB, 40 * MiB
    num, inputs = blocks_that_fit(CONFIG, BLOCK, free=total - held, total=total, peak=peak)
    assert num == (int(total * 0.9) - held - peak) // BLOCK
    assert inputs["held"] == held and inputs["budget"] == int(total * 0.9) - held - peak


def test_memory_another_tenant_holds_shrinks_the_cache():
    alone, _ = blocks_that_fit(CONFIG, BLOCK, free=7 * GiB, total=8 * GiB, peak=0)
    shared, _ = blocks_that_fit(CONFIG, BLOCK, free=5 * GiB, total=8 * GiB, peak=0)
    assert alone - shared == 2 * GiB // BLOCK or alone - shared == 2 * GiB // BLOCK + 1


def test_a_device_too_small_for_one_sequence_is_refused_naming_the_sizes_and_the_fixes():
    with pytest.raises(KVCacheTooSmall) as e:
        blocks_that_fit(CONFIG, BLOCK, free=200 * MiB, total=1 * GiB, peak=10 * MiB)
    msg = str(e.value)
    assert "fewer than one sequence of max_model_len=2048 needs (128 blocks, 90 MiB)" in msg
    assert "the device has 200 MiB free of 1024 MiB" in msg
    assert "gpu_memory_utilization=0.9 leaves 98 MiB of it, and 100 MiB are needed" in msg
    assert "raise --gpu-memory-utilization, lower --max-model-len" in msg
    assert isinstance(e.value, MemoryError)  # what a profiling start raised before


def test_exactly_one_sequence_fits():
    need = CONFIG.max_blocks_per_seq * BLOCK
    total = 2 * GiB
    held = int(total * 0.9) - need
    num, _ = blocks_that_fit(CONFIG, BLOCK, free=total - held, total=total, peak=0)
    assert num == CONFIG.max_blocks_per_seq
    with pytest.raises(KVCacheTooSmall):
        blocks_that_fit(CONFIG, BLOCK, free=total - held, total=total, peak=1)


def test_the_log_line_says_how_the_size_came_about():
    num, inputs = blocks_that_fit(CONFIG, BLOCK, free=3 * GiB, total=4 * GiB, peak=0)
    line = KVSize(num, BLOCK, "derived", inputs).describe()
    assert line.startswith(f"KV cache {num} blocks x {BLOCK} bytes = ")
    assert "derived from the artifact's profiling peak and this device's free memory" in line
    assert "(3072 MiB free of 4096 MiB, forward-pass peak 0 MiB)" in line
    assert KVSize(10, BLOCK, "restored").describe().endswith("MiB, the artifact's, as recorded")

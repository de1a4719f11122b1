"""The reference engine's decode graph under access recording: the analysis agrees with the
two-run pointer classification on every node, and the KV cache is state carried across steps."""

from __future__ import annotations

import pytest

from medusa.engine.config import EngineConfig
from medusa.tessera import depgraph
from medusa.tessera.accesses import analyze
from medusa.tessera.crosscheck import crosscheck
from medusa.tessera.record import record_engine

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

CONFIG = EngineConfig(
    max_num_seqs=1, capture_sizes=(1,), max_model_len=128, max_num_batched_tokens=32
)


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    return record_engine(CONFIG, tmp_path_factory.mktemp("eng"))


def test_analysis_agrees_with_pointer_classification_on_every_node(engine_runs):
    check = crosscheck(*engine_runs)
    assert check.nodes_checked > 200 and check.nodes_unknown == 0
    assert check.agrees, [str(d) for d in check.disagreements]


def test_the_kv_cache_is_carried_across_steps(engine_runs):
    a, _ = engine_runs
    nodes = analyze(a)[0]
    g = depgraph.build([n.extents if n else None for n in nodes])
    kv = max(
        range(len(a.allocs)),
        key=lambda i: a.allocs[i].size if a.allocs[i].phase == "kv_alloc" else -1,
    )
    assert (0, kv) in g.state
    # every node from the recorded replay, but the GEMMs: from their arguments (API semantics)
    assert all(n.source == ("api" if "sgemm" in n.kernel else "replay") for n in nodes if n)
    assert any(n.source == "api" for n in nodes if n)

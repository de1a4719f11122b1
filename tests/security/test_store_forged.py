# ruff: noqa: F811 - the fixtures come from tests.security._store
"""Finding 12: a forged weight store, re-sealed unsigned (what anyone who can write an unsigned
artifact can make), stopped the worker: spec.num_kv_heads 0 divided by zero, hidden_size 256.0
reached a shape, malformed BPE merges were blamed on the model file. The store's records are now
checked before use and anything wrong with them refuses the store, by name: the worker loads the
model file and answers as a normal start does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.security._store import (  # noqa: F401 - fixtures
    Worker,
    copy_artifact,
    device_artifact,
    expected,
    forge_store,
    tiny_model,
)
from tests.weights.conftest import CONFIG, run_engine

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _spec(**change: Any):  # type: ignore[no-untyped-def]
    def edit(model: dict[str, Any], tokenizer: dict[str, Any]) -> None:
        for key, value in change.items():
            *path, last = key.split("__")
            d = model["spec"]
            for k in path:
                d = d[k]
            if value is ...:
                del d[last]
            else:
                d[last] = value

    return edit


def _tokenizer(**change: Any):  # type: ignore[no-untyped-def]
    def edit(model: dict[str, Any], tokenizer: dict[str, Any]) -> None:
        tokenizer.update(change)

    return edit


FORGED = {
    "no KV heads": (_spec(num_kv_heads=0), "spec.num_kv_heads is 0: expected an integer"),
    "a float size": (_spec(hidden_size=256.0), "spec.hidden_size is 256.0"),
    "a bool count": (_spec(num_layers=True), "spec.num_layers is True"),
    "heads apart": (_spec(num_heads=3), "2 KV heads do not divide 3 heads"),
    "huge vocabulary": (_spec(vocab_size=10**15), "spec.vocab_size is 1000000000000000"),
    "a missing field": (_spec(rms_eps=...), "missing or unknown fields rms_eps"),
    "an unknown field": (_spec(extra=1), "missing or unknown fields extra"),
    "RoPE past the head": (_spec(rope__rot_dim=1024), "spec.rope.rot_dim 1024"),
    "RoPE base 1": (_spec(rope__theta=1.0), "spec.rope.theta is 1.0"),
    "NaN epsilon": (_spec(rms_eps=float("nan")), "spec.rms_eps is nan"),
    "a spec that is a list": (lambda m, t: m.update(spec=[1]), "spec: expected an object"),
    "merges not in pairs": (_tokenizer(merges="a b c\nd"), "not two tokens apart"),
    "merges of unknown tokens": (_tokenizer(merges="zz yy"), "builds no tokenizer"),
    "a JSON tokenizer that is not": (
        _tokenizer(kind="json", json="{", eos_ids=[0], chat_template=None, bos=None, eos=None),
        "builds no tokenizer",
    ),
}


@pytest.fixture(scope="module")
def normal(tiny_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    got, _ = run_engine({**CONFIG, "model": str(tiny_model)}, tmp_path_factory.mktemp("n"))
    return got


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_store_is_refused_by_name_and_the_model_file_used(
    case, tiny_model, device_artifact, normal, tmp_path
):
    edit, reason = FORGED[case]
    art = forge_store(copy_artifact(device_artifact, tmp_path / "art"), edit)
    got, log = run_engine({**CONFIG, "model": str(tiny_model)}, tmp_path, art)
    assert got["store_error"].startswith(str(art / "weights.store")), got["store_error"]
    assert reason in got["store_error"]
    assert "weight store not used, loading the model file" in log
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])
    assert got["restored"], got["restore_error"]  # the device weights' buffers are the same


def test_a_worker_given_a_forged_store_serves_from_the_model_file(
    tiny_model, device_artifact, expected, tmp_path
):
    art = forge_store(copy_artifact(device_artifact, tmp_path / "art"), _spec(num_kv_heads=0))
    with Worker(tiny_model, art, tmp_path) as w:
        assert w.complete() == expected
    assert "spec.num_kv_heads is 0" in w.stop()

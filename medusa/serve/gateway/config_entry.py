"""One model entry of models.yaml: its artifact directory and its `engine:` settings, checked by
building the EngineConfig they make (medusa.serve.gateway.config reads the rest)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from medusa.errors import RefusedError


class ConfigError(RefusedError, ValueError):
    """models.yaml is not valid; the message names the file and the field."""


def artifact_dir(path: Path, where: str, artifact: str | None) -> str | None:
    """A directory, relative to the config file's (first) or to the working directory."""
    if artifact is None:
        return None
    if not (path.parent / artifact).is_dir() and not Path(artifact).is_dir():
        raise ConfigError(
            f"{where}.artifact: {artifact} is not a directory (medusa materialize makes one)"
        )
    if not Path(artifact).is_absolute() and (path.parent / artifact).is_dir():
        return str((path.parent / artifact).resolve())
    return artifact


def engine_settings(
    path: Path, name: str, m: dict[str, Any], artifact: str | None
) -> tuple[str | None, dict[str, Any]]:
    """The model and the `engine:` settings, checked by building the EngineConfig they make;
    with an artifact, its model and the settings it decides (medusa.engine.artifact_settings),
    one given otherwise refused."""
    from medusa.engine.artifact_settings import ArtifactSettings, SettingConflict, Wording, resolve
    from medusa.engine.config import EngineConfig
    from medusa.engine.loader import ModelError

    where, entry = f"{path}: models.{name}", f"models.{name}"
    engine = m.get("engine", {}) or {}
    known = sorted(f.name for f in fields(EngineConfig) if f.name != "model")
    if not isinstance(engine, dict) or set(engine) - set(known):
        bad = sorted(set(engine) - set(known)) if isinstance(engine, dict) else engine
        raise ConfigError(f"{where}.engine: unknown setting(s) {bad}; known: {known}")
    for key in ("capture_sizes", "prefill_graph_sizes"):
        if isinstance(engine.get(key), list):
            engine = {**engine, key: tuple(engine[key])}
    try:
        art = ArtifactSettings.read(artifact) if artifact else None
        words = Wording(lambda key: f"{entry}.engine.{key}", f"{entry}.model")
        model, settings = resolve(art, m.get("model"), dict(engine), set(engine), words)
        EngineConfig(model=model, **settings)
    except SettingConflict as e:
        raise ConfigError(f"{path}: {e}") from None
    except ModelError as e:
        raise ConfigError(f"{where}.model: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}.engine: {e}") from None
    return model, settings


def group_size(where: str, m: dict[str, Any], artifact: str | None) -> int:
    """The model's tensor-parallel group: the artifact's (its manifest's tensor_parallel.size,
    1 for one device), else `tensor_parallel_size`; a field that differs from the artifact's
    is refused."""
    from medusa.artifact import ArtifactError, read_manifest

    given = m.get("tensor_parallel_size")
    if given is not None and (not isinstance(given, int) or isinstance(given, bool)
                              or not 1 <= given <= 8):  # fmt: skip
        raise ConfigError(f"{where}.tensor_parallel_size: expected 1 to 8 ranks, got {given!r}")
    if artifact is None:
        return given or 1
    try:
        tp = read_manifest(Path(artifact)).get("tensor_parallel")
    except (ArtifactError, OSError):
        return given or 1  # NOTE: the worker refuses it, with why (as for any artifact)
    recorded = int(tp["size"]) if isinstance(tp, dict) and isinstance(tp.get("size"), int) else 1
    if given is not None and given != recorded:
        one = "one device" if recorded == 1 else f"a tensor-parallel group of {recorded}"
        raise ConfigError(
            f"{where}.tensor_parallel_size: {given}, but the artifact {artifact} was "
            f"materialized for {one}; drop the field (the artifact decides) or materialize again "
            f"with --tensor-parallel-size {given}"
        )
    return recorded

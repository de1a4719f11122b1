"""models.yaml: the catalog, validated at start with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from medusa.serve.gateway.config_entry import ConfigError as ConfigError
from medusa.serve.gateway.config_entry import artifact_dir, engine_settings, group_size
from medusa.weaver.config import WeavingConfig, parse_weaving

# bool settings whose option has a --no- form (the others are flags that only turn on)
_BOTH = {"serve_while_loading"}
# size lists whose empty value means none ('' on the command line), not the default
_EMPTY_IS_NONE = {"prefill_graph_sizes"}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    artifact: str | None = None  # restore from it (falls back to a normal start if unusable)
    model: str | None = None  # what the worker loads (default: the engine's default model)
    min_instances: int = 0
    max_instances: int = 1
    target: int = 4  # concurrent requests per instance before scaling up
    keep_alive: float = 60.0  # seconds idle before an instance is stopped
    # engine.weights: host: seconds the gateway keeps the store mapped (resident, checked) after
    # the model's last worker ends, so that a slice switched back to it loads nothing
    host_keep_alive: float = 60.0
    max_queue: int = 64  # requests waiting for an instance (or beyond `target` each), at most
    start_attempts: int = 3  # failed starts in a row before requests are refused with the reason
    failure_cooldown: float = 60.0  # seconds a failed model refuses requests before trying again
    tpot_target: float = 0.1  # seconds; with engine.weights: host, what C2C admission plans for
    ttft_target: float = (
        2.0  # seconds; with engine.weights: host, what prefill chunks are sized for
    )
    slo_ttft: float = 2.0  # seconds to first token: an elastic slice's queue deadlines, its KVPR
    slo_tpot: float = 0.1  # seconds per output token the model is meant to keep
    engine: dict[str, Any] = field(default_factory=dict)
    weaving: WeavingConfig = WeavingConfig()  # offload attention to idle workers (Weaver)
    # ranks (one process and one slice each): the artifact's group, else the entry's field
    tensor_parallel_size: int = 1

    def worker_args(self, overrides: dict[str, Any] | None = None) -> list[str]:
        """`medusa run` arguments; with an artifact, `engine` holds its settings too (passed
        as given: they match what the worker reads from the artifact itself). `overrides`: what
        the slice needs (kv_memory: elastic); one the artifact decides otherwise makes the
        worker start the normal way (--allow-fallback), as it did before the artifact decided."""
        from medusa.restore.compat import CONFIG_KEYS

        settings = {**self.engine, **(overrides or {})}
        args = [self.model] if self.model else []
        if self.artifact:
            args += ["--artifact", self.artifact]
            if any(
                self.engine.get(k) != v for k, v in (overrides or {}).items() if k in CONFIG_KEYS
            ):
                args.append("--allow-fallback")
        for k, v in sorted(settings.items()):
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                args += [flag if v else flag.replace("--", "--no-", 1)] if k in _BOTH else []
                args += [flag] if v and k not in _BOTH else []
            elif isinstance(v, list | tuple):
                args += [flag, ",".join(map(str, v))] if v or k in _EMPTY_IS_NONE else []
            elif v is not None:
                args += [flag, str(v)]
        if self.tensor_parallel_size > 1:
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        return args


@dataclass(frozen=True)
class PrismSettings:
    """How the gateway schedules elastic slices (`prism:` in models.yaml)."""

    prefill_speed: float = 2000.0  # prompt tokens/s a slice prefills: a request's length estimate
    concurrency: int = 8  # requests let through to one elastic slice's workers at a time
    rate_window: float = 60.0  # seconds over which each model's request rate is measured


@dataclass(frozen=True)
class GatewayConfig:
    models: dict[str, ModelConfig]
    # simulated slices (CPU machines): a topology file, or its `slices:` list inline
    slices: str | list[dict[str, Any]] | None = None
    api_keys: tuple[str, ...] = ()
    # pooled workers (warmed up, no model) per slice class; "*": every class
    warm_pool: dict[str, int] = field(default_factory=dict)
    # slice class -> "elastic" (several models share its memory) or "static"; "*": every class
    sharing: dict[str, str] = field(default_factory=dict)
    prism: PrismSettings = field(default_factory=PrismSettings)

    def pool_size(self, kind: str) -> int:
        return self.warm_pool.get(kind, self.warm_pool.get("*", 0))

    def sharing_of(self, kind: str) -> str:
        return self.sharing.get(kind, self.sharing.get("*", "static"))


def _int(where: str, raw: dict[str, Any], key: str, default: int, minimum: int) -> int:
    v = raw.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ConfigError(f"{where}.{key}: expected an integer >= {minimum}, got {v!r}")
    return v


def _seconds(where: str, raw: dict[str, Any], key: str, default: float) -> float:
    v = raw.get(key, default)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < float("inf"):
        raise ConfigError(f"{where}.{key}: expected seconds >= 0, got {v!r}")
    return float(v)


def _slo(where: str, raw: dict[str, Any], key: str, default: float) -> float:
    v = raw.get(key, default)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v < float("inf"):
        raise ConfigError(
            f"{where}.{key}: expected seconds > 0, got {v!r}; e.g. {key}: {default} "
            f"({'to the first token' if key == 'slo_ttft' else 'per output token'})"
        )
    return float(v)


MODEL_KEYS = frozenset(
    {
        "tpot_target",
        "ttft_target",
        "artifact",
        "model",
        "min_instances",
        "max_instances",
        "target",
        "keep_alive",
        "host_keep_alive",
        "max_queue",
        "start_attempts",
        "failure_cooldown",
        "slo_ttft",
        "slo_tpot",
        "engine",
        "weaving",
        "tensor_parallel_size",
    }
)


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    raw = _read(path)
    models = {str(name): _model(path, str(name), m) for name, m in raw["models"].items()}
    keys = raw.get("api_keys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(f"{path}: api_keys: expected a list of non-empty strings")
    return GatewayConfig(
        models,
        _slices(path, raw.get("slices")),
        tuple(keys),
        _warm_pool(path, raw.get("warm_pool", 0)),
        _sharing(path, raw.get("sharing", {})),
        _prism(path, raw.get("prism", {})),
    )


def _read(path: Path) -> dict[str, Any]:
    """The file's mapping, with a non-empty `models:` and no unknown top-level field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict) or not raw["models"]:
        raise ConfigError(f"{path}: expected a 'models:' mapping of model name to settings")
    unknown = set(raw) - {"models", "slices", "api_keys", "warm_pool", "sharing", "prism"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level field(s) {sorted(unknown)}")
    return raw


def _model(path: Path, name: str, m: Any) -> ModelConfig:
    where = f"{path}: models.{name}"
    m = m or {}
    if not isinstance(m, dict):
        raise ConfigError(f"{where}: expected a mapping of settings")
    bad = set(m) - MODEL_KEYS
    if bad:
        raise ConfigError(f"{where}: unknown field(s) {sorted(bad)}")
    artifact = artifact_dir(path, where, m.get("artifact"))
    model, engine = engine_settings(path, name, m, artifact)
    lo = _int(where, m, "min_instances", 0, 0)
    hi = _int(where, m, "max_instances", max(1, lo), 1)
    if hi < lo:
        raise ConfigError(f"{where}.max_instances: {hi} is below min_instances {lo}")
    keep = _seconds(where, m, "keep_alive", 60.0)
    try:
        weaving = parse_weaving(m.get("weaving"), name)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    return ModelConfig(
        name=name,
        artifact=artifact,
        model=model,
        min_instances=lo,
        max_instances=hi,
        target=_int(where, m, "target", 4, 1),
        keep_alive=keep,
        host_keep_alive=_seconds(where, m, "host_keep_alive", keep),
        max_queue=_int(where, m, "max_queue", 64, 0),
        start_attempts=_int(where, m, "start_attempts", 3, 1),
        failure_cooldown=_seconds(where, m, "failure_cooldown", 60.0),
        tpot_target=float(m.get("tpot_target", 0.1)),
        ttft_target=float(m.get("ttft_target", 2.0)),
        slo_ttft=_slo(where, m, "slo_ttft", 2.0),
        slo_tpot=_slo(where, m, "slo_tpot", 0.1),
        engine=engine,
        weaving=weaving,
        tensor_parallel_size=group_size(where, m, artifact),
    )


def _slices(path: Path, raw: Any) -> str | list[dict[str, Any]] | None:
    """`slices: FILE` (relative to this file's directory) or the topology's list inline."""
    if raw is None or isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        raise ConfigError(
            f"{path}: slices: expected a topology file name or a list such as "
            f"[{{profile: 1g.12gb}}, {{memory_gb: 8, sms: 26}}], got {raw!r}"
        )
    return raw if Path(raw).is_absolute() else str(path.parent / raw)


def _warm_pool(path: Path, raw: Any) -> dict[str, int]:
    """`warm_pool: N` (every slice class) or `warm_pool: {1g.12gb: 2, "*": 1}`."""
    sizes = raw if isinstance(raw, dict) else {"*": raw}
    for kind, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            where = f"warm_pool.{kind}" if isinstance(raw, dict) else "warm_pool"
            raise ConfigError(
                f"{path}: {where}: expected an integer >= 0 (pooled workers per slice class), "
                f"got {n!r}"
            )
    return {str(k): n for k, n in sizes.items()}


def _sharing(path: Path, raw: Any) -> dict[str, str]:
    """`sharing: elastic` (every slice class) or `sharing: {1g.24gb: elastic, "*": static}`."""
    modes = raw if isinstance(raw, dict) else {"*": raw}
    for kind, mode in modes.items():
        if mode not in ("elastic", "static"):
            where = f"sharing.{kind}" if isinstance(raw, dict) else "sharing"
            raise ConfigError(
                f"{path}: {where}: expected 'elastic' (the slice's models share its memory) or "
                f"'static' (one model per slice), got {mode!r}"
            )
    return {str(k): str(v) for k, v in modes.items()}


def _prism(path: Path, raw: Any) -> PrismSettings:
    """`prism: {prefill_speed: 2000, concurrency: 8, rate_window: 60}`, each optional."""
    where = f"{path}: prism"
    if not isinstance(raw, dict) or set(raw) - {"prefill_speed", "concurrency", "rate_window"}:
        raise ConfigError(
            f"{where}: expected a mapping with prefill_speed (prompt tokens/s), concurrency "
            f"(requests per elastic slice) and rate_window (seconds), got {raw!r}"
        )
    speed = raw.get("prefill_speed", 2000.0)
    if not isinstance(speed, int | float) or isinstance(speed, bool) or not 0 < speed < 1e12:
        raise ConfigError(f"{where}.prefill_speed: expected prompt tokens/s > 0, got {speed!r}")
    window = raw.get("rate_window", 60.0)
    if not isinstance(window, int | float) or isinstance(window, bool) or not 0 < window < 1e9:
        raise ConfigError(f"{where}.rate_window: expected seconds > 0, got {window!r}")
    return PrismSettings(float(speed), _int(where, raw, "concurrency", 8, 1), float(window))

"""Placement: which slices can hold a model at all (weights, activations and one sequence's KV)."""

from __future__ import annotations

from medusa.serve.gateway.config import ConfigError, GatewayConfig, ModelConfig
from medusa.serve.gateway.slices import Slice


def required_bytes(m: ModelConfig) -> int:
    """Device memory a worker needs before it can serve one full-length sequence."""
    if m.artifact:
        from medusa.artifact.store import read_manifest

        manifest = read_manifest(m.artifact)
        kv, eng = manifest.get("kv", {}), manifest.get("engine", {})
        per_seq = kv.get("block_bytes", 0) * -(
            -eng.get("max_model_len", 0) // eng.get("block_size", 16)
        )
        return int(kv.get("non_kv_bytes", 0)) + per_seq
    from medusa.engine.loader import open_model

    spec = open_model(m.model).spec
    max_len = int(m.engine.get("max_model_len", 2048))
    return spec.num_params * 4 + 2 * spec.num_layers * spec.kv_size * 4 * max_len


def check_c2c(config: GatewayConfig) -> None:
    """Models whose weights stay on the host stream them over the shared C2C link once per decode
    step: admit them only if the sum of weight bytes / TPOT target fits the link."""
    from medusa.c2c.model import C2C_BW
    from medusa.engine.loader import open_model

    host = [m for m in config.models.values() if m.engine.get("weights") == "host"]
    demand = {m.name: open_model(m.model).spec.num_params * 4 / m.tpot_target for m in host}
    total = sum(demand.values())
    if total > C2C_BW:
        detail = ", ".join(f"{k} {v / 1e9:.0f} GB/s" for k, v in sorted(demand.items()))
        raise ConfigError(
            f"models with weights on the host need {total / 1e9:.0f} GB/s of C2C ({detail}) but "
            f"the link has {C2C_BW / 1e9:.0f} GB/s: raise their tpot_target or serve fewer here"
        )


def check_placement(config: GatewayConfig, slices: list[Slice]) -> None:
    check_c2c(config)
    largest = max(s.memory for s in slices)
    for m in config.models.values():
        need = required_bytes(m)
        if need > largest:
            raise ConfigError(
                f"models.{m.name}: needs about {need / 2**30:.1f} GiB (weights, activations and "
                f"one sequence's KV cache) but the largest slice has {largest / 2**30:.1f} GiB; "
                "use a larger slice profile or a smaller max_model_len"
            )
        if m.min_instances > len(slices):
            raise ConfigError(
                f"models.{m.name}.min_instances: {m.min_instances} exceeds the {len(slices)} slices"
            )

"""Placement: which slices can hold a model at all (weights, activations and one sequence's KV),
and which slices a tensor-parallel model's worker takes (one per rank, of one class)."""

from __future__ import annotations

from pathlib import Path

from medusa.serve.gateway.config import ConfigError, GatewayConfig, ModelConfig
from medusa.serve.gateway.slices import Slice


def required_bytes(m: ModelConfig) -> int:
    """Device memory a worker needs before it can serve one full-length sequence."""
    return sum(footprint(m))


def footprint(m: ModelConfig) -> tuple[int, int]:
    """(bytes besides the KV cache: weights and activations, one full-length sequence's KV)."""
    if m.artifact:
        from medusa.artifact.store import read_manifest

        manifest = read_manifest(Path(m.artifact))
        kv, eng = manifest.get("kv", {}), manifest.get("engine", {})
        per_seq = kv.get("block_bytes", 0) * -(
            -eng.get("max_model_len", 0) // eng.get("block_size", 16)
        )
        return int(kv.get("non_kv_bytes", 0)), per_seq  # (a tensor-parallel one's: rank 0's)
    from medusa.engine.loader import open_model

    spec = open_model(m.model).spec
    max_len = int(m.engine.get("max_model_len", 2048))
    n = m.tensor_parallel_size  # each rank holds about 1/n of the weights and of the KV heads
    return spec.num_params * 4 // n, 2 * spec.num_layers * spec.kv_size * 4 * max_len // n


def group_of(n: int, slices: list[Slice], pooled: list[Slice]) -> list[Slice] | None:
    """n static slices of one class a tensor-parallel worker can take now, in the slices'
    order: free ones first, then ones that only a pooled worker holds (it is stopped for the
    model, as a model always takes a pooled worker rather than wait); None if no class has n."""
    order = {id(s): i for i, s in enumerate(slices)}
    for kind in dict.fromkeys(s.kind for s in slices):
        free = [s for s in slices if s.kind == kind and not s.busy and not s.shared]
        held = [s for s in pooled if s.kind == kind and not s.shared]
        if len(free) + len(held) >= n:
            return sorted((free + held)[:n], key=lambda s: order[id(s)])
    return None


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


def plan_chunks(config: GatewayConfig, slices: list[Slice]) -> GatewayConfig:
    """Host-weight models without a set max_prefill_chunk get the smallest chunk that meets their
    TTFT target within a quarter of the slice's memory (the performance model's profile table,
    for a prompt of half max_model_len, with the C2C link shared by every host-weight model)."""
    from dataclasses import replace

    from medusa.c2c.model import C2C_BW, GH200_MIG
    from medusa.c2c.scheduler import ModelShape, prefill_chunk, profile_table
    from medusa.engine.loader import open_model

    host = [m for m in config.models.values() if m.engine.get("weights") == "host"]
    models = dict(config.models)
    smallest = min(s.memory for s in slices)
    profile = max(
        (p for p in GH200_MIG.values() if p.memory <= smallest),
        key=lambda p: p.memory,
        default=GH200_MIG["1g.12gb"],
    )
    for m in host:
        if "max_prefill_chunk" in m.engine:
            continue
        shape = ModelShape.from_spec(open_model(m.model).spec, m.tpot_target, m.ttft_target)
        prompt = int(m.engine.get("max_model_len", 2048)) // 2
        table = profile_table(
            shape, profile, prompt, float(m.engine.get("alpha", 0.0)), C2C_BW / len(host)
        )
        chunk = prefill_chunk(table, m.ttft_target, smallest // 4)
        models[m.name] = replace(m, engine={**m.engine, "max_prefill_chunk": chunk})
    return replace(config, models=models)


def check_placement(config: GatewayConfig, slices: list[Slice]) -> None:
    check_c2c(config)
    kinds = sorted({s.kind for s in slices})
    for field, classes in (("warm_pool", config.warm_pool), ("sharing", config.sharing)):
        for kind in set(classes) - {"*", *kinds}:
            raise ConfigError(
                f"{field}.{kind}: no slice is of class {kind!r}; the slices' classes: {kinds}"
            )
    largest = max(s.memory for s in slices)
    for m in config.models.values():
        need = required_bytes(m)
        if m.tensor_parallel_size > 1:
            check_group(m, need, [s for s in slices if config.sharing_of(s.kind) == "static"])
        elif need > largest:
            raise ConfigError(
                f"models.{m.name}: needs about {need / 2**30:.1f} GiB (weights, activations and "
                f"one sequence's KV cache) but the largest slice has {largest / 2**30:.1f} GiB; "
                "use a larger slice profile or a smaller max_model_len"
            )
        if m.min_instances * m.tensor_parallel_size > len(slices):
            raise ConfigError(
                f"models.{m.name}.min_instances: {m.min_instances} instances of "
                f"{m.tensor_parallel_size} slices each exceed the {len(slices)} slices"
            )


def check_group(m: ModelConfig, need: int, static: list[Slice]) -> None:
    """A tensor-parallel model needs, per rank, a static slice of one class that holds its
    shard (an elastic slice's workers share its memory: a rank cannot join them)."""
    n = m.tensor_parallel_size
    fit = [s for s in static if s.memory >= need]
    if not any(sum(1 for s in fit if s.kind == k) >= n for k in {s.kind for s in fit}):
        have = sorted({f"{s.kind} x{sum(1 for x in static if x.kind == s.kind)}" for s in static})
        raise ConfigError(
            f"models.{m.name}: tensor-parallel over {n} ranks, it needs {n} static slices of one "
            f"class with about {need / 2**30:.1f} GiB each (one per rank); the static slices: "
            f"{', '.join(have) or 'none'}; add slices, or materialize it for fewer ranks"
        )

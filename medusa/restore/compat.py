"""Whether an artifact fits this process: schema, model, engine configuration, device."""

from __future__ import annotations

from typing import Any

from medusa.restore.errors import RestoreError

# Engine settings that change what a restored start-up allocates or captures: `medusa run
# --artifact` takes them from the artifact (medusa.engine.artifact_settings). Not
# gpu_memory_utilization: the deployment's share of the device, from which a restore derives
# its KV size (medusa.engine.kv_size).
CONFIG_KEYS = (
    "weights",
    "max_num_seqs",
    "max_model_len",
    "max_num_batched_tokens",
    "block_size",
    "enforce_eager",
    "capture_sizes",
    "prefill_graph_sizes",
    "kv_memory",
)


def device_fingerprint(device: Any) -> dict[str, Any]:
    """What an artifact must match: the device type and its memory (medusa.engine.device)."""
    b = device.b
    _, total = b.mem_get_info()
    cc = [b.device_attribute(75), b.device_attribute(76)]  # compute capability major, minor
    drv, rt = b.versions()
    return {
        "name": b.device_name(),
        "total_mem": total,
        "cc": cc,
        "driver_version": drv,
        "runtime_version": rt,
        "sm_count": b.device_attribute(16),
    }


def check_compatible(
    manifest: dict[str, Any], *, model_identity: str, config: dict[str, Any], device: dict[str, Any]
) -> None:
    m = manifest.get("model", {})
    if m.get("identity") != model_identity:
        recorded_id = str(m.get("identity"))[:24]
        raise RestoreError(
            f"model mismatch: the artifact is for {m.get('name')!r} ({recorded_id}…), "
            f"this worker loads {model_identity[:24]}…; materialize this model"
        )
    recorded = manifest.get("engine", {})
    for k in CONFIG_KEYS:
        if k not in recorded:  # NOTE: materialized before the setting existed
            raise RestoreError(
                f"engine configuration: the artifact records no {k} (materialized by an older "
                "medusa); materialize again"
            )
        want, got = recorded[k], config.get(k)
        if isinstance(got, tuple):
            got = list(got)
        if want != got:
            raise RestoreError(
                f"engine configuration mismatch: {k}={got!r} here, {want!r} when materialized; "
                f"use the same setting or materialize again"
            )
    # NOTE: not the memory size: a restore sizes the KV cache for the device (or slice) it lands
    # on, and the graphs index that cache through block tables, which are data.
    d = manifest.get("device", {})
    for k in ("name", "cc"):
        if d.get(k) != device.get(k):
            raise RestoreError(
                f"device mismatch: {k} is {device.get(k)!r} here, {d.get(k)!r} in the artifact; "
                "an artifact is specific to a device type"
            )

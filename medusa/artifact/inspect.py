"""`medusa inspect`: an artifact, readably."""

from __future__ import annotations

from typing import Any

from medusa.artifact.store import Artifact


def describe(art: Artifact) -> str:
    m = art.manifest
    lines = [*_header(art), *_kv(m), *_recording(m, art.plan), *_weights(m), "  files"]
    for rel, f in sorted(m["files"].items()):
        lines.append(f"    {rel:70} {f['size']:>10}  sha256 {f['sha256'][:16]}…")
    return "\n".join(lines)


def _header(art: Artifact) -> list[str]:
    """What the artifact is: schema, digest, signer, model, device."""
    m = art.manifest
    lines = [f"artifact {art.path}  (schema {m['schema']}, medusa {m['medusa_version']})"]
    lines.append(f"  digest    sha256:{art.seal.digest}")
    signed = f"by {art.signer} (medusa verify --trust KEY checks it)" if art.signer else "no"
    lines.append(f"  signed    {signed}")
    lines.append(f"  model     {m['model'].get('name')}  [{str(m['model'].get('identity'))[:40]}…]")
    d = m.get("device", {})
    if d:
        lines.append(
            f"  device    {d.get('name')}, {d.get('total_mem', 0) / 2**30:.1f} GiB, "
            f"cc {'.'.join(map(str, d.get('cc', [])))}, driver {d.get('driver_version')}, "
            f"runtime {d.get('runtime_version')}"
        )
    return lines


def _kv(m: dict[str, Any]) -> list[str]:
    if "kv" not in m:
        return []
    kv = m["kv"]
    how = "profiled" if "profile_peak_bytes" in kv else "kv_cache_memory"
    lines = [
        f"  kv cache  {kv['num_blocks']} blocks x {kv['block_bytes']} bytes "
        f"= {kv['num_blocks'] * kv['block_bytes'] / 2**20:.0f} MiB ({how} when materialized)"
    ]
    if kv.get("memory") == "elastic":
        lines.append(
            f"            elastic: {kv['reserve_bytes'] / 2**20:.0f} MiB reserved, pages of "
            f"{kv['page_bytes'] >> 10} KiB mapped on demand, budget {kv['budget_pages']} pages; "
            "a restore keeps this range"
        )
    elif "profile_peak_bytes" in kv:
        lines.append(
            f"            profiling peak {kv['profile_peak_bytes'] / 2**20:.0f} MiB beyond "
            f"{kv['held_bytes'] / 2**20:.0f} MiB held (weights, workspace): the block count is "
            "derived at restore from the device's free memory, --gpu-memory-utilization and "
            "this peak"
        )
    else:
        lines.append("            no profiling recorded: a restore allocates this block count")
    return lines


def _recording(m: dict[str, Any], p: dict[str, Any]) -> list[str]:
    """What the start-up recorded: graphs, relocations, kernels, buffers."""
    kern = m["kernels"]
    allocs = p["allocs"]
    skipped = set(p["skipped_phases"])
    perm = [a for a in allocs if a[0] in skipped and not a[4]]
    return [
        *_graphs(m),
        "  relocations " + ", ".join(f"{k} {v}" for k, v in m["relocations"].items()),
        f"  kernels   {kern['count']}: {kern['exported']} with an exported host stub, "
        f"{kern['hidden']} hidden (found in loaded or saved images); "
        f"{kern['images_saved']} images saved",
        f"  buffers   {len(allocs)} allocations; skipped phases {sorted(skipped)}: "
        f"{len(perm)} permanent ({sum(a[3] for a in perm)} bytes, "
        f"{len(p['contents'])} with saved contents)",
    ]


def _graphs(m: dict[str, Any]) -> list[str]:
    """How many graphs, and which: an engine's decode graphs by batch size, then its prefill
    graphs by tokens; another program's by the keys its integration gave them."""
    g = m["graphs"]
    head = f"  graphs    {g['count']}, {g['nodes']} nodes, {g['templates']} topology templates"
    if m["kind"] != "engine":
        return [f"{head} (keys {g['keys']})"]
    prefill = g.get("prefill_keys", [])
    return [
        head,
        f"            decode  {len(g['keys'])}, batch sizes {g['keys']}",
        f"            prefill {len(prefill)}, tokens {prefill}"
        + ("" if prefill else " (eager prefill)"),
    ]


def _weights(m: dict[str, Any]) -> list[str]:
    """An engine artifact's weight store, or that it has none."""
    if m["kind"] != "engine":
        return []
    w, tp = m.get("weights"), m.get("tensor_parallel")
    if tp:
        nodes = ", ".join(str(r["graphs"]["nodes"]) for r in tp["ranks"])
        stores = [r["weights"] for r in tp["ranks"] if "weights" in r]
        mib = " + ".join(f"{x['data_bytes'] / 2**20:.0f} MiB" for x in stores)
        files = ", ".join(x["file"] for x in stores)
        held = (f"a store per rank, its shard ({mib}: {files})" if stores
                else "no store (each rank loads its shard from the model file)")  # fmt: skip
        return [
            f"  tensor parallel {tp['size']} ranks, one plan each ({nodes} nodes); `medusa run "
            f"--artifact` starts {tp['size']} rank processes",
            f"  weights   {held}",
        ]
    if not w:
        return ["  weights   no store (a restored start loads the model file)"]
    return [
        f"  weights   {w['file']}: {w['tensors']} tensors, {w['data_bytes'] / 2**20:.0f} MiB "
        f"in {w['chunks']} chunks of {w['chunk_size'] >> 10} KiB ({w['hash']}), header "
        f"sha256 {w['header_sha256'][:16]}… (chunks checked while loading)"
    ]

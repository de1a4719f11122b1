"""The gateway's warm pool: pooled workers (`medusa run --pool`) wait without a model on free
slices, a cold model takes one, the pool refills and replaces the dead, and only the gateway can
assign a model."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time

import httpx
import pytest

from medusa.child import medusa_cli
from medusa.serve.gateway.config import ConfigError, load_config
from medusa.serve.gateway.placement import check_placement
from medusa.serve.gateway.slices import simulated_slices
from tests.processes import clean_env
from tests.serve.test_gateway import CHAT, ENGINE, _alive, _port, _start_gateway, _wait_gone


def _pool(base: str, want: int, timeout: float = 60, other_than: int = 0) -> list[dict]:
    """The pool once `want` workers in it (none with pid `other_than`) are idle."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        pool = httpx.get(f"{base}/admin/pool").json()
        idle = [w for w in pool if w["state"] == "idle" and w["pid"] != other_than]
        if len(idle) >= want:
            return pool
        time.sleep(0.1)
    raise AssertionError(f"the pool did not warm {want} worker(s): {pool}")


def _metric(base: str, series: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.e2e
def test_a_cold_model_takes_a_pooled_worker_and_the_pool_refills(
    tmp_path,
    engine_artifact,  # noqa: F811
):
    (tmp_path / "slices.yaml").write_text(
        "slices:\n  - {name: s0, memory_gb: 8}\n  - {name: s1, memory_gb: 8}\n"
    )
    (tmp_path / "models.yaml").write_text(
        f"models:\n  a: {{artifact: {engine_artifact}, engine: {ENGINE}}}\n"
        "warm_pool: 1\nslices: slices.yaml\n"
    )
    proc, base = _start_gateway(str(tmp_path / "models.yaml"))
    try:
        (first,) = _pool(base, 1)
        r = httpx.post(f"{base}/v1/chat/completions", json={"model": "a", **CHAT}, timeout=120)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
        (inst,) = httpx.get(f"{base}/admin/instances").json()["a"]
        assert inst["pid"] == first["pid"] and inst["slice"] == first["slice"]

        # the pool refills on the other slice; a pooled worker that dies is replaced
        (second,) = _pool(base, 1)
        assert second["slice"] != first["slice"]
        metrics = httpx.get(f"{base}/metrics").text
        for stage in ("wait", "assign", "weights", "restore", "ready"):
            line = f'medusa_gateway_pooled_start_stage_seconds_count{{model="a",stage="{stage}"}} 1'
            assert line in metrics
        assert 'medusa_gateway_cold_start_stage_seconds{model="a",stage="graph_restore"}' in metrics
        assert 'medusa_gateway_pool_workers{slice_class="8gb.132sm",state="idle"} 1.0' in metrics
        os.kill(second["pid"], signal.SIGKILL)
        (third,) = _pool(base, 1, timeout=90, other_than=second["pid"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert _wait_gone(third["pid"], 10) and _wait_gone(first["pid"], 10)


@pytest.mark.e2e
def test_only_the_gateway_assigns_and_a_bad_assignment_ends_the_worker():
    port = _port()
    env = {**clean_env(), "MEDUSA_DEVICE": "sim"}
    res = subprocess.run(medusa_cli("run", "--pool"), env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "--pool needs MEDUSA_WORKER_TOKEN" in res.stderr

    env["MEDUSA_WORKER_TOKEN"] = "t0ken"
    proc = subprocess.Popen(
        medusa_cli("run", "--pool", "--port", str(port)), env=env, stderr=subprocess.PIPE, text=True
    )
    base, token = f"http://127.0.0.1:{port}", {"x-medusa-worker-token": "t0ken"}
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/pool", headers=token).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert httpx.post(f"{base}/pool/assign", json={"argv": []}).status_code == 401
        health = httpx.get(f"{base}/health", headers=token)
        assert health.status_code == 503 and health.json() == {"status": "pooled"}
        r = httpx.post(
            f"{base}/pool/assign", json={"argv": ["--max-num-seqs", "0"]}, headers=token, timeout=60
        )
        assert r.status_code == 500 and "max_num_seqs=0: must be at least 1" in r.json()["error"]
        _, err = proc.communicate(timeout=30)
        assert "max_num_seqs=0" in err.strip().splitlines()[-1]
    finally:
        if _alive(proc.pid):
            proc.kill()


def test_warm_pool_config_errors_name_the_field(tmp_path):
    (tmp_path / "slices.yaml").write_text("slices:\n  - {profile: 1g.12gb}\n")
    cfg = tmp_path / "models.yaml"
    cfg.write_text("models:\n  a: {}\nwarm_pool: -1\n")
    with pytest.raises(ConfigError, match=r"models\.yaml: warm_pool: expected an integer >= 0"):
        load_config(cfg)
    cfg.write_text("models:\n  a: {}\nwarm_pool: {1g.12gb: x}\n")
    with pytest.raises(ConfigError, match=r"warm_pool\.1g\.12gb: expected an integer >= 0"):
        load_config(cfg)
    cfg.write_text("models:\n  a: {}\nwarm_pool: {2g.24gb: 1}\nslices: slices.yaml\n")
    loaded = load_config(cfg)
    with pytest.raises(ConfigError, match=r"warm_pool\.2g\.24gb: no slice is of class .*1g\.12gb"):
        check_placement(loaded, simulated_slices(tmp_path / "slices.yaml"))
    cfg.write_text("models:\n  a: {}\nwarm_pool: {1g.12gb: 2, '*': 1}\n")
    loaded = load_config(cfg)
    assert loaded.pool_size("1g.12gb") == 2 and loaded.pool_size("7g.96gb") == 1


@pytest.fixture(scope="module")
def host_artifact(tmp_path_factory):
    from tests.processes import ENGINE_OPTS, medusa

    out = tmp_path_factory.mktemp("host") / "smollm2-host"
    res = medusa("materialize", *ENGINE_OPTS, "--weights", "host", "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.e2e
def test_a_host_weight_model_is_mapped_once_by_the_gateway_for_all_its_workers(
    tmp_path, host_artifact
):
    from medusa.artifact.store import read_manifest

    store = host_artifact / read_manifest(host_artifact)["weights"]["file"]
    (tmp_path / "slices.yaml").write_text(
        "slices:\n  - {name: s0, memory_gb: 8}\n  - {name: s1, memory_gb: 8}\n"
    )
    # NOTE: no engine: block: the artifact's settings (weights: host among them) are the model's
    (tmp_path / "models.yaml").write_text(
        f"models:\n  h: {{artifact: {host_artifact}, max_instances: 2, target: 1}}\n"
        "warm_pool: 1\nslices: slices.yaml\n"
    )
    proc, base = _start_gateway(str(tmp_path / "models.yaml"))
    try:
        _pool(base, 1)
        body = {"model": "h", "prompt": "The capital of France", "max_tokens": 2, "temperature": 0}

        def ask(_: int) -> httpx.Response:
            return httpx.post(f"{base}/v1/completions", json=body, timeout=120)

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(ask, range(2)))
        assert [r.status_code for r in answers] == [200, 200]
        assert answers[0].json()["choices"][0]["text"] == answers[1].json()["choices"][0]["text"]
        assert len(httpx.get(f"{base}/admin/instances").json()["h"]) == 2  # two workers ...
        deadline = time.time() + 30
        while (mapped := _metric(base, 'medusa_gateway_host_weight_bytes{model="h"}')) == 0:
            assert time.time() < deadline, "the gateway did not map h's weight store"
            time.sleep(0.2)
        assert mapped == store.stat().st_size  # ... one mapping, counted once
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


@pytest.mark.e2e
def test_an_artifact_prepared_at_warm_up_is_used_only_while_its_files_are_unchanged(
    engine_artifact,  # noqa: F811
):
    from medusa.serve.prepared import PreparedArtifact
    from medusa.weights.store import RACY_SECONDS

    old = time.time() - 10 * RACY_SECONDS
    files = [p for p in engine_artifact.rglob("*") if p.is_file()]
    for p in files:
        os.utime(p, (old, old))
    time.sleep(RACY_SECONDS + 0.1)  # their ctimes moved with the utime: let them age
    prep = PreparedArtifact(engine_artifact)
    assert prep.artifact.plan_checked and prep.store is not None
    assert prep.unchanged(engine_artifact)
    plan = engine_artifact / "plan.msgpack.zst"
    os.utime(plan, None)  # touched now: the prepared copy is no longer trusted
    assert not prep.unchanged(engine_artifact)
    os.utime(plan, (old, old))
    assert not prep.unchanged(engine_artifact)  # its ctime moved: another file, as far as we know
    prep.store.close()
    os.utime(plan, None)
    racy = PreparedArtifact(engine_artifact)  # written just before its check: not vouched for
    assert not racy.unchanged(engine_artifact)
    racy.store.close()

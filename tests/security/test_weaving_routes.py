"""Issue 30, findings 2 and 9: the /weaving routes of a worker. A standalone `medusa run` served
them to anyone, with a region file the caller named anywhere (and /weaving/offload made files
anywhere the worker could write). Now a standalone worker has none (404, saying why); a worker a
gateway starts answers them only with its token, and only for a name in the private directory
the gateway gave it: a path, a link, a file another user could read is refused, nothing is made
or written outside it, and the worker's answers never change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from medusa.weaver.region import ExchangeRegion, Geometry
from tests.security._shm import Worker, private_dir, start_worker, tiny_model

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

TOKEN = "the-gateways-token"
GEO = Geometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_seqs=4, max_tokens=32)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("weaving") / "tiny.gguf")


def _refused(w: Worker, path: str, body: dict[str, object], status: int, says: str) -> None:
    r = w.post(path, body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"], r.text


def test_a_standalone_worker_has_no_weaving_routes(model: Path, tmp_path: Path) -> None:
    w = start_worker(model)
    try:
        want = w.answer()
        target = tmp_path / "made-by-the-worker"
        why = "weaving is off on this worker: it was not started by a gateway"
        _refused(w, "/weaving/offload", {"region": str(target), "ratio": 0.5}, 404, why)
        _refused(w, "/weaving/receive", {"region": str(target), "blocks": 4}, 404, why)
        _refused(w, "/weaving/unpair", {}, 404, "MEDUSA_WORKER_TOKEN unset")
        assert w.get("/weaving").status_code == 404
        assert not target.exists()
        assert w.answer() == want and w.get("/health").status_code == 200
    finally:
        w.stop()


def test_a_gateways_worker_weaves_only_for_its_token_and_names_in_its_directory(
    model: Path, tmp_path: Path
) -> None:
    regions = private_dir(tmp_path)
    w = start_worker(model, token=TOKEN, weaving_dir=regions)
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours\n")
    (regions / "link").symlink_to(victim)
    outside = ExchangeRegion.create(tmp_path / "open", GEO)  # a region, then opened to all
    outside.close()
    os.chmod(tmp_path / "open", 0o644)
    os.rename(tmp_path / "open", regions / "open")
    try:
        want = w.answer()
        anyone = Worker(w.proc, w.base)  # without the token
        assert (
            anyone.post("/weaving/offload", {"region": "weaver-1", "ratio": 0.5}).status_code == 401
        )
        for name in (str(tmp_path / "elsewhere"), "../elsewhere", ".hidden", "a/b"):
            _refused(w, "/weaving/offload", {"region": name, "ratio": 0.5}, 400, "region")
            _refused(w, "/weaving/receive", {"region": name, "blocks": 4}, 400, "region")
        assert not (tmp_path / "elsewhere").exists()
        # a link planted in the directory is never followed: not written through, not opened
        _refused(w, "/weaving/offload", {"region": "link", "ratio": 0.5}, 409, "File exists")
        _refused(w, "/weaving/receive", {"region": "link", "blocks": 4}, 400, "symbolic links")
        assert victim.read_bytes() == b"not yours\n" and (regions / "link").is_symlink()
        _refused(w, "/weaving/receive", {"region": "open", "blocks": 4}, 400, "not a private file")
        _refused(
            w, "/weaving/receive", {"region": "missing", "blocks": 4}, 400, "no exchange region"
        )
        _refused(w, "/weaving/receive", {"region": "missing", "blocks": 1 << 40}, 400, "blocks")
        # the gateway's own request: the region is made there, private, and goes at unpair
        r = w.post("/weaving/offload", {"region": "weaver-1", "ratio": 0.5})
        assert r.status_code == 200, r.text
        made = regions / "weaver-1"
        assert r.json()["offloading"]["region"] == str(made)
        assert made.stat().st_mode & 0o777 == 0o600
        assert w.answer() == want
        assert w.post("/weaving/unpair", {}).status_code == 200 and not made.exists()
        assert w.answer() == want and w.get("/health").status_code == 200
    finally:
        w.stop()

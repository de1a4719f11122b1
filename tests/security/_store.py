"""Shared by the weight-store attacks: a tiny model whose store has several chunks, materialized
once (device and host weights), copies of its artifacts to attack, `medusa run` and `medusa
gateway` in subprocesses, and the hold (MEDUSA_HOLD_WEIGHTS) that stops a store's reader part way
until the test, having changed the file, lets it go on."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf import GGMLQuantizationType as T

from medusa.artifact.files import MANIFEST, SEAL
from medusa.artifact.seal import Seal
from medusa.child import medusa_cli
from medusa.env import HOLD_WEIGHTS
from medusa.weights import open_store
from medusa.weights.format import encode_header, parse_header
from tests.engine.tiny_models import write_gguf
from tests.processes import clean_env, medusa
from tests.weights.conftest import OPTS

DIMS = {"layers": 4}  # a store of 3 chunks of 4 MiB
ENGINE = ("{max_num_seqs: 2, max_model_len: 128, max_num_batched_tokens: 64, "
          f"kv_cache_memory: {4 << 20}, weights: host}}")  # fmt: skip
HOST = ("--weights", "host")
PROMPT = {"prompt": "Hello, how are you", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_gguf(path, [T.Q8_0], dims=DIMS)
    return path


def _materialize(model: Path, out: Path, *opts: str) -> Path:
    res = medusa("materialize", str(model), *OPTS, *opts, "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def device_artifact(tiny_model, tmp_path_factory) -> Path:
    return _materialize(tiny_model, tmp_path_factory.mktemp("art") / "device")


@pytest.fixture(scope="session")
def host_artifact(tiny_model, tmp_path_factory) -> Path:
    return _materialize(tiny_model, tmp_path_factory.mktemp("art") / "host", "--weights", "host")


@pytest.fixture(scope="session")
def expected(tiny_model, tmp_path_factory) -> str:
    """What the model answers PROMPT when started the normal way, from the model file."""
    with Worker(tiny_model, None, tmp_path_factory.mktemp("plain")) as w:
        return w.complete()


@pytest.fixture(scope="session")
def expected_host(tiny_model, tmp_path_factory) -> str:
    """The same with weights in host memory (read by HybridGEMM)."""
    with Worker(tiny_model, None, tmp_path_factory.mktemp("plain"), *HOST) as w:
        return w.complete()


def copy_artifact(art: Path, dst: Path) -> Path:
    """A copy an attack may change (its store a file of its own)."""
    return Path(shutil.copytree(art, dst))


def forge_store(art: Path, edit: Callable[[dict[str, Any], dict[str, Any]], None]) -> Path:
    """ART with its weight store's model record and tokenizer record edited by
    edit(model, tokenizer), the header's digest, the manifest and its seal made again (unsigned):
    what anyone who can write an unsigned artifact can make. The chunks are left as they are."""
    path = art / "weights.store"
    with open_store(path) as s:
        h = s.header
        model, tokenizer = json.loads(json.dumps(h.model)), json.loads(h.tokenizer_json)
        data = s.read(0, h.data_size).tobytes()
    edit(model, tokenizer)
    head = encode_header(list(h.tensors), h.data_size, h.chunk_size,
                         {**model, "tokenizer": tokenizer}, h.chunk_digests)  # fmt: skip
    path.write_bytes(head + data)
    manifest = json.loads((art / MANIFEST).read_text())
    size = len(head) + h.data_size
    manifest["weights"]["size"] = size
    manifest["weights"]["header_sha256"] = parse_header(head, size, str(path)).digest
    (art / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    (art / SEAL).write_text(Seal.make(manifest).to_json())
    return art


def chunk_offset(store: Path, i: int) -> int:
    """Where chunk i of the store's data starts in the file."""
    with open_store(store) as s:
        assert s.header.num_chunks > i
        return s.header.data_offset + s.header.chunk_range(i)[0]


def scribble_through_mapping(path: Path, offset: int, n: int) -> None:
    """Overwrites n bytes at `offset` through a shared writable mapping of the file (a write
    that changes neither its mtime nor its ctime once the page is dirty)."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED) as m:
        m[offset : offset + n] = bytes([0x7F]) * n
        m.flush()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Worker:
    """`medusa run MODEL [--artifact ART]` on a port of its own; its log comes with stop()."""

    def __init__(self, model: Path, artifact: Path | None, tmp: Path, *extra: str,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        port = str(free_port())
        self.base = f"http://127.0.0.1:{port}"
        args = [str(model), *(["--artifact", str(artifact)] if artifact else []), *OPTS,
                "--served-model-name", "tiny", "--port", port, *extra]  # fmt: skip
        self._log = tmp / f"worker-{port}.log"
        with open(self._log, "w") as log:
            self.proc = subprocess.Popen(
                medusa_cli("run", *args),
                env={**clean_env(), "TMPDIR": str(tmp), **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the worker exited: {self.stop()[-3000:]}"
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the worker did not get ready: {self.stop()[-3000:]}")

    def complete(self) -> str:
        r = httpx.post(f"{self.base}/v1/completions", json={"model": "tiny", **PROMPT}, timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stops it (SIGTERM: as the gateway does); its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        return self._log.read_text()

    def __enter__(self) -> Worker:
        self.ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Hold:
    """MEDUSA_HOLD_WEIGHTS=CHUNK:DIR for the processes given env(): each stops before CHUNK of a
    store's data until go(pid). auto_release: every held process but `keep` goes on at once."""

    def __init__(self, where: Path, chunk: int) -> None:
        self.dir = where
        self.dir.mkdir(exist_ok=True)
        self.chunk = chunk
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def env(self) -> dict[str, str]:
        return {HOLD_WEIGHTS.name: f"{self.chunk}:{self.dir}"}

    def held(self, pid: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not (self.dir / f"held-{pid}").exists():
            assert time.monotonic() < deadline, f"pid {pid} did not reach the hold"
            time.sleep(0.02)

    def go(self, pid: int) -> None:
        (self.dir / f"go-{pid}").touch()

    def auto_release(self, keep: int) -> None:
        def run() -> None:
            while not self._stop.is_set():
                for p in self.dir.glob("held-*"):
                    pid = int(p.name.split("-")[1])
                    if pid != keep:
                        self.go(pid)
                time.sleep(0.02)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        for p in self.dir.glob("held-*"):
            self.go(int(p.name.split("-")[1]))


class Gateway:
    """`medusa gateway` over a catalog of one model, `h`, on two simulated slices."""

    def __init__(self, tmp: Path, model: Path, artifact: Path, engine: str,
                 env: dict[str, str] | None = None, *, keep_alive: float = 120,
                 warm_pool: int = 0, host_keep_alive: float = 600) -> None:  # fmt: skip
        (tmp / "slices.yaml").write_text(
            "slices:\n  - {name: s0, memory_gb: 8}\n  - {name: s1, memory_gb: 8}\n"
        )
        (tmp / "models.yaml").write_text(
            f"models:\n  h: {{model: {model}, artifact: {artifact}, max_instances: 2, "
            f"keep_alive: {keep_alive}, host_keep_alive: {host_keep_alive}, engine: {engine}}}\n"
            f"slices: slices.yaml\nwarm_pool: {warm_pool}\n"
        )
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self._log = tmp / "gateway.log"
        with open(self._log, "w") as log:
            self.proc = subprocess.Popen(
                medusa_cli("gateway", "--config", str(tmp / "models.yaml"), "--port", str(port)),
                env={**clean_env(), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        for _ in range(600):
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.proc.kill()
        raise AssertionError(f"the gateway did not start:\n{self.stop()}")

    def log(self) -> str:
        return self._log.read_text()

    def complete(self) -> str:
        r = httpx.post(f"{self.base}/v1/completions", json={"model": "h", **PROMPT}, timeout=180)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])

    def pooled(self, state: str = "idle") -> list[int]:
        """Its pooled workers in `state` (idle: warm, waiting for a model)."""
        return [
            w["pid"] for w in httpx.get(f"{self.base}/admin/pool").json() if w["state"] == state
        ]

    def workers(self) -> list[int]:
        return [i["pid"] for i in httpx.get(f"{self.base}/admin/instances").json()["h"]]

    def metric(self, series: str) -> float:
        for line in httpx.get(f"{self.base}/metrics").text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self) -> str:
        """Its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return self.log()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def memfd_inode(pid: int) -> int | None:
    """The inode of the sealed store copy process `pid` maps, if it maps one."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "memfd:medusa-store:" in line:
                return int(line.split()[4])
    return None


def kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)

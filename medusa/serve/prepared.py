"""What a pooled worker (medusa.serve.pooled_server) opens before it knows its model: the
catalog's model sources with their tokenizers, and its artifacts with their plans checked and
weight stores opened; and the assignment that names the model at last, parsed as `medusa run`
parses its options."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from medusa.engine.artifact_settings import ArtifactSettings, Wording, engine_settings, resolve
from medusa.engine.config import EngineConfig
from medusa.weights.store import RACY_SECONDS, file_identity

log = logging.getLogger("medusa.pool")

if TYPE_CHECKING:
    from medusa.engine.loader import ModelSource
    from medusa.engine.tokenizer import Tokenizer
    from medusa.weights import WeightStore


class PreparedSource:
    """A model source opened ahead, its tokenizer built once (the engine asks for it on start)."""

    def __init__(self, source: ModelSource) -> None:
        self._source, self._tokenizer = source, source.tokenizer()
        self._identity = source.identity()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def identity(self) -> str:
        return self._identity


class PreparedArtifact:
    """An artifact loaded and its plan checked at warm-up, its weight store opened against the
    manifest's seal: an assignment of it restores without reading either again, while none of
    its files has changed since (their identity: device, inode, size, times)."""

    def __init__(self, path: Path, checked: int | None = None) -> None:
        """checked: the descriptor number of the gateway's checked copy of this artifact's
        weight store (MEDUSA_POOL_STORES_CHECKED), if it has one: mapped and its pages read in
        now, so that a start given that copy neither maps it nor faults its pages in."""
        from medusa.artifact import load_artifact
        from medusa.restore.validate import validate_plan
        from medusa.weights import WeightStoreError, open_store
        from medusa.weights.sealed import open_vouched

        self.files = _identity(path)
        self.checked_at = time.time()
        art = load_artifact(path)
        validate_plan(art.plan, str(art.path))
        self.artifact = dataclasses.replace(art, plan_checked=True)
        w = art.manifest.get("weights")  # NOTE: its file is one of the directory's, above
        self.store = open_store(path / w["file"], digest=w["header_sha256"]) if w else None
        self.copy: WeightStore | None = None  # the gateway's checked copy of it, mapped
        self.copy_number = str(checked)
        if self.store is not None and checked is not None:
            try:
                self.copy = open_vouched(checked, self.store.path, self.store.header.digest)
                self.copy.prefault().join()
            except WeightStoreError as e:  # gone, or not this store's: a start maps its own
                log.info("the gateway's copy of %s is not mapped ahead: %s", self.store.path, e)

    def drop_copy_if_freed(self) -> None:
        """Closes the mapped copy once the gateway no longer holds it (it frees a copy a model
        has not used for host_keep_alive): an idle worker's mapping would keep its memory."""
        if self.copy is None:
            return
        try:
            held, mine = (
                os.stat(f"/proc/{os.getppid()}/fd/{self.copy_number}"),
                os.fstat(self.copy.fd),
            )
            same = (held.st_dev, held.st_ino) == (mine.st_dev, mine.st_ino)
        except OSError:
            same = False
        if not same:
            log.info("the gateway freed its copy of %s: unmapped", self.copy.path)
            self.copy.close()
            self.copy = None

    def store_for(self, checked: str) -> WeightStore | None:
        """The store a start given the gateway's copy `checked` uses, handed over (close() no
        longer closes it): the copy mapped at warm-up if it is that one, else the file store.
        A copy not used stays mapped until close(): unmapping it takes a while (16-29 ms for
        514 MiB on the 2-core VM), which a start should not wait for."""
        store, self.store = self.store, None
        if self.copy is not None and self.copy_number == checked and store is not None:
            store.close()
            store, self.copy = self.copy, None
        return store

    def unchanged(self, path: Path) -> bool:
        """Every file as it was at the check, and none changed (written, or moved in: ctime) in
        the RACY_SECONDS before it; a file gone or unreadable: not unchanged."""
        newest = max((max(f[3], f[4]) for f in self.files), default=0) / 1e9
        try:
            now = _identity(path)
        except OSError:
            return False
        return newest < self.checked_at - RACY_SECONDS and now == self.files

    def close(self) -> None:
        for store in (self.store, self.copy):
            if store is not None:
                store.close()


def _identity(path: Path) -> list[tuple[int, int, int, int, int]]:
    """Each file of `path` (a directory's, recursively; or the file): what changes with it."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [file_identity(p.stat()) for p in files]


class Assignment:
    """What `medusa run` would have been started with, parsed by its own command."""

    def __init__(self, command: click.Command, argv: list[str]) -> None:
        try:
            ctx = command.make_context("medusa run", list(argv))
        except click.ClickException as e:
            raise ValueError(e.format_message()) from None
        except click.exceptions.Exit:  # --help or --version: not an assignment
            raise ValueError("send the options of `medusa run`, not --help/--version") from None
        p = ctx.params
        if p.get("engine_name") != "medusa" or p.get("argv") or p.get("pool"):
            raise ValueError("a pooled worker serves the reference engine: drop --engine/--pool")
        self.artifact: str | None = p["artifact"]
        self.require, self.validate, self.trust = p["require_artifact"], p["validate"], p["trust"]
        settings = engine_settings(p)
        # NOTE: as `medusa run --artifact` does: the artifact decides what shapes its graphs
        model, settings = resolve(
            ArtifactSettings.read(self.artifact, self.trust) if self.artifact else None,
            p["model"], settings,
            {k for k in settings if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE},
            Wording(lambda name: "--" + name.replace("_", "-"), "MODEL", "--allow-fallback"),
            p["allow_fallback"],
        )  # fmt: skip
        self.model: str | None = model
        self.served_name = p["served_model_name"] or self.model or "smollm2"
        self.config = EngineConfig(model=self.model, **settings)

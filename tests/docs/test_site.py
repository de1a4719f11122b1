"""docs/ builds with `mkdocs build --strict` (CI runs the command; this runs the same build in
this process): every page is in mkdocs.yml's nav and every link between pages resolves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples import REPO

mkdocs_config = pytest.importorskip("mkdocs.config")
mkdocs_build = pytest.importorskip("mkdocs.commands.build")


def test_the_site_builds_strictly_with_every_page_in_the_nav(tmp_path: Path) -> None:
    config = mkdocs_config.load_config(
        config_file=str(REPO / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site")
    )
    mkdocs_build.build(config)
    assert (tmp_path / "site" / "index.html").is_file()
    nav = {Path(p).name for entry in config["nav"] for p in entry.values()}
    assert nav == {p.name for p in (REPO / "docs").glob("*.md")}

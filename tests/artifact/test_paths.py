"""An artifact never makes medusa read outside its directory: file names outside a fixed pattern,
symbolic links, non-regular files and hashes used as path components are refused; images the
manifest does not list are not read."""

from __future__ import annotations

import os
import shutil

import pytest

from medusa.artifact import ArtifactError, load_artifact
from tests.artifact.conftest import edit_manifest, manifest_of

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

SECRET = "/etc/hostname"


def _list_file(name: str):
    def fn(m):
        m["files"][name] = {"sha256": "0" * 64, "size": 1}

    return fn


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "/etc/passwd", "images/../../x.img", "plan.msgpack.zst/", "x.img"]
)
def test_a_file_name_outside_the_pattern_is_refused(art, name):
    edit_manifest(art, _list_file(name))
    with pytest.raises(ArtifactError, match="files key: expected a string matching"):
        load_artifact(art)


def _image(art):
    return next((art / "images").iterdir())


def test_a_symlinked_image_is_refused_even_with_the_right_content(art, tmp_path):
    img = _image(art)
    outside = tmp_path / "outside.img"
    shutil.copy(img, outside)
    img.unlink()
    img.symlink_to(outside)
    with pytest.raises(ArtifactError, match="symbolic link"):
        load_artifact(art)


def test_a_symlinked_images_directory_is_refused(art, tmp_path):
    shutil.move(art / "images", tmp_path / "elsewhere")
    (art / "images").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ArtifactError, match="symbolic link"):
        load_artifact(art)


def test_a_symlinked_manifest_is_refused(art, tmp_path):
    shutil.move(art / "manifest.json", tmp_path / "manifest.json")
    (art / "manifest.json").symlink_to(tmp_path / "manifest.json")
    with pytest.raises(ArtifactError, match="symbolic link"):
        load_artifact(art)


def test_a_fifo_in_place_of_the_plan_is_refused_without_blocking(art):
    (art / "plan.msgpack.zst").unlink()
    os.mkfifo(art / "plan.msgpack.zst")
    with pytest.raises(ArtifactError, match="not a regular file"):
        load_artifact(art)


def test_an_image_listed_under_another_hash_is_refused(art):
    img = _image(art)
    other = "f" * 64

    def rename(m):
        m["files"][f"images/{other}.img"] = m["files"].pop(f"images/{img.name}")

    img.rename(art / "images" / f"{other}.img")
    edit_manifest(art, rename)
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        load_artifact(art)


@pytest.mark.parametrize("sha", ["../../../etc/hostname", SECRET, "A" * 64, "0" * 63, 7])
def test_a_kernel_image_hash_is_checked_before_it_names_a_file(art, sha):
    a = load_artifact(art)
    with pytest.raises(ArtifactError, match="not 64 lowercase hex digits"):
        a.image(sha)


def test_only_images_the_manifest_lists_are_read(art):
    img = _image(art)
    sha = img.stem
    assert load_artifact(art).image(sha) == img.read_bytes()
    assert load_artifact(art).image("") is None  # a kernel whose image was never known
    edit_manifest(art, lambda m: m["files"].pop(f"images/{img.name}") and None)
    assert img.exists()
    assert load_artifact(art).image(sha) is None


def test_an_image_changed_after_loading_is_refused(art):
    a = load_artifact(art)
    img = _image(art)
    img.write_bytes(bytes(len(img.read_bytes())))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        a.image(img.stem)


def test_the_listed_files_are_exactly_those_written(art):
    names = set(manifest_of(art)["files"])
    assert "plan.msgpack.zst" in names
    assert all(n == "plan.msgpack.zst" or n.startswith("images/") for n in names)

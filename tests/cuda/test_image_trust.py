"""A module image names the shared object holding its CPU code. Loading an image never runs code
from anywhere but a library already loaded or one installed next to libsimcuda.so."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

EVIL = r"""
#include <stdio.h>
__attribute__((constructor)) static void run_at_load(void) {
    FILE *fp = fopen(MARKER, "w");
    if (fp) {
        fputs("host code from an artifact ran\n", fp);
        fclose(fp);
    }
}
"""


def _evil_library(cprog, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A shared object whose constructor writes a marker file, named `name` in its own folder."""
    marker = tmp_path / f"marker-{name}"
    src_dir = tmp_path / "src"
    src_dir.mkdir(exist_ok=True)
    (src_dir / "evil.c").write_text(EVIL)
    built = cprog("evil", src_dir=src_dir, libs=(), shared=True, extra=(f'-DMARKER="{marker}"',))
    where = tmp_path / name.replace(".so", "")
    where.mkdir()
    (where / name).write_bytes(built.read_bytes())
    return where / name, marker


def _with_code_path(image: bytes, path: str) -> bytes:
    """The image with the shared object it names replaced (the header's total size fixed)."""
    name_len = struct.unpack_from("<I", image, 24)[0]
    at = 28 + name_len
    old_len = struct.unpack_from("<I", image, at)[0]
    out = bytearray(image[:at] + struct.pack("<I", len(path)) + path.encode())
    out += image[at + 4 + old_len :]
    struct.pack_into("<Q", out, 16, len(out))
    return bytes(out)


def _saved_blas_image(cprog, run, tmp_path: Path) -> bytes:
    shim = cprog("procshim", libs=(), shared=True)
    save = tmp_path / "saved"
    save.mkdir()
    run(cprog("hidden"), env={"LD_PRELOAD": str(shim), "SHIM_SAVE_DIR": str(save)})
    return (save / "image_1.bin").read_bytes()  # image_0 is testkernels, image_1 testblas


def test_an_image_naming_a_library_elsewhere_is_refused_and_never_runs_it(cprog, run, tmp_path):
    evil, marker = _evil_library(cprog, tmp_path, "libevil.so")
    image = tmp_path / "crafted.img"
    image.write_bytes(_with_code_path(_saved_blas_image(cprog, run, tmp_path), str(evil)))
    res = run(cprog("reload"), str(image), env={"MEDUSA_SIM_VERBOSE": "1"})
    assert lines(res.stdout)["load"] == "cudaErrorInvalidKernelImage"
    assert f"image code object {evil} refused: it is not loaded in this process" in res.stderr
    assert "(an image may name no other code)" in res.stderr
    assert not marker.exists()


def test_a_copy_of_a_kernel_library_elsewhere_is_refused_a_link_to_it_is_not(cprog, run, tmp_path):
    blas = _saved_blas_image(cprog, run, tmp_path)
    installed = Path(blas[40 : 40 + struct.unpack_from("<I", blas, 36)[0]].decode())
    assert installed.name == "libsimcuda_testkernels.so"  # where testblas's code lives
    evil, marker = _evil_library(cprog, tmp_path, installed.name)
    image = tmp_path / "moved.img"
    image.write_bytes(_with_code_path(blas, str(evil)))
    res = run(cprog("reload"), str(image))
    assert lines(res.stdout)["load"] == "cudaErrorInvalidKernelImage"
    assert not marker.exists()
    link = tmp_path / "link.so"
    link.symlink_to(installed)
    image.write_bytes(_with_code_path(blas, str(link)))
    res = run(cprog("reload"), str(image))
    assert "reloaded _ZN7testblas11sgemm_nn_f3EiiiPKfS1_Pf: 7 10 15 22" in res.stdout


def test_an_image_naming_a_directory_entry_outside_the_kernel_directory_is_refused(
    cprog, run, tmp_path
):
    blas = _saved_blas_image(cprog, run, tmp_path)
    for path in ("/", "", "/dev/null", "/etc/passwd", "libc.so.6", "..", "/tmp/../"):
        image = tmp_path / "odd.img"
        image.write_bytes(_with_code_path(blas, path))
        res = run(cprog("reload"), str(image))
        assert lines(res.stdout)["load"] == "cudaErrorInvalidKernelImage", path

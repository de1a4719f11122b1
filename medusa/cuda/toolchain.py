"""Compiles small C programs against simcuda (tests, benchmarks, examples)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from medusa.cuda import paths


def c_compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise FileNotFoundError("no C compiler found (install gcc, or set CC)")
    return cc


def compile_program(
    src: Path,
    out_dir: Path,
    *,
    libs: Sequence[str] = ("simcuda",),
    shared: bool = False,
    extra: Sequence[str] = (),
    sources: Sequence[Path] = (),
) -> Path:
    """Builds src, with any further C `sources`, into an executable or a shared object linked to
    the given package libraries.

    The output is named after a hash of the sources and flags, so an unchanged program is reused.
    """
    flags = ["-O2", "-Wall", "-Werror", *(f"-I{d}" for d in paths.include_dirs()), *extra]
    lib_dir = paths.lib_dir()
    link = [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", *(f"-l{lib}" for lib in libs), "-ldl"]
    code = b"".join(f.read_bytes() for f in (src, *sources))
    key = hashlib.sha256(code + " ".join(flags + link).encode()).hexdigest()[:12]
    out = out_dir / f"{src.stem}-{key}{'.so' if shared else ''}"
    if not out.exists():
        cmd = [
            c_compiler(),
            *flags,
            *(["-shared", "-fPIC"] if shared else []),
            str(src),
            *map(str, sources),
            "-o",
            str(out),
            *link,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"compiling {src} failed:\n{res.stderr}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m medusa.cuda.toolchain SRC.c -o PROG`: build a C program against simcuda and its
    test kernels, as the tests do (the README's recorder example builds ./recorded this way)."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m medusa.cuda.toolchain", description=main.__doc__)
    ap.add_argument("src", type=Path, help="C source file")
    ap.add_argument("-o", "--output", type=Path, required=True, help="program to write")
    ap.add_argument(
        "--lib",
        action="append",
        default=None,
        help="package library to link (default: simcuda and simcuda_testkernels)",
    )
    args = ap.parse_args(argv)
    if not args.src.is_file():
        ap.error(f"{args.src}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        built = compile_program(
            args.src, Path(tmp), libs=args.lib or ("simcuda", "simcuda_testkernels")
        )
        shutil.copy2(built, args.output)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

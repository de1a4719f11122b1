"""A file too big for one device call, cut in two parts under 50 MiB each, with a sha256 manifest,
and joined again on the other side only if every part and the whole check out. Standard library
only: the join runs on the lent GPU machine, before anything is installed.

  python3 scripts/gpu/lib/kit_parts.py split FILE KIT        # KIT/part1/NAME.part1, KIT/part2/...,
                                                         # KIT/common/NAME.sha256
  python3 scripts/gpu/lib/kit_parts.py join MANIFEST OUT PART1 PART2
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

PART_LIMIT = 50 * 2**20  # each part strictly under 50 MiB
CHUNK = 4 * 2**20


class PartsError(Exception):
    """A part is missing, corrupt or too big; the message names it and what to do."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split(src: Path, kit: Path) -> Path:
    """Cuts SRC in two halves under KIT/part1 and KIT/part2; returns the manifest's path."""
    size = src.stat().st_size
    first = (size + 1) // 2
    if first >= PART_LIMIT:
        raise PartsError(
            f"{src}: {size} bytes do not fit in two parts under 50 MiB each "
            f"(at most {2 * (PART_LIMIT - 1)} bytes); a third device call would be needed"
        )
    name = src.name
    manifest = kit / "common" / f"{name}.sha256"
    lines = [f"{sha256_of(src)}  {name}"]
    with src.open("rb") as f:
        for i, n in enumerate((first, size - first), start=1):
            part = kit / f"part{i}" / f"{name}.part{i}"
            part.parent.mkdir(parents=True, exist_ok=True)
            with part.open("wb") as out:
                _copy(f, out, n)
            lines.append(f"{sha256_of(part)}  {part.name}")
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def _copy(f, out, n: int) -> None:  # type: ignore[no-untyped-def]
    while n:
        block = f.read(min(CHUNK, n))
        if not block:
            raise PartsError(f"{f.name}: shorter than its size said (it changed while split)")
        out.write(block)
        n -= len(block)


def read_manifest(manifest: Path) -> tuple[tuple[str, str], list[tuple[str, str]]]:
    """(whole name, sha256) and [(part name, sha256)] in order, from a split's manifest."""
    try:
        rows = [line.split(None, 1) for line in manifest.read_text().splitlines() if line.strip()]
    except OSError as e:
        raise PartsError(f"{manifest}: cannot read the manifest ({e.strerror}); carry it") from e
    if len(rows) < 2 or any(len(r) != 2 or len(r[0]) != 64 for r in rows):
        raise PartsError(f"{manifest}: not a split manifest (sha256, two spaces, name per line)")
    whole = (rows[0][1].strip(), rows[0][0])
    return whole, [(r[1].strip(), r[0]) for r in rows[1:]]


def join(manifest: Path, out: Path, parts: list[Path]) -> None:
    """Checks each part against MANIFEST, concatenates them into OUT and checks the whole.
    OUT appears only when everything matched (written beside it, then renamed)."""
    (name, want), expected = read_manifest(manifest)
    if len(parts) != len(expected):
        raise PartsError(f"{name}: {len(expected)} parts expected, {len(parts)} given")
    for path, (part_name, sha) in zip(parts, expected, strict=True):
        if path.name != part_name:
            raise PartsError(f"{path}: expected the part named {part_name} here")
        if not path.is_file():
            raise PartsError(f"{path}: missing; carry it again (scripts/gpu/kit.sh prints how)")
        got = sha256_of(path)
        if got != sha:
            raise PartsError(f"{path}: corrupt (sha256 {got}, manifest says {sha}); carry it again")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.joining")
    h = hashlib.sha256()
    try:
        with tmp.open("xb") as dst:
            for path in parts:
                with path.open("rb") as f:
                    while block := f.read(CHUNK):
                        h.update(block)
                        dst.write(block)
        if h.hexdigest() != want:
            raise PartsError(f"{name}: the joined parts' sha256 {h.hexdigest()} is not {want}")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 3 and argv[0] == "split":
            print(split(Path(argv[1]), Path(argv[2])))
            return 0
        if len(argv) >= 4 and argv[0] == "join":
            join(Path(argv[1]), Path(argv[2]), [Path(p) for p in argv[3:]])
            print(f"joined {argv[2]}: sha256 checked")
            return 0
    except (PartsError, OSError) as e:
        print(f"kit_parts: {e}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

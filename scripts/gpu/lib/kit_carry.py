"""What a device call sends: the working tree (tracked files, untracked files git does not ignore,
shared/) plus the paths it carries, which must be git-ignored paths inside the repository. Each
call stays under 60 MiB (the device tool allows the tree plus 64 MiB of carried paths)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CALL_LIMIT = 60 * 2**20  # working tree + carried paths, per device call


class KitError(Exception):
    """The kit cannot be made or carried; the message says what to change."""


def tree_bytes() -> int:
    """What every device call sends besides the carried paths: tracked files, untracked files
    git does not ignore, and shared/ where the checkout has one."""
    res = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                         capture_output=True, check=True)  # fmt: skip
    files = [REPO / p.decode() for p in res.stdout.split(b"\0") if p]
    files += [p for p in (REPO / "shared").rglob("*")] if (REPO / "shared").is_dir() else []
    return sum(p.lstat().st_size for p in files if p.is_file() and not p.is_symlink())


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def carry_path(kit: Path) -> str | None:
    """KIT relative to the repository, for `carry`; None when KIT lies outside it."""
    try:
        rel = kit.resolve().relative_to(REPO)
    except ValueError:
        return None
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(rel)])
    if ignored.returncode:
        raise KitError(
            f"{kit}: inside the repository but not git-ignored, so both parts would travel with "
            f"the working tree in every call; add '{rel}/' to .gitignore or use .gpukit"
        )
    return str(rel)


def carry_report(kit: Path) -> bool:
    """Prints each call's carry list and bytes; False when a call sends more than 60 MiB."""
    rel, tree, common = carry_path(kit), tree_bytes(), dir_bytes(kit / "common")
    if rel is None:
        print(f"note: {kit} lies outside the repository, which is all the device tool carries; "
              "for the device calls make the kit at .gpukit (figures as if carried)")  # fmt: skip
    ok = True
    for i in (1, 2):
        part = dir_bytes(kit / f"part{i}")
        total = tree + common + part
        carry = json.dumps([f"{rel}/common", f"{rel}/part{i}"]) if rel else "(not carriable)"
        over = total > CALL_LIMIT
        print(f"call {i}: carry {carry}\n  sends {total:,} bytes ({total / 2**20:.1f} MiB, limit "
              f"60 MiB): working tree {tree:,} + common {common:,} + part{i} {part:,}"
              + ("  OVER THE LIMIT" if over else ""))  # fmt: skip
        ok = ok and not over
    return ok

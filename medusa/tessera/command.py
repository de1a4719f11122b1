"""CLI for Tessera (wired into medusa/cli.py): `medusa tessera accesses|crosscheck|plan|place`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # NOTE: imported where used: `medusa run` imports this module at start
    from medusa.trace.run_view import RunView


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def print_accesses(run: RunView, echo=click.echo) -> None:  # type: ignore[no-untyped-def]
    """`medusa inspect --accesses`: each kernel node's extents per allocation."""
    from medusa.tessera.accesses import READ, WRITE, analyze
    from medusa.trace.run_view import KIND_NAMES

    for g, row in enumerate(analyze(run)):
        echo(f"graph {g}: {len(row)} nodes")
        for acc in row:
            if acc is None:
                continue
            flag = " (incomplete)" if acc.incomplete else ""
            echo(
                f"  node {acc.node:4d} {acc.kernel}  [{acc.source}]{flag}  read "
                f"{_fmt(acc.bytes(READ))}, written {_fmt(acc.bytes(WRITE))}"
            )
            for (kind, idx), ext in sorted(acc.extents.items()):
                a = run.allocs[idx] if kind < 2 else None
                name = f"{a.phase}#{a.ordinal}" if a else ""
                spans = ", ".join(
                    f"[{lo}, {hi}) {'-RW'[m] if m < 3 else 'RW'}" for lo, hi, m in ext
                )
                extra = " indirect" if (kind, idx) in acc.indirect else ""
                echo(f"      {KIND_NAMES[kind]} #{idx} {name}{extra}: {spans}")


@click.group("tessera")
def tessera() -> None:
    """Kernel-granularity analysis and partitioning (Tessera)."""


@tessera.command("accesses")
@click.argument("trace", type=click.Path(exists=True, path_type=Path))
def accesses_cmd(trace: Path) -> None:
    """Each graph node's read/write extents, from a trace recorded with MEDUSA_SIM_ACCESSES."""
    from medusa.trace import read_trace
    from medusa.trace.run_view import RunView

    print_accesses(RunView.build(read_trace(trace)))


@tessera.command("crosscheck")
@click.argument("instrumented", type=click.Path(exists=True, path_type=Path))
@click.argument("shifted", type=click.Path(exists=True, path_type=Path))
@click.option("--strict", is_flag=True, help="Exit 1 on any disagreement.")
def crosscheck_cmd(instrumented: Path, shifted: Path, strict: bool) -> None:
    """The access analysis against the two-run pointer classification."""
    from medusa.tessera.crosscheck import crosscheck
    from medusa.trace import read_trace
    from medusa.trace.run_view import RunView

    check = crosscheck(RunView.build(read_trace(instrumented)), RunView.build(read_trace(shifted)))
    click.echo(
        f"{check.nodes_checked} kernel nodes checked, {check.nodes_unknown} without "
        f"recorded accesses, {len(check.disagreements)} disagreements"
    )
    for d in check.disagreements:
        click.echo(f"warning: {d}", err=True)
    if strict and check.disagreements:
        raise SystemExit(1)


@tessera.command("plan")
@click.option(
    "--batch", type=int, default=160, show_default=True, help="Sequences decoded together."
)
@click.option("--context", type=int, default=4096, show_default=True, help="Tokens per sequence.")
@click.option(
    "--objective",
    type=click.Choice(["throughput", "latency"]),
    default="throughput",
    show_default=True,
    help="throughput: minimize the pipeline period (the busiest device's compute or incoming "
    "transfers); latency: minimize one step's kernel times plus the transfers between devices.",
)
def plan_cmd(batch: int, context: int, objective: str) -> None:
    """Plan Llama-3-8B decode over H100 + RTX Pro 6000 (roofline profiles)."""
    from medusa.tessera.planner import solve
    from medusa.tessera.profiles import H100, LLAMA3_8B, PCIE5, RTX_PRO_6000, decode_problem

    p = decode_problem([H100, RTX_PRO_6000], PCIE5, LLAMA3_8B, batch, context)
    plan = solve(p, objective)
    for d, dev in enumerate(p.devices):
        n = plan.placement.count(d)
        click.echo(
            f"{dev.name}: {n} kernels, compute {plan.compute[d] * 1e3:.2f} ms, incoming "
            f"{plan.transfer[d] * 1e3:.2f} ms"
        )
    click.echo(
        f"period {plan.period * 1e3:.2f} ms: {batch / plan.period:.0f} tok/s "
        f"(solved in {plan.solve_seconds:.2f} s, within {plan.gap:.2%} of the optimum)"
    )


@tessera.command("place")
@click.argument("artifact", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The placement file to write (its access recording goes next to it).",
)
@click.option(
    "--how",
    type=click.Choice(["half", "random"]),
    default="half",
    show_default=True,
    help="half: each decode graph's first half of nodes on device 0, the rest on 1.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="For --how random.")
def place_cmd(artifact: Path, out: Path, how: str, seed: int) -> None:
    """Place an artifact's decode graph nodes on two devices, for `medusa run --partition`."""
    from medusa.progress import Progress
    from medusa.tessera.partition import make_placement

    with Progress(steps=2) as progress:
        p = make_placement(artifact, out, how, seed, progress)
    from medusa.artifact.store import load_artifact

    # NOTE: the engine's prefill graphs follow its decode graphs; a split step replays them whole
    # on device 0, as it ran eager prefill
    n = len(load_artifact(artifact).manifest["graphs"]["keys"])
    nodes = ", ".join(str(len(g)) for g in p.graphs[:n])
    rest = len(p.graphs) - n
    whole = f", {rest} prefill graph{'s' * (rest != 1)} whole on device 0" if rest > 0 else ""
    graphs = f"{n} decode graph{'s' * (n != 1)}"
    click.echo(f"{out}: {how} placement of {graphs} ({nodes} nodes){whole}; "
               f"accesses recorded in {p.accesses}")  # fmt: skip

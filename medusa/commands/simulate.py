"""`medusa simulate`: the serving simulators (C2C placement, Prism sharing, Weaver weaving)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from medusa.c2c.link_simulator import Policy, Request
    from medusa.c2c.model import SliceProfile
    from medusa.c2c.scheduler import ModelShape


@click.command(
    short_help="Simulate models sharing a superchip's C2C link.",
    context_settings={"show_default": True},
)
@click.option(
    "--trace",
    "trace_kind",
    default="gamma",
    help="gamma (bursts), poisson, or an Azure LLM trace CSV file.",
)
@click.option("--duration", type=float, help="Seconds of trace (default 60; --sharing: 300).")
@click.option("--rate", default=1.0, help="Requests per second (synthetic traces).")
@click.option("--cv", default=3.0, help="Burstiness of the gamma trace (coefficient of variation).")
@click.option(
    "--slices",
    default="1g.12gb,1g.12gb,1g.12gb,1g.12gb,1g.24gb,2g.24gb,3g.48gb",
    help="GH200 MIG profiles, comma separated.",
)
@click.option(
    "--placement",
    type=click.Choice(["bandwidth", "random"]),
    default="bandwidth",
    help="Models onto slices: keeping the C2C link's demand within its bandwidth, or at random.",
)
@click.option(
    "--chunk",
    type=click.Choice(["tuned", "default"]),
    default="tuned",
    help="Prefill chunk: from the profiling table per model and slice, or 256 tokens.",
)
@click.option(
    "--alpha",
    type=click.Choice(["tuned", "static"]),
    default="tuned",
    help="HybridGEMM's alpha: tuned online (C2CServe Algorithm 2), or fixed at 1 "
    "(a plain output-stationary GEMM).",
)
@click.option("--seed", default=0, help="Seed of the trace and the random placement.")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option(
    "--sharing",
    is_flag=True,
    help="Instead: many models sharing devices, Prism vs static partitioning vs MuxServe-like "
    "(max load at 99% TTFT attainment, devices needed). Uses --models, --devices, --duration "
    "and --seed.",
)
@click.option("--models", "n_models", default=16, help="--sharing: models in the catalog.")
@click.option("--devices", "n_devices", default=8, help="--sharing: 80 GiB devices.")
@click.option(
    "--weaving",
    is_flag=True,
    help="Instead: a hot model offloading attention to a cold model's device (Weaver): "
    "dedicated vs multiplexing vs weaving per device profile.",
)
@click.option("--profiles", default="simcuda,a100,l40s", help="--weaving: device profiles.")
@click.option(
    "--ratio", "weave_ratio", default=0.45, help="--weaving: offloaded share of the hot batch."
)
def simulate(
    trace_kind: str,
    duration: float | None,
    rate: float,
    cv: float,
    slices: str,
    placement: str,
    chunk: str,
    alpha: str,
    seed: int,
    as_json: bool,
    sharing: bool,
    n_models: int,
    n_devices: int,
    weaving: bool,
    profiles: str,
    weave_ratio: float,
) -> None:
    """Simulate several models served on one superchip's MIG slices over the shared C2C link:
    p50/p99 TTFT and TPOT, SLO attainment, C2C utilisation over time, for one policy choice.
    With --sharing: a long-tailed catalog on several devices under three sharing policies.
    With --weaving: a hot model offloading attention to a cold model's device (Weaver)."""
    if weaving:
        from medusa.weaver.command import simulate_weaving

        try:
            simulate_weaving(profiles, weave_ratio, as_json=as_json, echo=click.echo)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        return
    if sharing:
        _simulate_sharing(n_models, n_devices, duration or 300.0, seed, as_json)
        return
    from medusa.c2c.link_simulator import Policy

    _simulate_c2c(
        trace_kind, duration or 60.0, rate, cv, slices, Policy(placement, chunk, alpha), seed,
        as_json,
    )  # fmt: skip


def _simulate_c2c(
    trace_kind: str,
    duration: float,
    rate: float,
    cv: float,
    slices: str,
    policy: Policy,
    seed: int,
    as_json: bool,
) -> None:
    import json

    from medusa.c2c.link_simulator import DEFAULT_MODELS, sparkline
    from medusa.c2c.link_simulator import simulate as run_sim
    from medusa.errors import PlacementError

    profiles = _slice_profiles(slices)
    models = list(DEFAULT_MODELS)
    reqs = _requests(trace_kind, models, duration, rate, cv, seed)
    try:
        r = run_sim(models, profiles, reqs, policy, seed=seed)
    except PlacementError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(
        f"{len(reqs)} requests, {len(profiles)} slices; policy placement={policy.placement} "
        f"chunk={policy.chunk} alpha={policy.alpha}"
    )
    for k in ("p50_ttft", "p99_ttft", "p50_tpot", "p99_tpot", "slo_attainment"):
        click.echo(f"  {k:15} {r[k]:.3f}")
    click.echo(f"  placement       {r['placement']}")
    click.echo(f"  prefill chunk   {r['chunk']}")
    click.echo(f"  final alpha     {r['alpha']}")
    click.echo(f"  C2C utilisation |{sparkline(r['c2c_utilisation'])}|")


def _slice_profiles(slices: str) -> list[SliceProfile]:
    from medusa.c2c.model import GH200_MIG

    try:
        return [GH200_MIG[p.strip()] for p in slices.split(",") if p.strip()]
    except KeyError as e:
        raise click.UsageError(
            f"--slices: unknown profile {e}; known: {sorted(GH200_MIG)}"
        ) from None


def _requests(
    trace_kind: str, models: list[ModelShape], duration: float, rate: float, cv: float, seed: int
) -> list[Request]:
    """The requests of --trace: a CSV file (Azure's), or gamma / poisson arrivals."""
    from medusa.c2c.link_simulator import azure_trace, bursty_trace

    if Path(trace_kind).is_file():
        return azure_trace(trace_kind, models, duration)
    if trace_kind in ("gamma", "poisson"):
        return bursty_trace(models, duration, rate, cv if trace_kind == "gamma" else 1.0, seed)
    raise click.UsageError(f"--trace {trace_kind!r}: use gamma, poisson or a CSV file")


def _simulate_sharing(
    n_models: int, n_devices: int, duration: float, seed: int, as_json: bool
) -> None:
    import json

    from medusa.errors import PlacementError
    from medusa.prism.sharing_simulator import compare

    if n_models < 1 or n_devices < 1 or duration <= 0:
        raise click.UsageError("--models and --devices must be >= 1 and --duration > 0")
    try:
        r = compare(n_models, n_devices, duration, seed, progress=lambda m: click.echo(m, err=True))
    except PlacementError as e:
        raise click.ClickException(f"{e} (try more --devices or fewer --models)") from None
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    base, mux = r["static"]["max_rps"] or 0.0, r["muxserve"]["max_rps"] or 0.0
    click.echo(
        f"{n_models} models (Zipf popularity, bursty), {n_devices} x 80 GiB devices, "
        f"{duration:.0f} s of trace, seed {seed}"
    )
    click.echo(f"{'policy':10} {'max load req/s':>15} {'vs static':>10} {'vs muxserve':>12} "
               f"{'devices for muxserve max':>25}")  # fmt: skip
    for name, row in r.items():
        rps, dev = row["max_rps"] or 0.0, row["devices"]
        click.echo(
            f"{name:10} {rps:15.2f} {_ratio(rps, base):>10} {_ratio(rps, mux):>12} "
            f"{dev if dev is not None else f'> {2 * n_devices}':>25}"
        )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"

"""What an artifact decides of the engine's settings: the model and every setting that shapes
what start-up allocates or captures (medusa.restore.compat.CONFIG_KEYS, as materialize recorded
them in the manifest's `engine`). A start from an artifact takes them from it; a setting given
with another value is refused before anything starts, unless a fallback start is asked for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from medusa.artifact import ArtifactError, read_manifest
from medusa.engine.config import EngineConfig, default_capture_sizes, default_prefill_sizes
from medusa.errors import RefusedError
from medusa.restore.compat import CONFIG_KEYS
from medusa.restore.errors import RestoreError


class SettingConflict(RefusedError, ValueError):
    """A setting given with another value than the artifact's; the message says the ways out."""


@dataclass(frozen=True)
class ArtifactSettings:
    path: str
    model: str | None  # as given to materialize (None: the default model)
    identity: str  # the weights' identity the artifact records
    engine: dict[str, Any] = field(default_factory=dict)  # CONFIG_KEYS, as recorded
    store: bool = False  # the artifact holds a weight store

    @classmethod
    def read(cls, path: str | Path, trust: str | Path | None = None) -> ArtifactSettings | None:
        """The settings of the engine artifact at `path`; None if its manifest cannot be read
        or is not an engine's (the start then loads it and says why it is not used)."""
        found = _recorded(path, trust)
        if found is None:
            return None
        m, engine = found
        if settings_problem(engine) is not None:
            return None  # NOTE: damaged or crafted: the start loads it, and says why it is unfit
        model = m["engine"].get("model")
        return cls(
            str(path),
            model if isinstance(model, str) else None,
            str(m["model"].get("identity")),
            engine,
            "weights" in m,
        )

    def conflicts(self, given: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """(setting, given value, the artifact's) for each given setting the artifact decides
        otherwise."""
        return [
            (k, v, self.engine[k])
            for k, v in sorted(given.items())
            if k in self.engine and _typed(k, v) != self.engine[k]
        ]

    def refusal(self, name: str, given: Any, recorded: Any, words: Wording) -> str:
        """One line: the setting, both values, and the ways out."""
        where, flag = words.setting(name), "--" + name.replace("_", "-")
        again = flag if given is True else f"{flag} {show(given) if given != () else repr('')}"
        if name == "prefill_graph_sizes":
            given = _prefill_shown({**self.engine, name: given})
            recorded = _prefill_shown({**self.engine, name: recorded})
        return (
            f"{where} {show(given)}: the artifact {self.path} was materialized with {name} "
            f"{show(recorded)}; drop {where} (the artifact's {show(recorded)} is used), or "
            f"materialize again with {again}{words.or_fallback()}"
        )

    def summary(self) -> str:
        """The settings a start from this artifact runs with, as `medusa inspect` prints them."""
        model = self.model or "smollm2 (the default)"
        weights = "its weight store" if self.store else "the model file"
        shown = {**self.engine}
        if shown.get("capture_sizes") == () and "max_num_seqs" in shown:
            sizes = ",".join(map(str, default_capture_sizes(shown["max_num_seqs"])))
            shown["capture_sizes"] = f"default ({sizes})"
        if "prefill_graph_sizes" in shown:
            shown["prefill_graph_sizes"] = _prefill_shown(shown)
        settings = ", ".join(f"{k} {show(v)}" for k, v in shown.items())
        return f"model {model}, loaded from {weights}\n{' ' * 12}{settings}"


def _recorded(
    path: str | Path, trust: str | Path | None = None
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The manifest of the engine artifact at `path` and the settings it decides, as recorded
    (typed as EngineConfig holds them); None if it cannot be read or is not an engine's."""
    try:
        m = read_manifest(Path(path), trust)
    except (ArtifactError, OSError):
        return None
    if m.get("kind") != "engine":
        return None
    recorded = m["engine"]
    return m, {k: _typed(k, recorded[k]) for k in CONFIG_KEYS if k in recorded}


def settings_problem(engine: dict[str, Any]) -> str | None:
    """Why settings recorded in a manifest make no EngineConfig (a value of another type, or out
    of range: a damaged or crafted artifact), or None."""
    try:
        EngineConfig(**{k: v for k, v in engine.items() if k != "model"})
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def unusable_settings(path: str | Path) -> str | None:
    """What `medusa inspect` says of an engine artifact whose settings `read` cannot take."""
    found = _recorded(path)  # None: not an engine's, or unreadable (inspect has said why)
    problem = None if found is None else settings_problem(found[1])
    return None if problem is None else (
        f"nothing: its recorded engine settings are not valid ({problem}); medusa run --artifact "
        "will not use it: materialize again"
    )  # fmt: skip


def engine_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The EngineConfig fields among a command's parameters (`medusa run`'s, say), as
    EngineConfig takes them: capture_sizes not given is left to its default."""
    names = {f.name for f in fields(EngineConfig)} - {"model"}
    out = {k: v for k, v in params.items() if k in names}
    for name in ("capture_sizes", "prefill_graph_sizes"):
        if out.get(name) is None:
            out.pop(name, None)
    return out


def _prefill_shown(engine: dict[str, Any]) -> str:
    """prefill_graph_sizes as a start from the artifact takes it: the default's buckets, or
    none (eager prefill)."""
    sizes = engine["prefill_graph_sizes"]
    if sizes is None:
        most = min(engine.get("max_num_batched_tokens", 512),
                   engine.get("max_num_seqs", 8) * engine.get("max_model_len", 2048))  # fmt: skip
        return f"default ({show(default_prefill_sizes(most))})"
    return show(tuple(sizes)) if sizes else "none (eager prefill)"


def _typed(name: str, value: Any) -> Any:
    """A recorded value as EngineConfig holds it (JSON has lists where it has tuples)."""
    if name in ("capture_sizes", "prefill_graph_sizes") and isinstance(value, list | tuple):
        return tuple(value)
    return value


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(default)"
    return str(value)


@dataclass(frozen=True)
class Wording:
    """How the caller names what was given: a setting (`--max-num-seqs`, or
    `models.a.engine.max_num_seqs`), the model, and the option that starts the normal way
    instead of refusing, where there is one."""

    setting: Callable[[str], str]
    model: str
    fallback: str | None = None

    def or_fallback(self) -> str:
        return (
            f" (or pass {self.fallback} to start the normal way with it)" if self.fallback else ""
        )


def resolve(
    art: ArtifactSettings | None,
    model: str | None,
    settings: dict[str, Any],
    explicit: set[str],
    words: Wording,
    allow_fallback: bool = False,
) -> tuple[str | None, dict[str, Any]]:
    """The model and engine settings a start from `art` runs with: the artifact's where the
    user gave none (`explicit`: the names given), the user's otherwise. A given one that the
    artifact decides otherwise is refused (SettingConflict naming it as `words` do, both values
    and the ways out) unless `allow_fallback`: then the given ones are used, and the start
    finds the artifact unfit and starts the normal way."""
    if art is None:
        return model, settings
    given = {k: settings[k] for k in explicit if k in settings}
    refusals = [art.refusal(k, v, r, words) for k, v, r in art.conflicts(given)]
    if model is not None and not same_model(model, art):
        refusals.insert(0, (
            f"{words.model} {model}: the artifact {art.path} was materialized for "
            f"{art.model or 'smollm2 (the default)'}; drop {words.model} (the artifact's is "
            f"used), or materialize {model}{words.or_fallback()}"
        ))  # fmt: skip
    if refusals and not allow_fallback:
        raise SettingConflict("; ".join(refusals))
    decided = {k: v for k, v in art.engine.items() if k not in explicit}
    return (model if model is not None else art.model), {**settings, **decided}


def same_model(model: str, art: ArtifactSettings) -> bool:
    """Whether MODEL is the artifact's: the same file, or one that holds the same weights.
    ModelError (naming MODEL and what to pass) if MODEL is none."""
    from medusa.engine.loader import ModelError, locate_model, open_model

    path = locate_model(model).resolve()
    try:
        if path == locate_model(art.model).resolve():
            return True
    except ModelError:  # the artifact's model is not here: compare what the weights are
        pass
    return open_model(path).identity() == art.identity


def graph_keys(
    graphs: dict[str, Any], config: EngineConfig, num_graphs: int
) -> tuple[list[int], list[int]]:
    """The artifact's decode batch sizes and prefill token counts, checked against what this
    engine captures (in capture order, largest first) and the plan's graph count: keys are
    trusted to size buffers, so a tampered list (a bucket beyond the workspace, a swapped order)
    is refused, never used."""
    sizes, prefill = list(graphs["keys"]), list(graphs.get("prefill_keys", []))
    want = sorted(config.graph_sizes, reverse=True), sorted(config.prefill_sizes, reverse=True)
    if (sizes, prefill) != want or len(sizes) + len(prefill) != num_graphs:
        raise RestoreError(
            f"the artifact's graphs (decode {sizes}, prefill {prefill}, {num_graphs} in its plan) "
            f"are not the ones this engine captures (decode {want[0]}, prefill {want[1]}): "
            "materialize again"
        )
    return sizes, prefill

"""Step hooks: how a system outside the engine takes part in its steps without the engine knowing
it (Weaver's offload and its receiver, C2C's alpha tuner: medusa.weaver.hot, medusa.weaver.cold,
medusa.c2c.alpha_tuner). A hook is added to one engine (LLMEngine.add_hook) by whoever pairs or
configures it, or made by the engine from a factory registered under a name its config asks for
(EngineConfig.step_hooks; medusa.plugins registers them). The engine calls, between steps:

- `decode(seqs)` instead of its own decode step, if the hook `decodes` (at most one does);
- `after_step(step)` after every step that ran, once its outputs are known;
- `poll_idle()` when it has nothing to run and the hook `polls_when_idle` (its caller polls it:
  LLMEngine.poll_idle);
- `attach(engine)` when added and `detach()` when removed, at shutdown, or once the hook says it
  is `finished` (after the step or idle poll that finished it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medusa.engine.sequence import Sequence, StepOutput

if TYPE_CHECKING:
    from medusa.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class Step:
    """What one step did."""

    seqs: list[Sequence]
    is_prefill: bool
    outputs: list[StepOutput]  # the sequences that got a token (not a prefill's earlier chunks)
    num_tokens: int  # a prefill: its sequences' lengths before the step; a decode: one a sequence
    seconds: float  # the forward pass, from its launch to its sampled tokens on the host


class StepHook:
    """Every method does nothing by default; a hook overrides what it takes part in."""

    decodes = False  # whether decode() runs the engine's decode steps

    def attach(self, engine: LLMEngine) -> None:
        """Added to `engine`, between two steps."""

    def detach(self) -> None:
        """Removed from its engine, between two steps (or at the engine's shutdown)."""

    def decode(self, seqs: list[Sequence]) -> list[int] | None:
        """A decode step of `seqs`: their sampled tokens, or None if the step was dropped (the
        hook put its sequences back in the waiting queue) and must be scheduled again."""
        raise NotImplementedError(f"{type(self).__name__} does not decode")

    def after_step(self, step: Step) -> None:
        """After a step that ran, before the KV cache gives back or maps pages for the next."""

    @property
    def polls_when_idle(self) -> bool:
        """Whether it has work of its own while the engine has none (poll_idle)."""
        return False

    def poll_idle(self) -> None:
        """One unit of that work; the caller sleeps a little between two."""

    @property
    def finished(self) -> bool:
        """Whether it has nothing more to do (a receiver whose sender ended the pairing): the
        engine then removes it."""
        return False


StepHookFactory = Callable[["LLMEngine"], StepHook]
_FACTORIES: dict[str, StepHookFactory] = {}


def register_step_hook(name: str, factory: StepHookFactory) -> None:
    """Makes `factory(engine)` the hook of engines whose config's step_hooks name `name`."""
    _FACTORIES[name] = factory


def step_hook_factory(name: str) -> StepHookFactory:
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(
            f"the step hook {name!r} is not registered in this process (registered: "
            f"{', '.join(sorted(_FACTORIES)) or 'none'}); call medusa.plugins.register() before "
            "building the engine (it registers the research systems' plug-ins)"
        )
    return factory

"""Online tuning of HybridGEMM's alpha for an engine whose weights stay on the host (tune_alpha), a
step hook of the engine (medusa.engine.step_hooks, registered as "alpha_tuner" by medusa.plugins):
after each interval of steps, the controller sees the C2C and HBM utilisations (GPM counters on a
GH200, the performance model elsewhere) and the new alpha takes effect at the next step, a request
boundary for every sequence in it."""

from __future__ import annotations

from medusa.c2c.controller import AlphaController
from medusa.c2c.model import GH200_MIG, Traffic, gemm_traffic
from medusa.c2c.telemetry import ModelTelemetry, telemetry_for
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.spec import ModelSpec
from medusa.engine.step_hooks import Step, StepHook


class AlphaTuner(StepHook):
    def __init__(
        self, config: EngineConfig, spec: ModelSpec, *, interval: int = 8, tpot_target: float = 0.1
    ) -> None:
        if config.weights != "host":
            raise ValueError("tune_alpha needs weights='host' (HybridGEMM runs only then)")
        self.spec, self.interval, self.tpot_target = spec, interval, tpot_target
        self.slice = GH200_MIG[config.slice_profile]
        self.telemetry = telemetry_for(self.slice)
        self.controller = AlphaController(alpha=config.alpha)
        self._steps, self._seconds, self._traffic = 0, 0.0, Traffic(0, 0, 0, 0)
        self.history: list[float] = []
        self._alphas: list[float] = []  # the engine's, per layer, once attached

    @classmethod
    def for_engine(cls, engine: LLMEngine) -> AlphaTuner:
        return cls(engine.config, engine.spec)

    def attach(self, engine: LLMEngine) -> None:
        self._alphas = engine.runner.alphas

    def after_step(self, step: Step) -> None:
        self.observe(step.num_tokens, step.seconds, self._alphas)

    def _step_traffic(self, tokens: int, alpha: float) -> Traffic:
        s = self.spec
        shapes = [
            (s.qkv_size, s.hidden_size),
            (s.hidden_size, s.q_size),
            (2 * s.intermediate_size, s.hidden_size),
            (s.hidden_size, s.intermediate_size),
        ]
        c2c = hbm_r = hbm_w = flops = 0
        for n, k in shapes:
            t = gemm_traffic(tokens, n, k, alpha, elem=4)
            c2c, hbm_r, hbm_w, flops = (
                c2c + t.c2c_read,
                hbm_r + t.hbm_read,
                hbm_w + t.hbm_write,
                flops + t.flops,
            )
        layers = s.num_layers
        return Traffic(c2c * layers, hbm_r * layers, hbm_w * layers, flops * layers)

    def observe(self, tokens: int, seconds: float, alphas: list[float]) -> None:
        t = self._step_traffic(tokens, alphas[0])
        a = self._traffic
        self._traffic = Traffic(
            a.c2c_read + t.c2c_read,
            a.hbm_read + t.hbm_read,
            a.hbm_write + t.hbm_write,
            a.flops + t.flops,
        )
        self._steps += 1
        self._seconds += seconds
        if self._steps < self.interval:
            return
        if isinstance(self.telemetry, ModelTelemetry):
            u_c2c, u_hbm = self.telemetry.utilisation(self._traffic, self._seconds)
        else:
            u_c2c, u_hbm = self.telemetry.utilisation(self.slice.hbm_bw)
        alpha = self.controller.update(u_c2c, u_hbm, self._seconds / self._steps, self.tpot_target)
        alphas[:] = [alpha] * len(alphas)  # applied from the next step on
        self.history.append(alpha)
        self._steps, self._seconds, self._traffic = 0, 0.0, Traffic(0, 0, 0, 0)

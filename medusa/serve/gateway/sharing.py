"""Elastic slices (`sharing: elastic`): several models' workers on one slice, drawing KV pages from
one page ledger per slice, made where the slice is (the placement back-end's `open_ledger`: a
file on this machine, or on a Ray node by its slice actor), placed and scheduled as Prism does.

- The ledger's budget is the slice's memory in 2 MiB pages. The gateway holds a row per model it
  starts there for the model's weights (and activations), so the KV memory the workers share is
  the slice's memory minus its models' weights, as in Prism's KV pressure ratio.
- Global placement (Prism Alg. 1, `medusa.prism.placement`): a model that must start goes to the
  elastic slice whose KVPR = sum(rate / slo_ttft) / shared KV memory, with it, is lowest, rates
  measured over a sliding window. A slice short of memory for it takes it only by evicting idle
  models, larger slo_ttft first, and only when no slice has room without evicting.
- Local scheduling (Alg. 2): one `SliceQueue` per slice orders its requests by Moore-Hodgson.

Workers started there get MEDUSA_KV_LEDGER (from the back-end that starts them) and
`--kv-memory elastic`; an idle worker's KV pages go back to the ledger at once. Slices that join
later (a Ray node) become elastic as they come; a lost slice's ledger goes with it."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from medusa.errors import PlacementError
from medusa.prism.placement import ModelLoad, evict, kvpr, place
from medusa.serve.gateway.admission import RateMeter, SliceQueue
from medusa.serve.gateway.config import GatewayConfig
from medusa.serve.gateway.metrics import GatewayMetrics
from medusa.serve.gateway.placement import footprint
from medusa.serve.gateway.slice_ledger import OpenLedger, SliceLedger, file_ledgers
from medusa.serve.gateway.slices import Slice

log = logging.getLogger("medusa.gateway")

PAGE_BYTES = 2 << 20  # the VMM granularity of simcuda and of current NVIDIA GPUs


class _Process(Protocol):
    @property
    def pid(self) -> int: ...


class _State(Protocol):
    @property
    def value(self) -> str: ...


class Resident(Protocol):
    """What placement needs of a worker (the gateway's Instance)."""

    inflight: int

    @property
    def model(self) -> str: ...

    @property
    def slice(self) -> Slice: ...

    @property
    def proc(self) -> _Process: ...

    @property
    def state(self) -> _State: ...


@dataclass(frozen=True)
class Choice:
    slice: Slice
    evict: list[Resident]  # idle workers to stop before the model starts there


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE_BYTES)


class Sharing:
    def __init__(
        self,
        config: GatewayConfig,
        slices: list[Slice],
        *,
        open_ledger: OpenLedger | None = None,
        ledger_dir: Path | None = None,
        footprints: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        """`open_ledger`: makes a slice's ledger where its workers run (the back-end's); or
        files in `ledger_dir` (a private directory) on this machine."""
        self.config = config
        self.models = config.models
        self.rates = RateMeter(config.prism.rate_window)
        self.slices: list[Slice] = []
        if open_ledger is None and ledger_dir is None:
            raise ValueError("Sharing needs open_ledger (the back-end's) or a ledger_dir")
        self._open = open_ledger or file_ledgers(ledger_dir)  # type: ignore[arg-type]
        self._footprints = dict(footprints or {})
        self.ledgers: dict[str, SliceLedger] = {}
        self.queues: dict[str, SliceQueue] = {}
        self._weights: set[tuple[str, str]] = set()  # (slice, model): its weights' row is held
        self._moved: dict[str, float] = {}  # model -> when it was last migrated
        self.follow(slices)

    def follow(self, slices: Sequence[Slice]) -> None:
        """Brings the elastic slices up to date with `slices` (the back-end's list, which may
        grow and shrink): a new one gets its ledger, a lost one's ledger goes (a lost node's
        went with the node). Cheap when nothing changed."""
        present = {id(s) for s in slices}
        for s in [s for s in self.slices if id(s) not in present]:
            # NOTE: its queue stays: a request admitted there ends with done() once its worker,
            # lost with the slice, is found dead.
            self.slices = [x for x in self.slices if x is not s]
            self.ledgers.pop(s.id).remove()  # (a lost Ray node's: nothing left to call)
            self._weights = {(i, m) for i, m in self._weights if i != s.id}
            log.info("slice %s is gone, and its ledger with it", s.id)
        known = {id(s) for s in self.slices}
        for s in slices:
            if id(s) in known or self.config.sharing_of(s.kind) != "elastic":
                continue
            self.ledgers[s.id] = self._open(s, s.memory // PAGE_BYTES, PAGE_BYTES)
            s.shared = True
            self.slices.append(s)
            self.queues.setdefault(
                s.id, SliceQueue(self.config.prism.prefill_speed, self.config.prism.concurrency)
            )
            log.info("slice %s is elastic: page ledger %s", s.id, self.ledgers[s.id].path)

    @staticmethod
    def static(s: Slice) -> bool:
        return not s.shared

    @staticmethod
    def worker_settings(s: Slice) -> dict[str, Any]:
        """The engine settings a worker on `s` needs whatever its model's are."""
        return {"kv_memory": "elastic"} if s.shared else {}

    # ---- global placement ----
    def load(self, model: str) -> ModelLoad:
        if model not in self._footprints:
            self._footprints[model] = footprint(self.models[model])
        weights, min_kv = self._footprints[model]
        return ModelLoad(
            model,
            _pages(weights) * PAGE_BYTES,
            self.rates.rate(model),
            self.models[model].slo_ttft,
            min_kv,
        )

    def choose(
        self, model: str, live: Sequence[Resident], waiting: Mapping[str, int]
    ) -> Choice | None:
        """The elastic slice `model` should start on, and whom to evict there; None: none can
        take it now (a static slice may). Idle: warm, no request in flight or waiting."""
        new = self.load(model)
        best: tuple[tuple[bool, float, int, int], Choice] | None = None
        for index, s in enumerate(self.slices):
            here = [i for i in live if i.slice is s]
            if any(i.model == model for i in here) or s.id not in self.ledgers:
                continue  # one worker per model and slice (scaling up goes elsewhere); closed
            loads = {i.model: self.load(i.model) for i in here}
            ledger = self.ledgers[s.id]
            free = ledger.free() * PAGE_BYTES
            weights = sum(m.weight_bytes for m in loads.values())
            idle = {
                i.model
                for i in here
                if i.state.value == "warm" and not i.inflight and not waiting.get(i.model)
            }
            try:
                need = new.weight_bytes + new.min_kv_bytes
                out = evict(list(loads.values()), idle, free + weights, need)
            except PlacementError:
                continue
            stay = [m for name, m in loads.items() if name not in out]
            score = kvpr([*stay, new], ledger.capacity * PAGE_BYTES)
            if score == float("inf"):
                continue
            key = (bool(out), score, -free, index)
            if best is None or key < best[0]:
                best = (key, Choice(s, [i for i in here if i.model in out]))
        return None if best is None else best[1]

    def migration(
        self, live: Sequence[Resident], now: float, threshold: float = 0.2, cooldown: float = 30.0
    ) -> tuple[Resident, Slice] | None:
        """One move Prism's placement (Alg. 1) makes now: a warm worker whose model would see a
        KV pressure lower by more than `threshold` (relative) on another elastic slice that has
        room for it, the most urgent model first; None when placement is settled. A model moved
        in the last `cooldown` seconds stays, so measured rates settle before it moves again.
        The gateway starts the model there (a restore) and retires the old worker once the new
        one serves: a migration drops nothing."""
        placed = [
            i
            for i in live
            if i.slice.shared and i.slice.id in self.ledgers and i.state.value == "warm"
        ]
        count = Counter(i.model for i in placed)
        single = [i for i in placed if count[i.model] == 1]  # scaled-out models stay where they are
        if len(self.ledgers) < 2 or not single:
            return None
        slices = [s for s in self.slices if s.id in self.ledgers]
        index = {s.id: d for d, s in enumerate(slices)}
        loads = {i.model: self.load(i.model) for i in single}
        memory = [self.ledgers[s.id].capacity * PAGE_BYTES for s in slices]
        try:
            target = place(
                list(loads.values()), memory, {i.model: index[i.slice.id] for i in single},
                threshold,
            )  # fmt: skip
        except PlacementError:
            return None
        for i in sorted(single, key=lambda i: (-loads[i.model].urgency, i.model)):
            d = target[i.model]
            if d == index[i.slice.id] or now - self._moved.get(i.model, -cooldown) < cooldown:
                continue
            m = loads[i.model]
            if self.ledgers[slices[d].id].free() * PAGE_BYTES >= m.weight_bytes + m.min_kv_bytes:
                self._moved[i.model] = now
                return i, slices[d]
        return None

    def make_room(self, model: str, choice: Choice, retire: Callable[[Any], None]) -> bool:
        """Stops the idle workers `choice` evicts, then takes the pages of `model`'s weights;
        False if they are still not free (another worker mapped KV pages meanwhile)."""
        for victim in choice.evict:
            log.info("evicting idle %s from %s for %s", victim.model, choice.slice.id, model)
            retire(victim)
        return self.reserve(choice.slice, model)

    def reserve(self, s: Slice, model: str) -> bool:
        """Takes the pages of `model`'s weights on elastic slice `s`; False if they are not free."""
        if not self.ledgers[s.id].hold(f"weights:{model}", _pages(self.load(model).weight_bytes)):
            return False
        self._weights.add((s.id, model))
        return True

    def release(self, s: Slice, model: str) -> None:
        """Gives back what `reserve` took (the worker's own KV row goes when it exits)."""
        if (s.id, model) in self._weights and any(x is s for x in self.slices):
            self._weights.discard((s.id, model))
            self.ledgers[s.id].drop(f"weights:{model}")

    # ---- local scheduling ----
    async def admit(self, inst: Resident, prompt_tokens: int) -> None:
        """On an elastic slice: waits for the request's turn in the slice's queue; at once
        elsewhere. An admitted request ends with `done` (the gateway's Lease.release); one that
        raised here (its client left) was not admitted."""
        if inst.slice.shared:
            await self.queues[inst.slice.id].admit(self.models[inst.model].slo_ttft, prompt_tokens)

    def done(self, inst: Resident) -> None:
        if inst.slice.shared:
            self.queues[inst.slice.id].done()

    # ---- reporting ----
    def report(self, metrics: GatewayMetrics, live: Sequence[Resident]) -> None:
        """Sets the Prism gauges: KV pages held per slice and model (the ledger's rows of that
        model's workers), each slice's KVPR, and its ledger's free and total pages."""
        for s in [s for s in self.slices if s.id in self.ledgers]:
            ledger = self.ledgers[s.id]
            here = [i for i in live if i.slice is s]
            by_pid = {i.proc.pid: i.model for i in here}
            held = dict.fromkeys(self.models, 0)
            for h in ledger.holders():
                if h.pid in by_pid:
                    held[by_pid[h.pid]] += h.pages
            for model, pages in held.items():
                metrics.prism_pages.labels(s.id, model).set(pages)
            score = kvpr([self.load(i.model) for i in here], ledger.capacity * PAGE_BYTES)
            metrics.prism_kvpr.labels(s.id).set(score * 2**30)
            metrics.prism_ledger.labels(s.id, "free").set(ledger.free())
            metrics.prism_ledger.labels(s.id, "capacity").set(ledger.capacity)
            metrics.prism_queue.labels(s.id).set(len(self.queues[s.id]))

    def close(self) -> None:
        """Removes the ledgers (at shutdown, once the workers are gone)."""
        self._weights.clear()
        for ledger in self.ledgers.values():
            ledger.remove()
        self.ledgers.clear()

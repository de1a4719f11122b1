"""What a hot engine's offload (medusa.weaver.hot) is made of besides its step hook: the pairing
it is asked for (WeavingLink), the exchange region's geometry for its model, and its block
manager as the offload sees it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medusa.engine.block_manager import Blocks
from medusa.engine.config import EngineConfig
from medusa.engine.sequence import Sequence
from medusa.engine.spec import ModelSpec
from medusa.weaver.region import Geometry
from medusa.weaver.sender import TIMEOUT


@dataclass(frozen=True)
class WeavingLink:
    """A hot engine's side of a pairing: the region file it creates (the receiver opens it) and
    the share of its sequences to offload."""

    region: str | Path
    ratio: float
    timeout: float = TIMEOUT  # seconds without the receiver's heartbeat before it counts as lost
    dir_fd: int | None = None  # the region's directory, opened: region is a name there

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"weaving ratio {self.ratio}: must be within [0, 1]")
        if self.timeout <= 0:
            raise ValueError(f"weaving timeout {self.timeout}: must be positive seconds")


def region_geometry(spec: ModelSpec, config: EngineConfig) -> Geometry:
    """Room for a decode step of every sequence, or one whole sequence's KV (a prefill handed over,
    or a sequence handed back)."""
    rows = max(config.max_model_len, config.max_num_seqs)
    s = spec
    return Geometry(
        s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, config.max_num_seqs, rows
    )


class OffloadBlocks:
    """The scheduler's block manager as the offload sees it: an offloaded sequence holds no local
    blocks, so it can always append; freeing it (finished, aborted, preempted) queues its release
    on the receiver."""

    def __init__(self, inner: Blocks, offloaded: set[int], released: list[int]) -> None:
        self.inner, self._offloaded, self._released = inner, offloaded, released

    def __getattr__(self, name: str) -> Any:  # block_size, num_blocks, num_free_blocks, trim, ...
        return getattr(self.inner, name)

    def deallocate(self, seq: Sequence) -> None:
        if seq.seq_id in self._offloaded:
            self._offloaded.discard(seq.seq_id)
            self._released.append(seq.seq_id)
        else:
            self.inner.deallocate(seq)

    def can_append(self, seq: Sequence) -> bool:
        return seq.seq_id in self._offloaded or self.inner.can_append(seq)

    def may_append(self, seq: Sequence) -> None:
        if seq.seq_id not in self._offloaded:
            self.inner.may_append(seq)

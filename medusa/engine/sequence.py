"""One request's token sequence, its place in the paged KV cache, and what a step gives it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from itertools import count

from medusa.engine.sampling import SamplingParams

_ids = count()


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(self, prompt: list[int], params: SamplingParams, seed: int) -> None:
        self.seq_id = next(_ids)
        self.status = Status.WAITING
        self.token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.params = params
        self.seed = seed
        self.block_table: list[int] = []
        self.finish_reason: str | None = None
        self.num_computed = 0  # tokens whose KV is in the cache (prefill may come in chunks)
        self.chunk = 0  # tokens this step computes

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    def num_blocks(self, block_size: int) -> int:
        return -(-len(self) // block_size)


@dataclass
class StepOutput:
    """A sequence's token from one step."""

    seq: Sequence
    token: int
    text: str  # the text this token completed (may be "" mid-character)
    finished: bool

"""What every placement back-end does for the gateway (medusa.serve.gateway.backends)."""

from __future__ import annotations

import abc
from typing import Any

from medusa.serve.gateway.config import GatewayConfig
from medusa.serve.gateway.slice_ledger import SliceLedger
from medusa.serve.gateway.slices import Slice
from medusa.serve.gateway.worker_handle import WorkerHandle


class WorkerBackend(abc.ABC):
    name: str
    weaving = False  # its workers can pair for Weaver (they share a machine and a directory)

    @abc.abstractmethod
    def discover(self, topology: str | list[Any] | None) -> list[Slice]:
        """The slices workers can be placed on now (the list `refresh` keeps up to date)."""

    @abc.abstractmethod
    def launch(self, slc: Slice, args: list[str], local_env: dict[str, str]) -> WorkerHandle:
        """Starts `medusa run ARGS` on `slc` (returns at once; see WorkerHandle.placed).
        `local_env`: settings that hold only on the gateway's own machine (the descriptor of a
        host-weight store's copy the gateway checked); a back-end whose workers run elsewhere
        drops it."""

    @abc.abstractmethod
    def open_ledger(self, slc: Slice, pages: int, page_bytes: int) -> SliceLedger:
        """Makes the page ledger of elastic slice `slc` where its workers run, and has the
        workers started there find it (a file named in their env: MEDUSA_KV_LEDGER)."""

    async def assignment(
        self, worker: WorkerHandle, args: list[str], store_checked: str
    ) -> tuple[list[str], str]:
        """What a pooled worker `launch` started is told to start, for `medusa run ARGS` with
        `store_checked` (HostWeights.vouched): as is where the worker runs here; a back-end
        whose workers run elsewhere gives the artifact's copy on the worker's node, and no
        store_checked (a descriptor of the gateway's). Raises ValueError if the artifact cannot
        get there."""
        return args, store_checked

    def check(self, config: GatewayConfig) -> None:  # noqa: B027 - most honour all
        """Raises ConfigError for settings this back-end cannot honour."""

    def refresh(self, slices: list[Slice]) -> None:  # noqa: B027 - fixed slices
        """Brings `slices` (in place) up to date with nodes that joined or were lost: free slices
        of a lost node go, a new node's are added. Called from the event loop, often: cheap."""

    async def close(self) -> None:  # noqa: B027 - nothing held
        """Releases what the back-end holds (its cluster connection)."""

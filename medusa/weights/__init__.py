"""The weight store: an engine's weights exactly as they lie in device memory, in one aligned
file with a checksum per chunk, written by `medusa materialize` and loaded (or, for host-resident
weights, mapped and registered) at a restored start."""

from medusa.weights.errors import WeightStoreError
from medusa.weights.store import WeightStore, open_store
from medusa.weights.writer import write_store

__all__ = ["WeightStore", "WeightStoreError", "open_store", "write_store"]

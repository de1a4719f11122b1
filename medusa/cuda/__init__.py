"""A thin ctypes binding to the CUDA ABI, served by the real driver or by simcuda."""

from medusa.cuda.backend import Backend, load_backend
from medusa.cuda.errors import CudaError

__all__ = ["Backend", "CudaError", "load_backend"]

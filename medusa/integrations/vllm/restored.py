"""What stands in, in a restored vLLM, for the objects a capture makes: graphs whose replay()
launches a restored executable, and output tensors over the restored memory."""

from __future__ import annotations

from typing import Any


class RestoredGraph:
    """Stands in for a captured torch.cuda.CUDAGraph: replay() launches the restored graph
    executable on the current stream, as CUDAGraph.replay() does."""

    def __init__(self, exec_handle: int, backend: Any) -> None:
        self.exec_handle, self.backend = exec_handle, backend

    def replay(self) -> None:
        import torch

        self.backend.graph_launch(self.exec_handle, torch.cuda.current_stream().cuda_stream)

    def reset(self) -> None:  # the Restorer owns the executable
        pass


class _DeviceBytes:
    """A span of device memory as __cuda_array_interface__ (bytes), for torch.as_tensor."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (addr, False),
            "version": 3,
        }


def build_output(spec: dict[str, Any], base: Any, device: Any) -> Any:
    """The output a restored graph writes, as tensors aliasing the restored memory."""
    import torch

    t = spec["t"]
    if t == "none":
        return None
    if t in ("list", "tuple"):
        items = [build_output(s, base, device) for s in spec["items"]]
        return items if t == "list" else tuple(items)
    if t == "intermediate":
        from vllm.sequence import IntermediateTensors

        return IntermediateTensors(
            {k: build_output(v, base, device) for k, v in spec["items"].items()}
        )
    dtype = getattr(torch, spec["dtype"])
    if not spec["bytes"]:
        return torch.empty(spec["shape"], dtype=dtype, device=device)
    addr = int(base[spec["alloc"]]) + int(spec["offset"])
    raw = torch.as_tensor(_DeviceBytes(addr, spec["bytes"]), device=device)
    return raw.view(dtype).as_strided(spec["shape"], spec["stride"])

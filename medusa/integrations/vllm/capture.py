"""What a recorded vLLM start-up captured, told in terms the artifact can key and relocate.

The recorder sees graphs as capture events; vLLM sees them as torch.cuda.CUDAGraph objects under a
descriptor. This module joins the two: every torch capture is numbered in process order (that is
the order the trace holds them in), FULL graphs are found in the runner's CudaGraphManager, and
PIECEWISE graphs in the static graph wrappers, which a subclass numbers in creation order so that a
restored process can find "wrapper #k" again. Output tensors are written as raw addresses with
their layout; materialize turns each address into (allocation, offset) against the trace.
"""

from __future__ import annotations

from typing import Any

from medusa.errors import RefusedError
from medusa.integrations.vllm.descriptors import descriptor_key

INDEX_ATTR = "_medusa_capture_index"
_captures = 0


class CaptureOrderError(RefusedError, RuntimeError):
    """vLLM captured a graph this plugin cannot describe: the materialization stops."""


def count_captures(graph_cls: Any) -> None:
    """Numbers every capture that ends on graph_cls (torch.cuda.CUDAGraph) in process order."""
    end = graph_cls.capture_end
    if getattr(end, "_medusa_counts", False):
        return

    def capture_end(self: Any) -> Any:
        global _captures
        out = end(self)
        setattr(self, INDEX_ATTR, _captures)
        _captures += 1
        return out

    capture_end._medusa_counts = True  # type: ignore[attr-defined]
    graph_cls.capture_end = capture_end


def captures_so_far() -> int:
    return _captures


def capture_index(graph: Any) -> int:
    idx = getattr(graph, INDEX_ATTR, None)
    if idx is None:
        raise CaptureOrderError(
            f"{type(graph).__qualname__} was captured before the medusa plugin counted captures"
        )
    return int(idx)


# ---- tensors ----
def tensor_spec(value: Any) -> dict[str, Any]:
    """A graph output as a tree of tensors (raw address, dtype, shape, stride) and containers."""
    if value is None:
        return {"t": "none"}
    if isinstance(value, list | tuple):
        return {"t": type(value).__name__, "items": [tensor_spec(v) for v in value]}
    tensors = getattr(value, "tensors", None)  # vLLM's IntermediateTensors
    if isinstance(tensors, dict):
        return {
            "t": "intermediate",
            "items": {k: tensor_spec(v) for k, v in tensors.items()},
        }
    if hasattr(value, "data_ptr") and hasattr(value, "stride"):
        shape, stride = list(value.shape), list(value.stride())
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
        return {
            "t": "tensor",
            "addr": int(value.data_ptr()),
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": shape,
            "stride": stride,
            "bytes": span * value.element_size(),
        }
    raise CaptureOrderError(f"a graph output of type {type(value).__qualname__} is not supported")


def spec_tensors(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The tensor leaves of a spec, in a fixed order."""
    t = spec["t"]
    if t == "tensor":
        return [spec]
    if t == "intermediate":
        return [x for k in sorted(spec["items"]) for x in spec_tensors(spec["items"][k])]
    if t in ("list", "tuple"):
        return [x for v in spec["items"] for x in spec_tensors(v)]
    return []


# ---- the static graph wrapper, numbered ----
_wrappers: list[Any] = []


def wrappers() -> list[Any]:
    return list(_wrappers)


def make_wrapper_class(base: type) -> type:
    """A subclass of vLLM's CUDAGraphWrapper that numbers its instances in creation order; the
    restore fills their concrete_cudagraph_entries with restored graphs."""

    class MedusaCUDAGraphWrapper(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.medusa_ordinal = len(_wrappers)
            _wrappers.append(self)

    MedusaCUDAGraphWrapper.__module__ = __name__
    return MedusaCUDAGraphWrapper


def wrapper_identity(w: Any) -> dict[str, Any]:
    """What must agree between the recorded and the restored wrapper #k."""
    r = w.runnable
    return {
        "index": getattr(r, "piecewise_compile_index", None),
        "of": getattr(r, "total_piecewise_compiles", None),
        "last": bool(w.cudagraph_options.weak_ref_output),
    }


# ---- the record of one start-up ----
def collect(runner: Any, wrapper_list: list[Any]) -> dict[str, Any]:
    """Every captured graph of runner (V2 GPUModelRunner) and the wrappers, keyed by descriptor."""
    graphs: list[dict[str, Any]] = []
    mgr = runner.cudagraph_manager
    outputs: dict[str, Any] = {}
    if mgr is not None:
        for desc, g in mgr.graphs.items():
            graphs.append({"kind": "full", "key": descriptor_key(desc), "graph": capture_index(g)})
        outputs = {
            "hidden_states": tensor_spec(mgr.hidden_states),
            "aux_hidden_states": tensor_spec(list(mgr.aux_hidden_states)),
            "intermediate_tensors": tensor_spec(mgr.intermediate_tensors),
        }
    ws = []
    for w in wrapper_list:
        ws.append(wrapper_identity(w))
        for bd, entry in w.concrete_cudagraph_entries.items():
            if entry.cudagraph is None:
                continue
            graphs.append(
                {
                    "kind": "piecewise",
                    "wrapper": w.medusa_ordinal,
                    "key": descriptor_key(bd),
                    "graph": capture_index(entry.cudagraph),
                    "output": tensor_spec(entry.output),
                }
            )
    graphs.sort(key=lambda g: g["graph"])
    return {"graphs": graphs, "outputs": outputs, "wrappers": ws, "captures": captures_so_far()}


WRAPPER_QUALNAME = f"{__name__}.MedusaCUDAGraphWrapper"
VLLM_WRAPPER = "vllm.compilation.cuda_graph.CUDAGraphWrapper"


def __getattr__(name: str) -> Any:
    # vLLM resolves the static graph wrapper class by qualified name; build it on first use.
    if name == "MedusaCUDAGraphWrapper":
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        cls = make_wrapper_class(CUDAGraphWrapper)
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def install_graph_wrapper(platform: Any) -> bool:
    """Makes the platform hand out the numbered wrapper where it would hand out vLLM's own
    CUDAGraphWrapper; other platforms' wrappers are left alone. Returns whether it did."""
    cls = type(platform)
    current = cls.get_static_graph_wrapper_cls()
    if current == WRAPPER_QUALNAME:
        return True
    if current != VLLM_WRAPPER:
        return False
    cls.get_static_graph_wrapper_cls = classmethod(lambda c: WRAPPER_QUALNAME)
    return True

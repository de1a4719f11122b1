"""Where the alpha controller's utilisations come from: NVML GPM C2C counters on a real
Grace-Hopper (MIG instance metrics), else the performance model applied to the work just done."""

from __future__ import annotations

from dataclasses import dataclass

from medusa.c2c.model import C2C_BW, SliceProfile, Traffic

# nvmlGpmMetricId_t values for C2C (NVML): total TX/RX bytes per second, in MiB/s.
GPM_C2C_TOTAL_TX, GPM_C2C_TOTAL_RX = 100, 101


@dataclass
class ModelTelemetry:
    """Utilisations of one interval estimated from the traffic the steps generated."""

    slice: SliceProfile
    c2c_share: float = C2C_BW

    def utilisation(self, traffic: Traffic, seconds: float) -> tuple[float, float]:
        seconds = max(seconds, 1e-9)
        return (
            traffic.c2c_read / (self.c2c_share * seconds),
            traffic.hbm / (self.slice.hbm_bw * seconds),
        )


class GpmTelemetry:
    """C2C utilisation measured by NVML's GPM counters for a GPU (or MIG instance); HBM
    utilisation from the DRAM bandwidth metric. Needs nvidia-ml-py and a Hopper-or-later GPU."""

    def __init__(self, device_index: int = 0) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        if not pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
            raise RuntimeError("GPM metrics are not supported on this GPU")
        self.sample = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(self.handle, self.sample)

    def utilisation(self, hbm_peak: float, c2c_peak: float = C2C_BW) -> tuple[float, float]:
        nv = self.nvml
        now = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(self.handle, now)
        metrics = nv.c_nvmlGpmMetricsGet_t()
        metrics.version = nv.NVML_GPM_METRICS_GET_VERSION
        metrics.numMetrics = 3
        metrics.sample1, metrics.sample2 = self.sample, now
        ids = (GPM_C2C_TOTAL_RX, GPM_C2C_TOTAL_TX, nv.NVML_GPM_METRIC_DRAM_BW_UTIL)
        for i, metric in enumerate(ids):
            metrics.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(metrics)
        nv.nvmlGpmSampleFree(self.sample)
        self.sample = now
        rx = metrics.metrics[0].value * 2**20  # MiB/s -> bytes/s (weights flow host -> GPU)
        return rx / c2c_peak, metrics.metrics[2].value / 100.0


def telemetry_for(slice_: SliceProfile, prefer_gpm: bool = True) -> ModelTelemetry | GpmTelemetry:
    if prefer_gpm:
        try:
            return GpmTelemetry()
        except Exception:  # noqa: BLE001 - no NVML, no GPU or no GPM: use the model
            pass
    return ModelTelemetry(slice_)

"""GPU metrics from NVML (nvidia-ml-py) and the torch CUDA allocator; cleanly absent without a GPU.

:func:`gpu_collector` returns ``None`` when CUDA or NVML is unavailable, so no GPU series are exported
at all on CPU (an absent series is honest; a zero would read as an idle GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["BF16_PEAK_FLOPS", "gpu_collector", "peak_flops"]

log = logging.getLogger(__name__)

# Dense BF16 peak per GPU (FLOP/s) by device-name substring; the MFU denominator (see ANCHORS.md).
BF16_PEAK_FLOPS: dict[str, float] = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def peak_flops(device_name: str) -> float | None:
    """The BF16 peak for a device name, or None when unknown (then no MFU is reported)."""
    for key, value in BF16_PEAK_FLOPS.items():
        if key in device_name:
            return value
    return None


def gpu_collector(device: torch.device) -> Callable[[list[str], list[str]], Iterable[Any]] | None:
    """A collector of this rank's GPU, or None when there is no GPU or no NVML."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        # NVML numbers GPUs physically while CUDA_VISIBLE_DEVICES renumbers them: the UUID joins both.
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception as exc:  # NVML missing or driver mismatch: run on, without GPU series, and say so
        log.warning("NVML unavailable (%s): GPU metrics are not exported", exc)
        return None

    def collect(names: list[str], values: list[str]) -> Iterable[Any]:
        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        yield gauge("trainer_gpu_utilization_ratio", "GPU busy fraction (NVML).", util.gpu / 100.0)
        yield gauge("trainer_gpu_memory_used_bytes", "GPU memory in use (NVML).", float(mem.used))
        yield gauge("trainer_gpu_memory_total_bytes", "GPU memory in total (NVML).", float(mem.total))
        yield gauge("trainer_gpu_power_watts", "GPU power draw (NVML).",
                    pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        yield gauge("trainer_gpu_temperature_celsius", "GPU temperature (NVML).",
                    float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)))
        stats = torch.cuda.memory_stats(device)
        yield gauge("trainer_gpu_allocator_allocated_bytes", "Bytes held by tensors (torch allocator).",
                    float(stats.get("allocated_bytes.all.current", 0)))
        yield gauge("trainer_gpu_allocator_reserved_bytes", "Bytes reserved by the torch allocator.",
                    float(stats.get("reserved_bytes.all.current", 0)))
        yield gauge("trainer_gpu_allocator_peak_bytes", "Peak bytes held by tensors (torch allocator).",
                    float(stats.get("allocated_bytes.all.peak", 0)))
        for name, key, doc in (
            ("trainer_gpu_alloc_retries", "num_alloc_retries", "Allocator retries after freeing its cache."),
            ("trainer_gpu_ooms", "num_ooms", "Out-of-memory errors raised by the allocator."),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, float(stats.get(key, 0)))
            yield c

    return collect

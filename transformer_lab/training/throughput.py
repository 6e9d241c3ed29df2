"""Model FLOPs utilisation: ``tokens/s * FLOPs per token / (ranks * peak FLOP/s)``; the peak from
NVIDIA's datasheet (dense) for a GPU in ``DATASHEET_PEAKS``, else a measured matmul
(docs/scale.md)."""

from __future__ import annotations

import functools
import math
import time

import torch

# (name fragment, bf16 dense, fp32) FLOP/s per GPU, NVIDIA datasheets; the first fragment in
# the device's name wins (so "H100 NVL" before "H100", "A100" before "A10", "L40S" before "L4").
DATASHEET_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 67e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L4", 121e12, 30.3e12),
    ("A10", 125e12, 31.2e12),
    ("RTX 4090", 165e12, 82.6e12),
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def measured_matmul_peak(device: torch.device, dtype: torch.dtype, n: int,
                         repeats: int = 5) -> float:
    """Best FLOP/s of an n x n matmul (2 n^3 FLOPs) over ``repeats`` tries, after a warm-up."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


@functools.cache
def peak_flops(device: torch.device, precision: str, threads: int) -> tuple[float, str]:
    """(the peak FLOP/s of ``device`` in ``precision``, its source); ``threads`` keys the cache (a
    measured CPU peak depends on them)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peaks = [bf16 if precision == "bf16" else fp32
                 for fragment, bf16, fp32 in DATASHEET_PEAKS if fragment in name]
        if peaks:
            return peaks[0], f"{name} {precision} dense peak (NVIDIA datasheet)"
        n = 8192
        return (measured_matmul_peak(device, DTYPES[precision], n),
                f"measured: {n}x{n} {precision} matmul on {name}")
    n = 512  # as fast per FLOP as 1024 on one core, an eighth of the time
    return (measured_matmul_peak(device, DTYPES[precision], n),
            f"measured: {n}x{n} {precision} matmul on the CPU at {threads} torch threads")


def model_flops_utilisation(tokens_per_s: float, flops_per_token: int | None,
                            peak: float, ranks: int = 1) -> float:
    """``tokens_per_s * flops_per_token / (ranks * peak)``; NaN where a term is unknown."""
    if flops_per_token is None or not math.isfinite(tokens_per_s) or peak <= 0:
        return math.nan
    return tokens_per_s * flops_per_token / (ranks * peak)

"""Fixed sinusoidal positional encoding (Vaswani et al., 2017)."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(max_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The sinusoidal table of Vaswani et al. 2017 (arXiv:1706.03762):
    ``PE[pos, 2i] = sin(pos w_i)``, ``PE[pos, 2i+1] = cos(pos w_i)``,
    ``w_i = base^(-2i / d_model)``. Returns ``(max_len, d_model)`` float32."""
    if max_len < 0:
        raise ValueError(f"max_len={max_len} is not valid; it must be >= 0")
    if d_model < 1:
        raise ValueError(f"d_model={d_model} is not valid; it must be >= 1")
    if base <= 0:
        raise ValueError(f"base={base} is not valid; it must be > 0")
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
    freqs = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(base) / d_model)
    )  # (ceil(d/2),)
    angles = position * freqs[None, :]  # (L, ceil(d/2))
    table = torch.zeros(max_len, d_model)  # (L, d)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal PE (``kind = "additive"``; Vaswani et al. 2017, arXiv:1706.03762); the table
    grows on demand.

    Shapes: positions ``(T,)`` long -> ``(T, d_model)``."""

    kind = "additive"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    property_checks: tuple[str, ...] = ("sinusoidal_shift", "permutation")
    expected_reversal: dict[str, str] = {"encoder": "solves", "decoder": "solves"}

    @classmethod
    def count_parameters(cls) -> int:
        """None (the table is a buffer)."""
        return 0

    def __init__(self, d_model: int, max_len: int = 512, base: float = 10000.0) -> None:
        super().__init__()
        if max_len < 1:
            raise ValueError(f"max_len={max_len} is not valid; it must be >= 1")
        self.d_model = d_model
        self.base = float(base)
        self.register_buffer("table", sinusoidal_table(max_len, d_model, base), persistent=False)

    def _extend(self, length: int) -> None:
        table = sinusoidal_table(length, self.d_model, self.base)  # (length, d)
        self.table = table.to(device=self.table.device, dtype=self.table.dtype)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.numel() > 0:
            needed = int(positions.max()) + 1
            if needed > self.table.shape[0]:
                self._extend(needed)
        return self.table[positions]  # (T, d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base}"

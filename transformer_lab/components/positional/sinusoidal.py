"""Fixed sinusoidal positional encoding (Vaswani et al., 2017)."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoid_frequencies(d_model: int, base: float = 10000.0,
                         device: torch.device | None = None) -> torch.Tensor:
    """``w_i = base^(-2i / d_model)`` for ``i < ceil(d_model / 2)``: ``(ceil(d/2),)`` float32."""
    if d_model < 1:
        raise ValueError(f"d_model={d_model} is not valid; it must be >= 1")
    if base <= 0:
        raise ValueError(f"base={base} is not valid; it must be > 0")
    exponents = torch.arange(0, d_model, 2, dtype=torch.float32, device=device)  # (ceil(d/2),)
    return torch.exp(exponents * (-math.log(base) / d_model))


def sinusoid(positions: torch.Tensor, frequencies: torch.Tensor, d_model: int) -> torch.Tensor:
    """``PE[pos, 2i] = sin(pos w_i)``, ``PE[pos, 2i+1] = cos(pos w_i)`` of ``positions (T,)``,
    computed in float32 from the positions themselves: ``(T, d_model)`` float32."""
    angles = positions.to(torch.float32)[:, None] * frequencies[None, :]  # (T, ceil(d/2))
    pairs = torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1)  # (T, ceil(d/2), 2)
    return pairs.flatten(-2)[:, :d_model]  # (T, d_model): odd d drops the last cosine


def sinusoidal_table(max_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The sinusoidal table of Vaswani et al. 2017 (arXiv:1706.03762) for positions
    ``0 .. max_len - 1`` (:func:`sinusoid`). Returns ``(max_len, d_model)`` float32."""
    if max_len < 0:
        raise ValueError(f"max_len={max_len} is not valid; it must be >= 0")
    return sinusoid(torch.arange(max_len), sinusoid_frequencies(d_model, base), d_model)


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal PE (``kind = "additive"``; Vaswani et al. 2017, arXiv:1706.03762),
    computed from the positions at each call: no table, so no maximum length and no read of
    the position values (no device sync, one torch.compile graph).
    Shapes: positions ``(T,)`` -> ``(T, d_model)``."""

    kind = "additive"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    property_checks: tuple[str, ...] = ("sinusoidal_shift", "permutation")
    expected_reversal: dict[str, str] = {"encoder": "solves", "decoder": "solves"}

    @classmethod
    def count_parameters(cls) -> int:
        """None (the frequencies are a buffer)."""
        return 0

    def __init__(self, d_model: int, max_len: int = 512, base: float = 10000.0) -> None:
        super().__init__()
        if max_len < 1:
            raise ValueError(f"max_len={max_len} is not valid; it must be >= 1")
        self.d_model = d_model
        self.base = float(base)
        # its device and dtype are the output's (model.to(...) moves and casts it)
        self.register_buffer("frequencies", sinusoid_frequencies(d_model, self.base),
                             persistent=False)  # (ceil(d/2),)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        frequencies = self.frequencies
        if frequencies.dtype != torch.float32:  # a cast module (e.g. bfloat16): float32 angles
            frequencies = sinusoid_frequencies(self.d_model, self.base, frequencies.device)
        table = sinusoid(positions, frequencies, self.d_model)  # (T, d_model) float32
        return table.to(self.frequencies.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base}"

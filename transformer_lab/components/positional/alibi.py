"""ALiBi: attention with linear biases (Press et al., 2021)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import query_offset


def alibi_slopes(n_heads: int, slope_power: float = 8.0) -> torch.Tensor:
    """Per-head ALiBi slopes ``(n_heads,)`` as ``get_slopes`` of Press et al. 2021
    (arXiv:2108.12409): ``start^1 .. start^n``, ``start = 2^(-slope_power / n)``; for ``n`` not a
    power of two, those of the power ``p`` below, then ``slopes(2p)[0::2][: n - p]``."""
    if n_heads < 1:
        raise ValueError(f"n_heads={n_heads} is not valid for ALiBi; it must be >= 1")

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-slope_power / n)
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** math.floor(math.log2(n_heads))  # the power of two at or below n_heads
    slopes = power_of_two_slopes(p) + power_of_two_slopes(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiPositionalBias(nn.Module):
    """ALiBi (``kind = "bias"``; Press et al. 2021, arXiv:2108.12409): ``-m_h * distance`` added to
    the logits. Decoder: ``-m_h max(i - j, 0)``; encoder ``symmetric="abs"``: ``-m_h |i - j|``;
    ``"split"``: half the heads look left, half right (``-inf`` the other way).
    Shapes: ``(q_len, k_len)`` -> ``(n_heads, q_len, k_len)`` float32, the last ``q_len``
    positions."""

    kind = "bias"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    property_checks: tuple[str, ...] = ("permutation",)

    @classmethod
    def count_parameters(cls) -> int:
        """None (the slopes are fixed)."""
        return 0

    @classmethod
    def variant_label(cls, name: str, arch: str, symmetric: str = "abs") -> str:
        """An encoder's bias form is part of the name (``alibi(abs)``, ``alibi(split)``)."""
        return f"{name}({symmetric})" if arch == "encoder" else name

    @classmethod
    def expected_reversal(cls, arch: str, symmetric: str = "abs") -> str | None:
        """What it does on the 4-token reversal task with :meth:`reversal_settings`."""
        if arch == "decoder":
            return "solves, slower: 400-600 steps with a cosine schedule"
        return {"split": "solves, slowly: 1700-3000 steps with a cosine schedule over 5000",
                "abs": "slow: -m|i-j| cannot tell left from right (one layer: NoPE level); two "
                       "layers learn it from the edges (seed 0: 1450 steps, cosine over 3000)",
                }.get(symmetric)

    @classmethod
    def reversal_settings(cls, arch: str, symmetric: str = "abs") -> dict[str, object]:
        """A decaying lr for step 3 (the exact match oscillates below 0.99 at a constant lr); 5000
        steps in an encoder (experiments/reverse_expectations.md)."""
        cosine = {"train.schedule": "warmup_cosine", "train.warmup": 20}
        return {**cosine, "routine.max_steps": 5000} if arch == "encoder" else cosine

    def __init__(self, n_heads: int, causal: bool = True, symmetric: str = "abs",
                 slope_power: float = 8.0) -> None:
        super().__init__()
        if symmetric not in ("abs", "split"):
            raise ValueError(f"symmetric={symmetric!r} is not valid; choose 'abs' or 'split'")
        if not causal and symmetric == "split" and n_heads < 2:
            raise ValueError(
                f"n_heads={n_heads} is not valid for symmetric='split' (one left-looking and "
                f"one right-looking group); use n_heads >= 2 or symmetric='abs'"
            )
        self.n_heads, self.causal, self.symmetric = n_heads, causal, symmetric
        if not causal and symmetric == "split":
            n_left = n_heads // 2
            slopes = torch.cat([alibi_slopes(n_left, slope_power),
                                alibi_slopes(n_heads - n_left, slope_power)])
        else:
            slopes = alibi_slopes(n_heads, slope_power)
        self.register_buffer("slopes", slopes, persistent=False)  # (H,)
        self.register_buffer("cached", torch.empty(n_heads, 0, 0), persistent=False)

    def _build(self, size: int) -> torch.Tensor:
        positions = torch.arange(size, device=self.slopes.device)
        i, j = positions[:, None], positions[None, :]  # (L, 1) queries, (1, L) keys
        distance = (i - j).clamp(min=0) if self.causal else (i - j).abs()  # (L, L)
        bias = -self.slopes.float()[:, None, None] * distance.float()  # (H, L, L)
        if not self.causal and self.symmetric == "split":
            n_left = self.n_heads // 2
            bias[:n_left].masked_fill_(j > i, float("-inf"))  # left-looking heads
            bias[n_left:].masked_fill_(j < i, float("-inf"))  # right-looking heads
        return bias

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        first_query = query_offset(q_len, k_len)
        if k_len > self.cached.shape[-1] or self.cached.dtype != torch.float32:
            self.cached = self._build(max(k_len, self.cached.shape[-1]))
        return self.cached[:, first_query:k_len, :k_len]  # (H, Tq, Tk)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, causal={self.causal}, symmetric={self.symmetric!r}"

"""Broken norm layers (see the catalogue in :mod:`transformer_lab.mutants`)."""

from __future__ import annotations

import torch
from torch import nn


class SequenceAxisNorm(nn.Module):
    """Normalises each feature over the *sequence* axis (dim 1) instead of the features: every
    position's output depends on every other position's, a future leak in a decoder.
    (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=1, keepdim=True)  # (B, 1, D): over positions
        var = x.var(dim=1, keepdim=True, unbiased=False)  # (B, 1, D)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight  # (B, T, D)


class RMSTimesNorm(nn.Module):
    """RMSNorm that multiplies by the RMS instead of dividing by it (llm-foundry): the output
    grows like the square of the input's scale. (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (B, T, 1)
        return x * rms * self.weight  # (B, T, D)


class SquaredVarianceLayerNorm(nn.LayerNorm):
    """LayerNorm dividing by ``sqrt(var^2 + eps)`` (the variance squared) instead of
    ``sqrt(var + eps)``: the output scales like 1 / input below unit scale.
    (B, T, D) -> (B, T, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)  # (B, T, 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # (B, T, 1)
        return (x - mean) / torch.sqrt(var.pow(2) + self.eps) * self.weight + self.bias

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

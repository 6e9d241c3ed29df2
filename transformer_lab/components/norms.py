"""Norm layers for ``norm_layer=``: LayerNorm (Ba et al. 2016, arXiv:1607.06450), RMSNorm (Zhang &
Sennrich 2019, arXiv:1910.07467), BatchNorm (Ioffe & Szegedy 2015, arXiv:1502.03167); all
(B, T, d_model) -> (B, T, d_model)."""

from __future__ import annotations

import torch
from torch import nn


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last axis: (B, T, D) -> (B, T, D)."""

    @classmethod
    def count_parameters(cls, d_model: int) -> int:
        """Gain and bias, ``2 D``."""
        return 2 * d_model

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__(d_model, eps=eps)


class RMSNorm(nn.Module):
    """Root-mean-square norm without centring or bias: (B, T, D) -> (B, T, D)."""

    @classmethod
    def count_parameters(cls, d_model: int) -> int:
        """The gain, ``D``."""
        return d_model

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (B, T, 1)
        return (x.float() * rms).type_as(x) * self.weight


class SequenceBatchNorm(nn.BatchNorm1d):
    """BatchNorm over batch and positions for each feature: batch statistics in training, running
    averages in eval (in a decoder, a small leak across the causal mask)."""

    @classmethod
    def count_parameters(cls, d_model: int) -> int:
        """Gain and bias, ``2 D`` (the running statistics are buffers)."""
        return 2 * d_model

    @classmethod
    def reversal_settings(cls) -> dict[str, object]:
        """A decaying lr for step 3: at a constant lr the exact match jitters around 0.98."""
        return {"train.schedule": "warmup_cosine", "train.warmup": 20, "routine.max_steps": 1200}

    def __init__(self, d_model: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__(d_model, eps=eps, momentum=momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        y = super().forward(x.reshape(batch * seq, dim))  # (B*T, D)
        return y.reshape(batch, seq, dim)

"""Example components of your own, for ``tlab validate`` (see docs/custom_components.md).

Correct ones, which pass the validation routine:

    MySinusoidalPE   additive PE (Vaswani et al. 2017): PE[p, 2i] = sin(p w_i),
                     PE[p, 2i+1] = cos(p w_i), w_i = base^(-2i/d)      positions (T,) -> (T, D)
    MyRoPE           rotary PE (Su et al. 2021) with the same pairing for q and k
                                                        q, k (B, H, T, Dh), positions (T,)
    MyFFN            two-matrix FFN with SiLU: down(silu(up(x)))        (B, T, D) -> (B, T, D)
    MyRMSNorm        RMSNorm (Zhang & Sennrich 2019): x / rms(x) * g    (B, T, D) -> (B, T, D)
    MyPreNormBlock   pre-LN block (Xiong et al. 2020): x + attn(N1(x)), then x + ffn(N2(x))
                                                        x (B, T, D), AttentionInputs

Deliberately broken ones, each caught by the step that should catch it:

    PositionBlindPE  gives every position the encoding of the last one (uses the sequence
                     length instead of the positions): fails step 3, reversal no better than
                     the NoPE control
    MismatchedRoPE   rotates q with the half pairing and k with the interleaved one: fails
                     step 3's rotary_relative check (q.k no longer depends on n - m only)
    WrongShapeFFN    forgets the down projection, (B, T, D) -> (B, T, d_ff): refused before
                     the run starts (exit code 2)

Each has a config in ``examples/configs/<group>/``; from the repository root::

    tlab validate --config-dir examples/configs pe=my_sinusoidal
    tlab validate --config-dir examples/configs pe=position_blind
    tlab validate --config-dir examples/configs block=my_block
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components.attention import AttentionInputs
from transformer_lab.components.positional import apply_rotary


def _frequencies(dim: int, base: float) -> torch.Tensor:
    """w_i = base^(-2i/dim) for i = 0 .. dim/2 - 1: (dim/2,)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)


def _sin_cos_table(angles: torch.Tensor) -> torch.Tensor:
    """angles (T, D/2) -> (T, D) with sin in even and cos in odd dimensions."""
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, D/2, 2)
    return table.flatten(-2)  # (T, D)


class MySinusoidalPE(nn.Module):
    """Additive sinusoidal PE computed from the positions it is given."""

    kind = "additive"

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("freqs", _frequencies(d_model, base), persistent=False)  # (D/2,)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None] * self.freqs[None, :]  # (T, D/2)
        return _sin_cos_table(angles)  # (T, D)


class PositionBlindPE(MySinusoidalPE):
    """BROKEN on purpose: every position gets the encoding of position T-1."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        last = torch.full_like(positions, len(positions) - 1)  # bug: should be `positions`
        angles = last.float()[:, None] * self.freqs[None, :]  # (T, D/2), all rows equal
        return _sin_cos_table(angles)  # (T, D)


class MyRoPE(nn.Module):
    """Rotary PE: q and k rotated by angle p * w_i per pair, the same pairing for both."""

    kind = "rotary"

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.base = base

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (apply_rotary(q, positions, base=self.base, style="half"),  # (B, H, T, Dh)
                apply_rotary(k, positions, base=self.base, style="half"))


class MismatchedRoPE(MyRoPE):
    """BROKEN on purpose: q uses the half pairing (GPT-NeoX), k the interleaved one (Meta)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (apply_rotary(q, positions, base=self.base, style="half"),
                apply_rotary(k, positions, base=self.base, style="interleaved"))  # bug


class MyFFN(nn.Module):
    """down(silu(up(x))), weights N(0, 0.02), zero biases."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)
        for layer in (self.up, self.down):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))  # (B, T, D) -> (B, T, d_ff) -> (B, T, D)


class WrongShapeFFN(MyFFN):
    """BROKEN on purpose: returns the hidden activation (B, T, d_ff)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.up(x))  # bug: no down projection


class MyRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g over the feature axis."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MyPreNormBlock(nn.Module):
    """Pre-LN block (the ``block`` contract of docs/custom_components.md): tlab builds the
    attention and the FFN and hands them in with a norm factory; the block wires them.
    ``x = x + attn(N1(x), inputs)``, ``x = x + ffn(N2(x))``; the model adds a final norm."""

    needs_final_norm = True  # the model adds a norm after the last block
    norms_per_block = 2  # its only parameters besides attention and FFN: two norm layers

    def __init__(self, d_model: int, attention: nn.Module, feedforward: nn.Module,
                 make_norm) -> None:
        super().__init__()
        self.attention = attention  # step 1 reads attention.last_weights (need_weights)
        self.feedforward = feedforward  # step 1 measures the FFN as block.feedforward
        self.norm1 = make_norm(d_model)  # the pre-flight checks norm1 (where there is one)
        self.norm2 = make_norm(d_model)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), inputs)  # (B, T, D): mask, cache, PE in inputs
        return x + self.feedforward(self.norm2(x))  # (B, T, D)

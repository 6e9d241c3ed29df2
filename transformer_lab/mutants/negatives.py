"""Correct designs tlab does not ship: the routine must pass them (``harmless`` in the
catalogue of :mod:`transformer_lab.mutants`). Each docstring cites the paper it follows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components.feedforward import FeedForward
from transformer_lab.components.positional import RotaryPositionalEncoding


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, arXiv 1910.05895): ``y = g x / max(||x||, eps)``
    with one learned scalar ``g``, initialised to ``sqrt(d_model)``. (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.tensor(math.sqrt(d_model)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True).clamp_min(self.eps)  # (B, T, 1)
        return self.scale * x / norm  # (B, T, D)


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization", arXiv 2503.10622):
    ``y = g * tanh(a x) + b`` with a learned scalar ``a`` (initialised to ``alpha``, 0.5 in the
    paper) and per-feature ``g`` (ones) and ``b`` (zeros). (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias  # (B, T, D)


class SquaredReLUFFN(FeedForward):
    """Two-matrix FFN with the squared ReLU of Primer (So et al. 2021, arXiv 2109.08668):
    ``down(relu(up(x))^2)``. (B, T, D) -> (B, T, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.up_proj(x)).square()  # (B, T, d_ff)
        return self.down_proj(self.dropout(h))  # (B, T, D)


class MishFFN(FeedForward):
    """Two-matrix FFN with Mish (Misra 2019, arXiv 1908.08681): ``x tanh(softplus(x))``.
    (B, T, D) -> (B, T, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.mish(self.up_proj(x))  # (B, T, d_ff)
        return self.down_proj(self.dropout(h))  # (B, T, D)


class KerpleLogBias(nn.Module):
    """KERPLE, logarithmic variant (Chi et al. 2022, arXiv 2205.09921), causal:
    ``bias[h, i, j] = -r1_h log(1 + r2_h (i - j))`` for keys ``j <= i`` (0 above the diagonal,
    where the model's causal mask applies), with learned ``r1, r2 > 0`` per head (kept positive
    as exponentials of their logarithms; the paper clamps them). The queries are the last
    ``q_len`` of ``k_len`` positions (the bias protocol, which a KV cache needs). (q_len, k_len)
    -> (H, q_len, k_len)."""

    kind = "bias"

    def __init__(self, n_heads: int, r1: float = 1.0, r2: float = 1.0) -> None:
        super().__init__()
        self.log_r1 = nn.Parameter(torch.full((n_heads,), math.log(r1)))
        self.log_r2 = nn.Parameter(torch.full((n_heads,), math.log(r2)))

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        device = self.log_r1.device
        i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (Tq, 1): the last Tq
        j = torch.arange(k_len, device=device)[None, :]  # (1, Tk)
        distance = (i - j).clamp(min=0).float()  # (Tq, Tk)
        r1, r2 = self.log_r1.exp()[:, None, None], self.log_r2.exp()[:, None, None]  # (H, 1, 1)
        return -r1 * torch.log1p(r2 * distance)  # (H, Tq, Tk)


class XPosRoPE(RotaryPositionalEncoding):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554): RoPE
    with q's pair i scaled by ``zeta_i^(m / scale_base)`` and k's by ``zeta_i^(-n / scale_base)``,
    ``zeta_i = (2 i / d + 0.4) / 1.4``, so that ``q_m . k_n`` gains ``zeta^((m - n) / scale_base)``:
    it still depends on ``n - m`` only and decays with distance in a decoder (torchscale's
    ``XPOS``; positions are not centred here, which leaves every product unchanged).
    q (B, H, T, Dh), k (B, H_kv, T, Dh), positions (T,) -> q, k of the same shapes."""

    def __init__(self, head_dim: int, base: float = 10000.0, scale_base: float = 512.0) -> None:
        super().__init__(head_dim, base=base)
        self.scale_base = scale_base
        zeta = (torch.arange(0, head_dim, 2) / head_dim + 0.4) / 1.4  # (Dh/2,)
        self.register_buffer("zeta", zeta, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super().forward(q, k, positions)  # (B, H, T, Dh), (B, H_kv, T, Dh)
        power = positions.float()[:, None] / self.scale_base  # (T, 1)
        scale = self.zeta[None, :] ** power  # (T, Dh/2)
        scale = torch.cat([scale, scale], dim=-1)  # (T, Dh): the half pairing's layout
        return (q * scale).to(q.dtype), (k / scale).to(k.dtype)

"""Correct published designs tlab does not ship (``harmless`` in the catalogue): the routine
must pass them. Each docstring cites its paper; the blocks follow docs/custom_components.md."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components.attention import AttentionInputs, MultiHeadAttention, softmax
from transformer_lab.components.block import NormFactory, PostNormBlock, PreNormBlock
from transformer_lab.components.feedforward import FeedForward, GatedFeedForward
from transformer_lab.components.positional import RotaryPositionalEncoding
from transformer_lab.components.positional.rotary import rotary_cos_sin, rotate_with_cos_sin

# scores (B, H, T_q, T_k), -inf where masked -> attention weights of the same shape
Weighing = Callable[[torch.Tensor], torch.Tensor]


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
        return self.down_proj(self.dropout(F.relu(self.up_proj(x)).square()))  # (B, T, D)


class MishFFN(FeedForward):
    """Two-matrix FFN with Mish (Misra 2019, arXiv 1908.08681): ``x tanh(softplus(x))``.
    (B, T, D) -> (B, T, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.dropout(F.mish(self.up_proj(x))))  # (B, T, D)


class KerpleLogBias(nn.Module):
    """KERPLE, logarithmic variant (Chi et al. 2022, arXiv 2205.09921), causal:
    ``bias[h, i, j] = -r1_h log(1 + r2_h (i - j))`` for keys ``j <= i`` (0 above), learned
    ``r1, r2 > 0`` per head (as exponentials). Queries are the last ``q_len`` of ``k_len``
    positions. (q_len, k_len) -> (H, q_len, k_len)."""

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
    """xPos (Sun et al. 2022, arXiv 2212.10554; torchscale's ``XPOS``, positions not centred):
    RoPE with q's pair i scaled by ``zeta_i^(m / scale_base)``, k's by ``zeta_i^(-n /
    scale_base)``, ``zeta_i = (2 i / d + 0.4) / 1.4``: ``q_m . k_n`` still depends on ``n - m``
    only. q (B, H, T, Dh), k (B, H_kv, T, Dh), positions (T,) -> q, k of the same shapes."""

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


class PRoPE(nn.Module):
    """p-RoPE (Barbero et al. 2024, arXiv 2410.06205): RoPE whose lowest ``1 - p`` of the
    frequencies are zero (pairs without position). Half pairing.
    q (B, H, T, Dh), k (B, H_kv, T, Dh), positions (T,) -> q, k of the same shapes."""

    kind = "rotary"

    def __init__(self, head_dim: int, p: float = 0.75, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2).float() / head_dim)  # (Dh/2,)
        kept = max(1, round(p * len(inv_freq)))
        inv_freq[kept:] = 0.0  # the lowest frequencies: no rotation
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rotary_cos_sin(positions, self.inv_freq.to(positions.device))  # (T, Dh/2)
        return rotate_with_cos_sin(q, cos, sin), rotate_with_cos_sin(k, cos, sin)


class ZeroDownGeGLU(GatedFeedForward):
    """GeGLU (Shazeer 2020, arXiv 2002.05202) whose down projection starts at zero, as Fixup
    (Zhang et al. 2019, arXiv 1901.09321) inits a branch's last layer. (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, d_ff: int, **kwargs: object) -> None:
        super().__init__(d_model, d_ff, activation="gelu", **kwargs)
        nn.init.zeros_(self.down_proj.weight)


class ReZeroBlock(nn.Module):
    """ReZero (Bachlechner et al. 2020, arXiv 2003.04887): no norm layer, ``x = x + alpha *
    attn(x)``, ``x = x + alpha * ffn(x)`` with one learned ``alpha`` started at 0. It declares
    no ``norms_per_block`` (it holds a gate, not norms). (B, T, D) -> (B, T, D)."""

    needs_final_norm = False

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory | None = None) -> None:
        super().__init__()
        self.attention, self.feedforward = attention, feedforward
        self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = x + self.alpha * self.attention(x, inputs)
        return x + self.alpha * self.feedforward(x)


class ZeroInitOutputBlock(PreNormBlock):
    """Pre-LN block whose attention output projection and FFN down projection start at zero
    (Fixup, arXiv 1901.09321; T-Fixup; GPT-NeoX-style inits). (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, **kwargs: object) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, **kwargs)
        nn.init.zeros_(self.attention.out_proj.weight)
        last = [m for m in self.feedforward.modules() if isinstance(m, nn.Linear)][-1]
        nn.init.zeros_(last.weight)


class ZeroGateAttentionBlock(PreNormBlock):
    """Pre-LN block whose attention branch is gated by ``tanh(g)``, ``g`` started at 0, as
    LLaMA-Adapter's zero-init attention (Zhang et al. 2023, arXiv 2303.16199).
    (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, **kwargs: object) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, **kwargs)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = x + torch.tanh(self.gate) * self.attention(self.norm1(x), inputs)
        return x + self.feedforward(self.norm2(x))


class WrittenOutAttention(nn.Module):
    """tlab's ``attention`` (projections, ``last_weights``) written out with ``weigh`` in place
    of the softmax, honouring every field of the inputs (rotary PE, mask or ``is_causal``, KV
    cache, ``need_weights``); ``qk_norm``: a LayerNorm on each head's q and k before the PE
    (Dehghani et al. 2023, ViT-22B, arXiv 2302.05442; OLMo 2: bounded logits)."""

    def __init__(self, attention: MultiHeadAttention, weigh: Weighing = softmax,
                 qk_norm: bool = False) -> None:
        super().__init__()
        self.inner, self.weigh = attention, weigh
        self.q_norm = nn.LayerNorm(attention.head_dim) if qk_norm else None
        self.k_norm = nn.LayerNorm(attention.head_dim) if qk_norm else None

    @property
    def last_weights(self) -> torch.Tensor | None:
        return self.inner.last_weights

    @last_weights.setter
    def last_weights(self, value: torch.Tensor | None) -> None:
        self.inner.last_weights = value

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        q, k, v = self.inner.split_heads(x)  # (B, H, T, Dh), (B, H_kv, T, Dh) x 2
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = self.inner.positioned(q, k, v, inputs)  # (B, H, T, Dh), (B, H, T_k, Dh) x 2
        out = self.inner.written_out(q, k, v, inputs, self.weigh)  # (B, H, T, Dh)
        return self.inner.out_proj(out.transpose(1, 2).flatten(2))  # (B, T, H Dh) -> (B, T, D)


def sigmoid_weights(scores: torch.Tensor, bias: float) -> torch.Tensor:
    """Sigmoid attention (Ramapuram et al. 2024, arXiv 2409.04431): each key weighted by
    ``sigmoid(q . k / sqrt(d) + bias)``, ``bias = -log(max_len)``; they do not sum to one."""
    return torch.sigmoid(scores + bias)


def softmax_plus_one(scores: torch.Tensor) -> torch.Tensor:
    """Softmax plus one, "quiet attention" (Miller 2023; Bondarenko et al. 2023, arXiv
    2306.12929): ``exp(s_j) / (1 + sum_k exp(s_k))`` over the last axis (an extra logit 0 takes
    the rest of the weight: a head can attend to nothing); -inf scores get 0. (..., T_k)."""
    padded = F.pad(scores, (0, 1))  # (..., T_k + 1): the extra logit 0
    return padded.softmax(dim=-1)[..., :-1]


class SigmoidAttentionBlock(PreNormBlock):
    """Pre-LN block with sigmoid attention (:func:`sigmoid_weights`) in place of the softmax."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, max_len: int = 64, **kwargs: object) -> None:
        sigmoid = functools.partial(sigmoid_weights, bias=-math.log(max_len))
        super().__init__(d_model, WrittenOutAttention(attention, sigmoid), feedforward,
                         make_norm, **kwargs)


class QuietAttentionBlock(PreNormBlock):
    """Pre-LN block with softmax plus one (:func:`softmax_plus_one`) in place of the softmax."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, **kwargs: object) -> None:
        super().__init__(d_model, WrittenOutAttention(attention, softmax_plus_one), feedforward,
                         make_norm, **kwargs)


class QKNormBlock(PreNormBlock):
    """Pre-LN block with QK-norm attention (``WrittenOutAttention(qk_norm=True)``: adds
    parameters, inherits ``norms_per_block``)."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, **kwargs: object) -> None:
        super().__init__(d_model, WrittenOutAttention(attention, qk_norm=True), feedforward,
                         make_norm, **kwargs)


class HeadScale(nn.Module):
    """Multiplies each head's slice of the attention output by a learned scale (ones at
    initialisation) before the output projection ``linear``. (B, T, H Dh) -> (B, T, D)."""

    def __init__(self, linear: nn.Linear, n_heads: int) -> None:
        super().__init__()
        self.linear = linear
        self.n_heads = n_heads
        self.scale = nn.Parameter(torch.ones(n_heads))

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        shape = heads.shape
        scaled = heads.unflatten(-1, (self.n_heads, -1)) * self.scale[:, None]  # (B, T, H, Dh)
        return self.linear(scaled.reshape(shape))


class NormFormerBlock(PreNormBlock):
    """NormFormer (Shleifer et al. 2021, arXiv 2110.09456): pre-LN plus a norm after attention
    and after the FFN, and per-head scales of the attention output (adds parameters, inherits
    ``norms_per_block``). (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, **kwargs: object) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, **kwargs)
        self.attention.out_proj = HeadScale(self.attention.out_proj, self.attention.n_heads)
        self.post_attention_norm = make_norm(d_model)
        self.post_ffn_norm = make_norm(d_model)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = x + self.post_attention_norm(self.attention(self.norm1(x), inputs))
        return x + self.post_ffn_norm(self.feedforward(self.norm2(x)))


class SharedNormParallelBlock(nn.Module):
    """GPT-J's parallel block (Wang & Komatsuzaki 2021): one norm read by both sublayers,
    ``x = x + attn(N(x)) + ffn(N(x))``, and a final norm. (B, T, D) -> (B, T, D)."""

    needs_final_norm = True
    norms_per_block = 1

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory) -> None:
        super().__init__()
        self.attention, self.feedforward = attention, feedforward
        self.norm1 = make_norm(d_model)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        normed = self.norm1(x)  # (B, T, D)
        return x + self.attention(normed, inputs) + self.feedforward(normed)


class AdminBlock(PostNormBlock):
    """Admin (Liu et al. 2020, arXiv 2004.08249): post-LN ``x = N(omega * x + f(x))`` with a
    learned per-feature ``omega`` started at ``omega_init`` (the paper profiles it).
    (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, omega_init: float = 2.0, **kwargs: object) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, **kwargs)
        self.omega1 = nn.Parameter(torch.full((d_model,), float(omega_init)))
        self.omega2 = nn.Parameter(torch.full((d_model,), float(omega_init)))

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = self.norm1(self.omega1 * x + self.attention(x, inputs))
        return self.norm2(self.omega2 * x + self.feedforward(x))

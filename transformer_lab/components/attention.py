"""Multi-head self-attention on ``torch.nn.functional.scaled_dot_product_attention``.

Vaswani et al. 2017 (arXiv 1706.03762), sec. 3.2:
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_head) + M) V
where M is an additive mask: ALiBi / T5 biases and the causal -inf mask, prepared once per forward
by the model. Rotary encodings are applied to Q and K before the product (Su et al. 2021).

Q, K and V come from one fused projection (fewer kernel launches); the output projection follows.
Inside ``written_out_attention()`` (used under ``torch.func.vmap``) the product is computed as
two matmuls and an fp32 softmax instead of SDPA: the same numbers (tested).
Parameters: 4 * d_model^2 (+ 4 * d_model with bias).

Shapes: x (B, T, D) -> q, k, v (B, H, T, Dh) -> out (B, T, D), with D = H * Dh.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AttentionInputs:
    """What every layer's attention needs besides x; built once per forward by the model."""

    positions: torch.Tensor  # (T,) integer positions
    rotary: nn.Module | None = None  # a PE of kind "rotary": (q, k, positions) -> (q, k)
    mask: torch.Tensor | None = None  # (H or 1, T, T) additive float mask, or None
    is_causal: bool = False  # let SDPA apply the causal mask itself (only when mask is None)
    need_weights: bool = False  # also compute and keep the attention probabilities


_WRITTEN_OUT: ContextVar[bool] = ContextVar("tlab_written_out_attention", default=False)


@contextmanager
def written_out_attention() -> Iterator[None]:
    """Within this block (this thread), attention is computed as two matmuls and an fp32
    softmax instead of SDPA's fused kernels. ``torch.func.vmap`` (``multiseed``) needs it: the
    fused kernels have no batching rule (vmap loops over the batch; on CUDA the memory-efficient
    kernel's backward then fails), and under vmap autocast's fp32 softmax is skipped."""
    token = _WRITTEN_OUT.set(True)
    try:
        yield
    finally:
        _WRITTEN_OUT.reset(token)


class MultiHeadAttention(nn.Module):
    """Self-attention with a fused QKV projection; keeps ``last_weights`` when asked for them."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        bias: bool = True,
        dropout: float = 0.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        for layer in (self.qkv_proj, self.out_proj):
            nn.init.normal_(layer.weight, mean=0.0, std=init_std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        self.last_weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        batch, seq, d_model = x.shape
        qkv = self.qkv_proj(x).view(batch, seq, 3, self.n_heads, self.head_dim)  # (B, T, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, Dh)
        if inputs.rotary is not None:
            q, k = inputs.rotary(q, k, inputs.positions)
        dropout_p = self.dropout if self.training else 0.0
        if inputs.need_weights:
            out, self.last_weights = self._attention_with_weights(q, k, v, inputs, dropout_p)
        elif _WRITTEN_OUT.get():
            out, _ = self._attention_with_weights(q, k, v, inputs, dropout_p)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=inputs.mask, dropout_p=dropout_p, is_causal=inputs.is_causal
            )  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(batch, seq, d_model)  # (B, T, D)
        return self.out_proj(out)

    @staticmethod
    def _attention_with_weights(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        inputs: AttentionInputs,
        dropout_p: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same computation written out, returning probabilities (B, H, T, T) too."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        if inputs.mask is not None:
            scores = scores + inputs.mask
        elif inputs.is_causal:
            seq = q.shape[-2]
            future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = scores.float().softmax(dim=-1).to(v.dtype)  # fp32 softmax, as autocast does
        out = F.dropout(weights, p=dropout_p) @ v  # (B, H, T, Dh)
        return out, weights.detach()

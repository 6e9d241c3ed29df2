"""Multi-head self-attention on SDPA (Vaswani et al. 2017, sec. 3.2), with GQA, a KV cache and the
knobs of real architectures (docs/custom_components.md).
Shapes: x (B, T, D) -> q (B, H, T, Dh), k, v (B, H_kv, T_k, Dh) -> out (B, T, D)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LayerKV:
    """One layer's keys (before the rotary PE) and values of the tokens seen so far."""

    keys: torch.Tensor | None = None  # (B, H_kv, T, Dh)
    values: torch.Tensor | None = None  # (B, H_kv, T, Dh)

    @property
    def length(self) -> int:
        """Tokens held."""
        return 0 if self.keys is None else self.keys.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' k, v (B, H_kv, T_new, Dh); return every key and value held,
        (B, H_kv, T, Dh) each."""
        if self.keys is not None:
            k = torch.cat([self.keys, k], dim=-2)  # (B, H_kv, T + T_new, Dh)
            v = torch.cat([self.values, v], dim=-2)
        self.keys, self.values = k, v
        return k, v


@dataclass
class KVCache:
    """A decoder's keys and values, one :class:`LayerKV` per layer, for positions
    ``0 .. length - 1``."""

    layers: list[LayerKV]

    @classmethod
    def empty(cls, n_layers: int) -> KVCache:
        return cls([LayerKV() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """Tokens held (the position of the next token)."""
        return self.layers[0].length if self.layers else 0


@dataclass
class AttentionInputs:
    """What every layer's attention needs besides x; built once per forward by the model."""

    positions: torch.Tensor  # (T,) integer positions of the tokens in x (of the queries)
    rotary: nn.Module | None = None  # a PE of kind "rotary": (q, k, positions) -> (q, k)
    mask: torch.Tensor | None = None  # (H or 1, T_q, T_k) additive float mask, or None
    is_causal: bool = False  # let SDPA apply the causal mask itself (mask None, T_q == T_k)
    need_weights: bool = False  # also compute and keep the attention probabilities
    cache: LayerKV | None = None  # this layer's cached keys/values (cached decoding)
    key_positions: torch.Tensor | None = None  # (T_k,) with a cache: positions of every key


def init_linear(layer: nn.Linear, std: float) -> None:
    """Weights N(0, std), bias 0."""
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def projection_sizes(d_model: int, n_heads: int, n_kv_heads: int | None = None,
                     head_dim: int | None = None) -> tuple[int, int, int]:
    """Output sizes of the Q, K and V projections: ``(H Dh, H_kv Dh, H_kv Dh)``."""
    head_dim = d_model // n_heads if head_dim is None else head_dim
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    return n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim


def softmax(scores: torch.Tensor) -> torch.Tensor:
    """Attention weights over the keys, the last axis."""
    return scores.softmax(dim=-1)


class MultiHeadAttention(nn.Module):
    """Self-attention with a fused QKV projection; keeps ``last_weights`` when asked for them."""

    @classmethod
    def count_parameters(cls, d_model: int, n_heads: int, bias: bool = True,
                         n_kv_heads: int | None = None, head_dim: int | None = None,
                         qkv_bias: bool | None = None, out_bias: bool | None = None) -> int:
        """``D (H + 2 H_kv) Dh + H Dh D`` weights (+ ``(H + 2 H_kv) Dh`` and ``D`` biases)."""
        q, k, v = projection_sizes(d_model, n_heads, n_kv_heads, head_dim)
        qkv_bias, out_bias = (bias if b is None else b for b in (qkv_bias, out_bias))
        return (d_model + qkv_bias) * (q + k + v) + (q + out_bias) * d_model  # bias: 0 or 1

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
                 init_std: float = 0.02, n_kv_heads: int | None = None, head_dim: int | None = None,
                 scale: float | None = None, qkv_bias: bool | None = None,
                 out_bias: bool | None = None) -> None:
        super().__init__()
        if head_dim is None and d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else head_dim
        self.scale = scale  # None: SDPA's 1 / sqrt(head_dim)
        self.dropout = dropout
        self.q_size, self.kv_size, _ = projection_sizes(d_model, n_heads, n_kv_heads,
                                                        self.head_dim)
        self.qkv_proj = nn.Linear(d_model, self.q_size + 2 * self.kv_size,
                                  bias=bias if qkv_bias is None else qkv_bias)
        self.out_proj = nn.Linear(self.q_size, d_model, bias=bias if out_bias is None else out_bias)
        init_linear(self.qkv_proj, init_std)
        init_linear(self.out_proj, init_std)
        self.last_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q (B, H, T, Dh), k and v (B, H_kv, T, Dh)."""
        qkv = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in qkv)
        return q, k, v

    def positioned(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The new q, k, v joined with the KV cache, rotated by a rotary PE and with each K/V
        head repeated for its query heads: q (B, H, T, Dh), k and v (B, H_kv, T, Dh) ->
        q (B, H, T, Dh), k and v (B, H, T_k, Dh)."""
        if inputs.cache is not None:
            k, v = inputs.cache.append(k, v)  # (B, H_kv, T_k, Dh): earlier tokens and these
        if inputs.rotary is not None and inputs.cache is None:
            q, k = inputs.rotary(q, k, inputs.positions)
        elif inputs.rotary is not None:  # each goes in twice; the other output is dropped
            q = inputs.rotary(q, q, inputs.positions)[0]  # (B, H, T_q, Dh)
            k = inputs.rotary(k, k, inputs.key_positions)[1]  # (B, H_kv, T_k, Dh)
        if self.n_kv_heads != self.n_heads:  # each K/V head serves H / H_kv query heads
            repeats = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(repeats, dim=1)  # (B, H, T_k, Dh)
            v = v.repeat_interleave(repeats, dim=1)
        return q, k, v

    def written_out(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    inputs: AttentionInputs,
                    weigh: Callable[[torch.Tensor], torch.Tensor] = softmax) -> torch.Tensor:
        """SDPA's computation written out: q (B, H, T_q, Dh) . k (B, H, T_k, Dh) scaled (None:
        1 / sqrt(Dh)), plus ``inputs.mask`` or the causal mask, ``weigh`` (fp32 scores ->
        weights, (B, H, T_q, T_k)) in place of the softmax; keeps ``last_weights`` with
        ``need_weights``. -> (B, H, T_q, Dh)."""
        scores = q @ k.transpose(-2, -1)  # (B, H, T_q, T_k)
        scores = scores / math.sqrt(q.shape[-1]) if self.scale is None else scores * self.scale
        if inputs.mask is not None:
            scores = scores + inputs.mask
        elif inputs.is_causal:  # T_q == T_k (the model passes a mask otherwise)
            future = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device)
            scores = scores.masked_fill(future.triu(1), float("-inf"))
        scores = scores.float()  # fp32, as autocast does
        weights = weigh(scores).to(v.dtype)  # (B, H, T_q, T_k)
        if inputs.need_weights:
            self.last_weights = weights.detach()
        return F.dropout(weights, p=self.dropout if self.training else 0.0) @ v

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        q, k, v = self.positioned(*self.split_heads(x), inputs)  # (B, H, T, Dh), (B, H, T_k, Dh)
        if inputs.need_weights:
            out = self.written_out(q, k, v, inputs)  # (B, H, T_q, Dh)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=inputs.mask, dropout_p=self.dropout if self.training else 0.0,
                is_causal=inputs.is_causal, scale=self.scale,
            )  # (B, H, T_q, Dh)
        return self.out_proj(out.transpose(1, 2).flatten(2))  # (B, T, H Dh) -> (B, T, D)


"""T5 relative position bias (Raffel et al., 2019)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import query_offset


def t5_relative_bucket(relative_position: torch.Tensor, bidirectional: bool = True,
                       num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of each relative position ``key - query`` (Raffel et al. 2019, arXiv:1910.10683;
    as Mesh TensorFlow and HF): exact for small distances, log-spaced up to ``max_distance``.
    Shapes: any integer tensor -> ``LongTensor`` of the same shape, in ``[0, num_buckets)``."""
    least = 4 if bidirectional else 2
    if num_buckets < least:
        raise ValueError(f"num_buckets={num_buckets} is not valid; it must be >= {least} "
                         f"(bidirectional={bidirectional})")
    relative_position = relative_position.long()
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)  # keys to the left, >= 0
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance={max_distance} is not valid; it must be > {max_exact} "
                         f"(half the buckets of one direction)")
    is_small = distance < max_exact
    # log(0) only occurs where is_small is true; clamp to keep the discarded branch finite.
    distance_large = distance.clamp(min=max_exact).float()
    log_ratio = torch.log(distance_large / max_exact) / math.log(max_distance / max_exact)
    bucket_large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    bucket_large = bucket_large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, bucket_large)


class T5RelativeBias(nn.Module):
    """T5's learned bucketed relative bias (``kind = "bias"``; Raffel et al. 2019,
    arXiv:1910.10683): ``bias[h, i, j] = E[bucket(j - i), h]``; ``bidirectional`` for encoders.
    Shapes: ``(q_len, k_len)`` -> ``(n_heads, q_len, k_len)``, the last ``q_len`` positions."""

    kind = "bias"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    property_checks: tuple[str, ...] = ("permutation",)
    expected_reversal: dict[str, str] = {"encoder": "solves (relative only: needs 2 layers)",
                                         "decoder": "solves"}

    @classmethod
    def count_parameters(cls, num_buckets: int, n_heads: int) -> int:
        """The ``(num_buckets, n_heads)`` table."""
        return num_buckets * n_heads

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"n_heads={n_heads} is not valid; it must be >= 1")
        # validates num_buckets and max_distance with a clear message
        t5_relative_bucket(torch.zeros(1), bidirectional, num_buckets, max_distance)
        self.n_heads, self.num_buckets = n_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.relative_attention_bias.weight, mean=0.0, std=0.02)
        self.register_buffer("buckets", torch.empty(0, 0, dtype=torch.long), persistent=False)

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        first_query = query_offset(q_len, k_len)
        if k_len > self.buckets.shape[-1]:
            positions = torch.arange(k_len, device=self.buckets.device)
            relative = positions[None, :] - positions[:, None]  # (L, L): key - query
            self.buckets = t5_relative_bucket(relative, self.bidirectional, self.num_buckets,
                                              self.max_distance)  # (L, L)
        buckets = self.buckets[first_query:k_len, :k_len]  # (Tq, Tk)
        return self.relative_attention_bias(buckets).permute(2, 0, 1)  # (Tq, Tk, H) -> (H, Tq, Tk)

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")

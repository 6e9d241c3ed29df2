"""ALiBi: attention with linear biases (Press et al., 2021)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import query_offset

ALIBI_SYMMETRIC: tuple[str, ...] = ("abs", "split")


def alibi_slopes(n_heads: int, slope_power: float = 8.0) -> torch.Tensor:
    """Per-head ALiBi slopes (Press et al., 2021, arXiv:2108.12409).

    For ``n`` a power of two: the geometric sequence ``start^1, ..., start^n`` with
    ``start = 2^(-slope_power/n)`` (the paper's ``slope_power`` 8; 8 heads: 1/2, 1/4, ...,
    1/256). A smaller ``slope_power`` gives steeper slopes (2 heads, power 2: 1/2, 1/4).
    Otherwise, with ``p`` the largest power of two below ``n``: the ``p`` slopes of ``p`` heads,
    then every other slope of the ``2p`` set, ``slopes(2p)[0::2][: n - p]`` (as
    ``get_slopes`` in the authors' repository).

    Returns:
        Tensor of shape ``(n_heads,)``, float32, decreasing within each part.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads={n_heads} is not valid for ALiBi; it must be >= 1")

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-slope_power / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two_slopes(n_heads)
    else:
        p = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two_slopes(p) + power_of_two_slopes(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiPositionalBias(nn.Module):
    """ALiBi attention-logit bias (``kind = "bias"``): no embedding, a distance penalty.

    ``softmax(q_i . k_j / sqrt(d) + bias[h, i, j])`` with a fixed per-head slope ``m_h`` from
    :func:`alibi_slopes` (Press, Smith & Lewis, 2021, "Train Short, Test Long", arXiv:2108.12409).

    * ``causal=True`` (decoder, as in the paper): ``bias[h, i, j] = -m_h * max(i - j, 0)``.
      Keys in the future (``j > i``) get 0; the model's causal mask removes them anyway.
      ``symmetric`` is ignored in this form.
    * ``causal=False, symmetric="abs"`` (encoder): ``bias[h, i, j] = -m_h * |i - j|``. A
      symmetric bias cannot tell left from right: an encoder whose only position signal is this
      bias is still equivariant to reversing the sequence, so it cannot learn to reverse one.
    * ``causal=False, symmetric="split"`` (encoder, "bidirectional ALiBi"): the first
      ``n_heads // 2`` heads look left, ``-m_h * (i - j)`` for ``j <= i`` and ``-inf`` for
      ``j > i``; the other heads look right, ``-m_h * (j - i)`` for ``j >= i`` and ``-inf`` for
      ``j < i``. Each group gets the slopes ``alibi_slopes(group size)``. The two directions
      make the bias asymmetric, so the model can tell left from right. Every row keeps its
      diagonal, so no row is fully masked by the bias itself. Needs ``n_heads >= 2``.

    The queries are the last ``q_len`` of the ``k_len`` positions (the protocol of
    :mod:`.base`): query ``i`` at position ``k_len - q_len + i``, key ``j`` at ``j``; in a full
    forward (``q_len == k_len``) query ``i`` is at ``i``. The full-size bias is cached as a
    buffer and its bottom-right ``(q_len, k_len)`` block returned.

    Shapes:
        ``(q_len, k_len)`` -> ``(n_heads, q_len, k_len)`` float32.
    """

    kind = "bias"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    #: property checks of ``tlab check`` that apply (names in ``routines/check.py``)
    property_checks: tuple[str, ...] = ("permutation",)

    @classmethod
    def count_parameters(cls) -> int:
        """Parameters the module holds: none (the slopes are fixed)."""
        return 0

    @classmethod
    def variant_label(cls, name: str, arch: str, symmetric: str = "abs") -> str:
        """How tables name this PE: an encoder's bias form is part of the name
        (``alibi(abs)``, ``alibi(split)``); a decoder uses the causal form whatever
        ``symmetric`` says."""
        return f"{name}({symmetric})" if arch == "encoder" else name

    @classmethod
    def expected_reversal(cls, arch: str, symmetric: str = "abs") -> str | None:
        """What it does on the 4-token reversal task (``tlab reverse-task``, ``reverse.csv``),
        with the settings of :meth:`reversal_settings`."""
        if arch == "decoder":
            return "solves, slower: 400-600 steps with a cosine schedule"
        if symmetric == "split":
            return "solves, slowly: 1700-3000 steps with a cosine schedule over 5000"
        if symmetric == "abs":
            return ("slow: -m|i-j| cannot tell left from right (one layer: NoPE level); two "
                    "layers learn it from the edges (seed 0: 1450 steps, cosine over 3000)")
        return None

    @classmethod
    def reversal_settings(cls, arch: str, symmetric: str = "abs") -> dict[str, object]:
        """What step 3 (reversal) trains ALiBi with, over the routine's defaults (the NoPE
        control shares them). Measured, seeds 0-2 (``experiments/reverse_expectations.md``):
        at the constant lr 5e-3 the exact match oscillates around 0.9-0.98 and never holds
        0.99 in 600 steps; a decaying (cosine) lr lets it settle. The encoder, whose left- and
        right-looking heads must first work out absolute positions, needs 1700-3000 steps
        (over 3000 steps seed 2 stayed at 0.98, hence 5000)."""
        cosine = {"train.schedule": "warmup_cosine", "train.warmup": 20}
        return {**cosine, "routine.max_steps": 5000} if arch == "encoder" else cosine

    def __init__(self, n_heads: int, causal: bool = True, symmetric: str = "abs",
                 slope_power: float = 8.0) -> None:
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"n_heads={n_heads} is not valid for ALiBi; it must be >= 1")
        if symmetric not in ALIBI_SYMMETRIC:
            raise ValueError(f"symmetric={symmetric!r} is not valid; choose 'abs' or 'split'")
        if not causal and symmetric == "split" and n_heads < 2:
            raise ValueError(
                f"n_heads={n_heads} is not valid for symmetric='split' (one left-looking and "
                f"one right-looking group); use n_heads >= 2 or symmetric='abs'"
            )
        self.n_heads = n_heads
        self.causal = causal
        self.symmetric = symmetric
        self.slope_power = slope_power
        if not causal and symmetric == "split":
            n_left = n_heads // 2
            slopes = torch.cat([alibi_slopes(n_left, slope_power),
                                alibi_slopes(n_heads - n_left, slope_power)])
        else:
            slopes = alibi_slopes(n_heads, slope_power)
        self.register_buffer("slopes", slopes, persistent=False)  # (H,)
        self.register_buffer("cached", torch.empty(n_heads, 0, 0), persistent=False)

    def _build(self, size: int) -> torch.Tensor:
        device = self.slopes.device
        i = torch.arange(size, device=device)[:, None]  # (L, 1) query positions
        j = torch.arange(size, device=device)[None, :]  # (1, L) key positions
        slopes = self.slopes.float()[:, None, None]  # (H, 1, 1)
        if self.causal:
            dist = (i - j).clamp(min=0).float()  # (L, L)
            return -slopes * dist  # (H, L, L)
        dist = (i - j).abs().float()  # (L, L)
        bias = -slopes * dist  # (H, L, L)
        if self.symmetric == "split":
            n_left = self.n_heads // 2
            neg_inf = torch.tensor(float("-inf"), device=device)
            bias[:n_left] = torch.where(j > i, neg_inf, bias[:n_left])  # left-looking heads
            bias[n_left:] = torch.where(j < i, neg_inf, bias[n_left:])  # right-looking heads
        return bias

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        first_query = query_offset(q_len, k_len)
        if k_len > self.cached.shape[-1] or self.cached.dtype != torch.float32:
            self.cached = self._build(max(k_len, self.cached.shape[-1]))
        return self.cached[:, first_query:k_len, :k_len]  # (H, Tq, Tk)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, causal={self.causal}, symmetric={self.symmetric!r}"

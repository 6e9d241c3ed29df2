"""``tlab check``'s component properties: RoPE's relative property (also step 3's
``rotary_relative``), the sinusoidal shift map, NoPE's permutation equivariance and the token-swap
test on attention (docs/detector.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn

# A rotary PE: (q (B, H, T, d), k (B, H, T, d), positions (T,)) -> rotated q, k.
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# (m, n) query/key position pairs and the shifts added to both
RELATIVE_PAIRS: tuple[tuple[int, int], ...] = ((2, 5), (0, 3), (10, 4), (1, 30))
RELATIVE_SHIFTS: tuple[int, ...] = (0, 5, 17, 64)


class RelativeViolation(NamedTuple):
    """The largest change of ``q.k`` that :func:`rope_relative_violation` saw when both
    positions moved by the same amount."""

    value: float  # that change, relative to |q| |k|: 0 for a correct RoPE
    positions: tuple[tuple[int, int], tuple[int, int]]  # (m, n) before and after the move
    scores: tuple[float, float]  # q.k at those two positions


@torch.no_grad()
def rope_relative_violation(rotary: Rotary, head_dim: int,
                            pairs: Sequence[tuple[int, int]] = RELATIVE_PAIRS,
                            shifts: Sequence[int] = RELATIVE_SHIFTS,
                            n_vectors: int = 8) -> RelativeViolation:
    """Largest spread of ``q_{m+s} . k_{n+s}`` over the shifts ``s``, relative to ``|q| |k|``,
    for ``n_vectors`` random (q, k) (the heads of one batch element) and every (m, n) pair,
    rotated by ``rotary``'s own q and k rotations (Su et al. 2021, eq. 16)."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(n_vectors, head_dim, generator=generator)  # (N, d)
    k = torch.randn(n_vectors, head_dim, generator=generator)  # (N, d)
    scale = q.norm(dim=-1) * k.norm(dim=-1)  # (N,)
    m, n = torch.tensor(pairs).T  # (P,) each
    shift = torch.tensor(shifts)[:, None]  # (S, 1)
    q_positions, k_positions = (m + shift).flatten(), (n + shift).flatten()  # (S*P,) each
    queries = q[None, :, None, :].expand(1, -1, len(q_positions), -1)  # (1, N, S*P, d)
    keys = k[None, :, None, :].expand(1, -1, len(k_positions), -1)  # (1, N, S*P, d)
    q_rot = rotary(queries, keys, q_positions)[0][0]  # (N, S*P, d)
    k_rot = rotary(queries, keys, k_positions)[1][0]  # (N, S*P, d)
    scores = (q_rot * k_rot).sum(dim=-1).unflatten(1, (len(shifts), len(pairs)))  # (N, S, P)
    relative = scores / scale[:, None, None]  # (N, S, P)
    spread = relative.max(dim=1).values - relative.min(dim=1).values  # (N, P)
    vector, pair = divmod(int(spread.argmax()), len(pairs))
    extremes = relative[vector, :, pair]  # (S,)
    before, after = sorted((int(extremes.argmin()), int(extremes.argmax())))
    m0, n0 = pairs[pair]
    return RelativeViolation(
        spread.max().item(),
        ((m0 + shifts[before], n0 + shifts[before]), (m0 + shifts[after], n0 + shifts[after])),
        (scores[vector, before, pair].item(), scores[vector, after, pair].item()))


SHIFTS = (1, 3, 10)  # the k of sinusoidal_shift_residual's maps M_k


def shift_positions(d: int) -> int:
    """How many positions ``sinusoidal_shift_residual`` uses for width ``d``: enough that half
    of them (the fit) over-determine the d x d map."""
    return max(256, 4 * d)


def sinusoidal_shift_residual(table: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Fit one ``M_k`` with ``PE(p + k) = M_k PE(p)`` (Vaswani et al. 2017, sec. 3.5) by least
    squares on a random half of positions ``[0, shift_positions(d))``, apply it to the other
    half; the largest residual relative to ``max |PE|``. ``table(positions (T,)) -> (T, d)``."""
    n = shift_positions(table(torch.arange(1)).shape[-1])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    fit, test = order[: n // 2], order[n // 2 :]
    current = table(torch.arange(n)).double()  # (n, d)
    worst = 0.0
    for shift in SHIFTS:
        shifted = table(torch.arange(n) + shift).double()  # (n, d)
        solution = torch.linalg.lstsq(current[fit], shifted[fit]).solution  # (d, d) = M_k^T
        residual = (current[test] @ solution - shifted[test]).abs().max()
        worst = max(worst, (residual / shifted.abs().max().clamp_min(1e-12)).item())
    return worst


@torch.no_grad()
def permutation_error(model: nn.Module, tokens: torch.Tensor, permutation: torch.Tensor) -> float:
    """``max |f(x[:, P]) - f(x)[:, P]| / max |f(x)|`` for a model ``(B, T) -> (B, T, V)``.
    0 (up to rounding) for a permutation-equivariant model."""
    model.eval()
    out = model(tokens)  # (B, T, V)
    permuted = model(tokens[:, permutation])  # (B, T, V)
    return ((permuted - out[:, permutation]).abs().max() / out.abs().max().clamp_min(1e-12)).item()


@torch.no_grad()
def swap_attention_error(model: nn.Module, tokens: torch.Tensor, i: int,
                         j: int) -> tuple[float, float]:
    """Swap tokens i and j; return (``max |A'[h, a, b] - A[h, P(a), P(b)]|`` over layers and
    heads of the attention probabilities A, :func:`permutation_error`): both 0 without a PE."""
    model.eval()
    permutation = torch.arange(tokens.shape[1])
    permutation[i], permutation[j] = j, i
    before = model.attention_maps(tokens)  # list of (B, H, T, T)
    after = model.attention_maps(tokens[:, permutation])
    attention = max((a - b[..., permutation, :][..., permutation]).abs().max().item()
                    for a, b in zip(after, before, strict=True))
    return attention, permutation_error(model, tokens, permutation)

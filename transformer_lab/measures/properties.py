"""Measurements of component properties: each returns how far a component is from one.

    rope_relative_violation      RoPE: q_m . k_n depends only on n - m (Su et al. 2021, eq. 16);
                                 ``tlab check`` and step 3 of ``tlab validate`` /
                                 ``tlab reverse-task``
    sinusoidal_shift_residual    sinusoidal PE: PE(pos + k) = M_k PE(pos), one M_k for every pos
                                 (Vaswani et al. 2017, sec. 3.5)
    permutation_error            f(P x) vs P f(x): zero for a position-free (NoPE) encoder
    swap_attention_error         swap two tokens: attention rows and columns must permute
                                 exactly without a PE (the article's "我打你" / "你打我" test)

The functions take callables and modules, so a deliberately broken component can be passed in
(the tests do). Each returns a relative or absolute error (``rope_relative_violation`` also
where it saw it); the routines decide PASS/FAIL against a tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn

# A rotary PE: (q (B, H, T, d), k (B, H, T, d), positions (T,)) -> rotated q, k.
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# (m, n) query/key position pairs and the shifts added to both; (2, 5) + 5 = (7, 10) is the
# seed's example.
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
                            shifts: Sequence[int] = RELATIVE_SHIFTS, n_vectors: int = 8,
                            seed: int = 0) -> RelativeViolation:
    """Largest spread of ``q_{m+s} . k_{n+s}`` over the shifts ``s``, relative to ``|q| |k|``,
    for random q, k and every (m, n) pair, with q and k rotated by ``rotary`` (the PE's own q
    and k rotations: a pairing or sign that differs between them shows).

    The ``n_vectors`` random (q, k) pairs go in as the heads of one batch element; the q of
    every (pair, shift) is rotated in one call, the k in another."""
    generator = torch.Generator().manual_seed(seed)
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


def shift_positions(d: int, n_positions: int = 256) -> int:
    """How many positions ``sinusoidal_shift_residual`` uses for width ``d``: enough that half
    of them (the fit) over-determine the d x d map."""
    return max(n_positions, 4 * d)


def sinusoidal_shift_residual(table: Callable[[torch.Tensor], torch.Tensor],
                              shifts: Sequence[int] = (1, 3, 10), n_positions: int = 256,
                              seed: int = 0) -> float:
    """Fit one ``M_k`` by least squares on a random half of positions
    ``[0, shift_positions(d))`` and apply it to the other half; return the largest residual
    ``|PE(p + k) - M_k PE(p)|`` relative to ``max |PE|``. For a sinusoidal table only float32
    rounding of the angles remains, which grows with the largest position: 2.3e-5 at d 32 (256
    positions), 1.2e-3 at d 2048 (8192 positions). O(1) when PE(pos + k) is not a fixed linear
    map of PE(pos).

    ``table(positions (T,)) -> (T, d)``."""
    d = table(torch.arange(1)).shape[-1]
    n = shift_positions(d, n_positions)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    fit, test = order[: n // 2], order[n // 2 :]
    worst = 0.0
    for shift in shifts:
        positions = torch.arange(n)
        current = table(positions).double()  # (n, d)
        shifted = table(positions + shift).double()  # (n, d)
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


def swap_permutation(seq_len: int, i: int, j: int) -> torch.Tensor:
    """The permutation of ``range(seq_len)`` that swaps positions i and j."""
    permutation = torch.arange(seq_len)
    permutation[i], permutation[j] = j, i
    return permutation


@torch.no_grad()
def swap_attention_error(model: nn.Module, tokens: torch.Tensor, i: int,
                         j: int) -> tuple[float, float]:
    """Swap tokens i and j; return (attention error, output error).

    attention error: ``max |A'[h, a, b] - A[h, P(a), P(b)]|`` over layers and heads, with A
    the attention probabilities (B, H, T, T) and P the swap. Output error as in
    :func:`permutation_error`. Both 0 when attention ignores position (NoPE), > 0 with a PE.
    """
    model.eval()
    permutation = swap_permutation(tokens.shape[1], i, j)
    before = model.attention_maps(tokens)  # list of (B, H, T, T)
    after = model.attention_maps(tokens[:, permutation])
    attention = max((a - b[..., permutation, :][..., permutation]).abs().max().item()
                    for a, b in zip(after, before, strict=True))
    return attention, permutation_error(model, tokens, permutation)

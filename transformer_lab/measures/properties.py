"""Measurements behind ``tlab check``: each returns how far a component is from a property.

    rope_relative_violation      RoPE: q_m . k_n depends only on n - m (Su et al. 2021, eq. 16)
    sinusoidal_shift_residual    sinusoidal PE: PE(pos + k) = M_k PE(pos), one M_k for every pos
                                 (Vaswani et al. 2017, sec. 3.5)
    permutation_error            f(P x) vs P f(x): zero for a position-free (NoPE) encoder
    swap_attention_error         swap two tokens: attention rows and columns must permute
                                 exactly without a PE (the article's "我打你" / "你打我" test)

The functions take callables and modules, so a deliberately broken component can be passed in
(the tests do). All return a relative or absolute error as a float; ``tlab check`` decides
PASS/FAIL against a tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

Rotate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (T, d), positions (T,)) -> x

# (m, n) query/key position pairs and the shifts added to both; (2, 5) + 5 = (7, 10) is the
# seed's example.
RELATIVE_PAIRS: tuple[tuple[int, int], ...] = ((2, 5), (0, 3), (10, 4), (1, 30))
RELATIVE_SHIFTS: tuple[int, ...] = (0, 5, 17, 64)


def rope_relative_violation(rotate_q: Rotate, rotate_k: Rotate, head_dim: int,
                            pairs: Sequence[tuple[int, int]] = RELATIVE_PAIRS,
                            shifts: Sequence[int] = RELATIVE_SHIFTS, n_vectors: int = 8,
                            seed: int = 0) -> float:
    """Largest spread of ``rotate_q(q, m + s) . rotate_k(k, n + s)`` over the shifts ``s``,
    relative to ``|q| |k|``, for random q, k and every (m, n) pair. 0 for a correct RoPE."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(n_vectors, head_dim, generator=generator)  # (N, d)
    k = torch.randn(n_vectors, head_dim, generator=generator)  # (N, d)
    scale = q.norm(dim=-1) * k.norm(dim=-1)  # (N,)
    worst = 0.0
    for m, n in pairs:
        scores = []
        for shift in shifts:
            q_pos = torch.full((n_vectors,), m + shift)
            k_pos = torch.full((n_vectors,), n + shift)
            q_rot = rotate_q(q[:, None, :], q_pos[:1]).squeeze(1)  # (N, d)
            k_rot = rotate_k(k[:, None, :], k_pos[:1]).squeeze(1)  # (N, d)
            scores.append((q_rot * k_rot).sum(dim=-1) / scale)  # (N,)
        stacked = torch.stack(scores)  # (S, N)
        worst = max(worst, (stacked.max(dim=0).values - stacked.min(dim=0).values).max().item())
    return worst


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

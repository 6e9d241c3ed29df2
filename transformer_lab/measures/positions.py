"""What a positional encoding gives each position, and whether all of them can be told apart.

``position_representations`` is the PE's own output for positions ``0 .. L - 1``, whatever
its kind (the model's ``positional`` module, :mod:`transformer_lab.components.positional.base`):

    additive  its rows ``pe(positions)``                                   (L, d_model)
    rotary    a fixed vector (all ones) as q and as k of every head, rotated (L, (H + H_kv) Dh)
    bias      per query, the attention it would pay by position alone: the softmax of its row
              of the model's attention mask (bias plus causal mask), every head  (L, H L)

``position_distinguishability`` compares every pair of positions up to ``max_len``, not only
neighbours: a sinusoidal PE whose frequencies are all about 1 (a wrong ``div_term``) puts
positions p and p + 44 0.018 rad apart (44 is about 7 x 2 pi) while neighbours are a radian
apart; the model-level check (swapping neighbours) and 4-token reversal never see that pair.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_lab.measures.property_result import PropertyResult, component, failed, verdict

DEFAULT_MAX_LEN = 256  # positions checked for a PE without a max_len of its own
SAME_TOLERANCE = 1e-5  # two rows closer than this (relative to a row's norm) are the same:
# one PE computation rounds at float32's 6e-8 of a row, so distinct rows are far above it
ALIASING_RATIO = 0.05
# A far pair closer than this fraction of a neighbour step aliases (features put on one scale:
# a linear readout can weight a slow feature up). Two classes to separate: a frequency that
# returns to its start, e.g. every frequency 1 returns within 44 - 14 pi = 0.018 rad of it 44
# steps later (ratio 0.018); and the near-coincidences any low-dimensional PE has among many
# pairs (a sin-only 8-frequency PE over 256 positions: 0.097; random 8-dim rows over 2048: ~0.16;
# the built-ins and RoPE with every scaling on the tiny model: >= 0.27). 0.05 lies between.


def position_max_len(model: nn.Module, default: int = DEFAULT_MAX_LEN) -> int:
    """The PE's own ``max_len`` where it has one (a learned table), else ``default``."""
    return int(getattr(model.positional, "max_len", None) or default)


def _rotary_representations(model: nn.Module, length: int, dtype: torch.dtype) -> torch.Tensor:
    attention = model.blocks[0].attention
    if not hasattr(attention, "n_heads"):  # a block's own attention wrapping tlab's
        attention = next(m for m in model.modules()
                         if all(hasattr(m, a) for a in ("n_heads", "n_kv_heads", "head_dim")))
    positions = torch.arange(length)
    q = torch.ones(1, attention.n_heads, length, attention.head_dim, dtype=dtype)
    k = torch.ones(1, attention.n_kv_heads, length, attention.head_dim, dtype=dtype)
    q, k = model.positional(q, k, positions)  # (1, H, L, Dh), (1, H_kv, L, Dh)
    return torch.cat([q[0].transpose(0, 1).reshape(length, -1),
                      k[0].transpose(0, 1).reshape(length, -1)], dim=1)  # (L, (H + H_kv) Dh)


def position_representations(model: nn.Module, length: int,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """What the model's PE gives positions ``0 .. length - 1`` (module docstring), one row per
    position, float32; None for a PE of kind ``none``. ``dtype``: that of the fixed vector a
    rotary PE rotates (the run's activations: bfloat16 under bf16 autocast)."""
    kind = model.positional.kind
    with torch.no_grad():
        if kind == "additive":
            return model.positional(torch.arange(length)).float()  # (L, D)
        if kind == "rotary":
            return _rotary_representations(model, length, dtype).float()
        if kind == "bias":
            mask = model.attention_mask(length, length, torch.device("cpu"))  # (H, L, L)
            attention = mask.float().softmax(dim=-1).nan_to_num(0.0)  # (H, L, L)
            return attention.transpose(0, 1).reshape(length, -1)  # (L, H L)
    return None


def pair_distances(rows: torch.Tensor) -> torch.Tensor:
    """Euclidean distance of every pair of rows, in float64: (L, F) -> (L, L)."""
    rows = rows.double()
    return torch.cdist(rows, rows)


def same_pairs(rows: torch.Tensor) -> list[tuple[int, int]]:
    """Pairs ``(p, q)``, ``p < q``, whose rows are the same up to :data:`SAME_TOLERANCE` of the
    rows' mean norm."""
    scale = float(rows.double().norm(dim=-1).mean())
    close = pair_distances(rows) <= SAME_TOLERANCE * max(scale, 1e-30)  # (L, L)
    close &= torch.ones_like(close).triu(1)
    return [(int(p), int(q)) for p, q in torch.nonzero(close)]


def standardized(rows: torch.Tensor) -> torch.Tensor:
    """Each feature (column) divided by its spread over the positions; features that do not
    vary beyond float32 noise are left out: (L, F) -> (L, F')."""
    rows = rows.double()
    spread = rows.std(dim=0)  # (F,)
    varies = spread > SAME_TOLERANCE * float(rows.pow(2).mean().sqrt())
    return rows[:, varies] / spread[varies]


def aliasing(rows: torch.Tensor) -> tuple[float, int, int]:
    """The smallest distance between two positions at least 2 apart, as a fraction of the
    smaller of their neighbour steps (a position's distance to its closest neighbour), with
    features standardized; and that pair. Rows must be distinct (:func:`same_pairs`)."""
    distances = pair_distances(standardized(rows))  # (L, L)
    length = distances.shape[0]
    neighbour = distances.diagonal(1)  # (L - 1,): p to p + 1
    step = torch.full((length,), math.inf, dtype=distances.dtype)
    step[:-1] = neighbour
    step[1:] = torch.minimum(step[1:], neighbour)  # (L,): to the closer neighbour
    ratio = distances / torch.minimum(step[:, None], step[None, :])  # (L, L)
    far = torch.ones(length, length, dtype=torch.bool).triu(2)
    ratio = torch.where(far, ratio, torch.full_like(ratio, math.inf))
    p, q = divmod(int(ratio.argmin()), length)
    return float(ratio[p, q]), p, q


def position_distinguishability(model: nn.Module, max_len: int | None = None) -> PropertyResult:
    """Every pair of positions below ``max_len`` gets clearly different representations from
    the PE (:func:`position_representations`).

    Two failures: a pair whose rows are the same (float32 noise, :data:`SAME_TOLERANCE`); a
    pair of positions at least 2 apart whose rows are closer than :data:`ALIASING_RATIO` of a
    neighbour step once every feature is put on one scale (:func:`aliasing`): the PE aliases
    far positions, which a neighbour swap and a 4-token task never see. Measured on the PE
    itself, so relative PEs (rotary, bias) are judged on what they produce, not on a model
    that must learn to read it. A PE of kind ``none`` does not apply (the control).
    """
    name = "position_distinguishability"
    max_len = max_len or position_max_len(model)
    pe = f"the positional encoding ({component(model.positional)})"
    if max_len < 3:
        return PropertyResult(name, None, detail=f"max_len={max_len}: no far pair")
    try:
        rows = position_representations(model, max_len)
    except Exception as exc:
        return failed(name, exc)
    if rows is None:
        return PropertyResult(name, None, detail="pe kind 'none': no positions (the control)")
    if not bool(torch.isfinite(rows).all()):
        return PropertyResult(name, False, math.nan, ALIASING_RATIO,
                              f"{pe} gives non-finite values below position {max_len}")
    same = same_pairs(rows)
    if same:
        p, q = same[0]
        return PropertyResult(name, False, 0.0, ALIASING_RATIO,
                              f"{pe} gives positions {p} and {q} the same representation "
                              f"({len(same)} such pairs below {max_len})")
    ratio, p, q = aliasing(rows)
    return verdict(name, ratio >= ALIASING_RATIO, ratio, ALIASING_RATIO,
                   f"every pair of positions below {max_len} at least {ratio:.2g} of a "
                   "neighbour step apart",
                   f"{pe}: positions {p} and {q} are only {ratio:.2g} of a neighbour step apart "
                   "while neighbours differ clearly: far positions alias (a frequency turning a "
                   f"whole number of times in {q - p} steps?)")

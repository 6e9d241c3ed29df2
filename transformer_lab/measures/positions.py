"""What a positional encoding gives each position (``position_representations``), and step 1's
``position_distinguishability``: every pair of positions told apart (docs/detector.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    component,
    property_check,
    verdict,
)

DEFAULT_MAX_LEN = 256  # positions checked for a PE without a max_len of its own
SAME_TOLERANCE = 1e-5  # relative to a row's norm; one PE computation rounds at 6e-8 of it
ALIASING_RATIO = 0.05  # a far pair closer than this fraction of a neighbour step aliases


def position_max_len(model: nn.Module, default: int = DEFAULT_MAX_LEN) -> int:
    """The PE's own ``max_len`` where it has one (a learned table), else ``default``."""
    return int(getattr(model.positional, "max_len", None) or default)


def position_representations(model: nn.Module, length: int,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The model's PE for positions ``0 .. length - 1``, a float32 row each: an additive PE's
    rows (L, D); a rotary PE's rotation of all-ones q and k in ``dtype`` (L, (H + H_kv) Dh); a
    bias PE's softmax of its mask rows (L, H L). None for a PE of kind ``none``."""
    kind = model.positional.kind
    with torch.no_grad():
        if kind == "additive":
            return model.positional(torch.arange(length)).float()  # (L, D)
        if kind == "rotary":  # tlab's attention, or the one a block's own attention wraps
            attention = next(m for m in model.modules()
                             if all(hasattr(m, a) for a in ("n_heads", "n_kv_heads", "head_dim")))
            q = torch.ones(1, attention.n_heads, length, attention.head_dim, dtype=dtype)
            k = torch.ones(1, attention.n_kv_heads, length, attention.head_dim, dtype=dtype)
            q, k = model.positional(q, k, torch.arange(length))  # (1, H, L, Dh), (1, H_kv, L, Dh)
            rows = [x[0].transpose(0, 1).reshape(length, -1) for x in (q, k)]
            return torch.cat(rows, dim=1).float()  # (L, (H + H_kv) Dh)
        if kind == "bias":
            mask = model.attention_mask(length, length, torch.device("cpu"))  # (H, L, L)
            attention = mask.float().softmax(dim=-1).nan_to_num(0.0)  # (H, L, L)
            return attention.transpose(0, 1).reshape(length, -1)  # (L, H L)
    return None


def same_pairs(rows: torch.Tensor) -> list[tuple[int, int]]:
    """Pairs ``(p, q)``, ``p < q``, whose rows are the same up to :data:`SAME_TOLERANCE` of the
    rows' mean norm."""
    rows = rows.double()
    scale = float(rows.norm(dim=-1).mean())
    close = torch.cdist(rows, rows) <= SAME_TOLERANCE * max(scale, 1e-30)  # (L, L)
    close &= torch.ones_like(close).triu(1)
    return [(int(p), int(q)) for p, q in torch.nonzero(close)]


def aliasing(rows: torch.Tensor) -> tuple[float, int, int]:
    """The smallest distance between two positions at least 2 apart, as a fraction of the
    smaller of their distances to their closest neighbours, with features standardized; and
    that pair. Rows must be distinct (:func:`same_pairs`)."""
    rows = rows.double()
    spread = rows.std(dim=0)  # (F,)
    varies = spread > SAME_TOLERANCE * float(rows.pow(2).mean().sqrt())  # beyond float32 noise
    rows = rows[:, varies] / spread[varies]  # (L, F'): each varying feature standardized
    distances = torch.cdist(rows, rows)  # (L, L)
    length = distances.shape[0]
    neighbour = distances.diagonal(1)  # (L - 1,): p to p + 1
    padded = F.pad(neighbour, (1, 1), value=math.inf)  # (L + 1,)
    step = torch.minimum(padded[:-1], padded[1:])  # (L,): to the closer neighbour
    ratio = distances / torch.minimum(step[:, None], step[None, :])  # (L, L)
    near = torch.ones(length, length, dtype=torch.bool).triu(2).logical_not()
    ratio = ratio.masked_fill(near, math.inf)
    p, q = divmod(int(ratio.argmin()), length)
    return float(ratio[p, q]), p, q


@property_check
def position_distinguishability(model: nn.Module, max_len: int | None = None) -> PropertyResult:
    """The PE gives every pair of positions below ``max_len`` clearly different rows."""
    name = "position_distinguishability"
    max_len = max_len or position_max_len(model)
    pe = f"the positional encoding ({component(model.positional)})"
    if max_len < 3:
        return PropertyResult(name, None, detail=f"max_len={max_len}: no far pair")
    rows = position_representations(model, max_len)
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

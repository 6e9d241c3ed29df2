"""Step 1's properties of the attention patterns: ``query_sees_a_key`` and
``attention_paths_agree`` (SDPA vs the written-out attention); docs/detector.md."""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_lab.components.attention import MultiHeadAttention
from transformer_lab.measures.property_result import (
    PropertyResult,
    amplified_copy,
    component,
    evaluating,
    property_check,
    random_tokens,
    relative_change,
    verdict,
)

PATHS_TOLERANCE = 1e-4  # two orders of fp32 sums of <= 256 terms differ by < 256 * 6e-8
WEIGHTS_TOLERANCE = 1e-4  # a probability row sums to 1 up to fp32 rounding of T terms


def mask_lengths(max_len: int) -> list[int]:
    """Sequence lengths whose masks are scanned: 1 to 8, then doubling, and ``max_len``."""
    lengths, length = list(range(1, min(max_len, 8) + 1)), 16
    while length < max_len:
        lengths.append(length)
        length *= 2
    return sorted({*lengths, max_len})


def _keyless_queries(model: nn.Module, max_len: int) -> tuple[list[int], tuple[int, int] | None]:
    """The lengths at which the model's additive attention mask (a bias PE plus the causal
    mask) leaves a query with every key at -inf, and the first such (head, query)."""
    lengths, first = [], None
    for length in mask_lengths(max_len):
        mask = model.attention_mask(length, length, torch.device("cpu"))  # (H, T, T) or None
        if mask is None:
            return [], None
        keyless = torch.isneginf(mask).all(dim=-1) | torch.isnan(mask).any(dim=-1)  # (H, T)
        if bool(keyless.any()):
            lengths.append(length)
            first = first or tuple(int(i) for i in torch.nonzero(keyless)[0])
    return lengths, first


def sums_to_one(attention: nn.Module) -> bool:
    """Whether an attention module's weights sum to one over the keys: tlab's softmax
    attention, or a class declaring ``weights_sum_to_one = True``."""
    return isinstance(attention, MultiHeadAttention) or bool(
        getattr(type(attention), "weights_sum_to_one", False))


def _bad_probability_rows(model: nn.Module, tokens: torch.Tensor) -> str:
    """Where the written-out attention's weights are not finite, or (where
    :func:`sums_to_one`) do not sum to 1 over the keys; ``last_weights`` are left as they were."""
    kept = [(block.attention, block.attention.last_weights) for block in model.blocks]
    try:
        with evaluating(model):
            maps = model.attention_maps(tokens)  # each (B, H, T, T)
    finally:
        for attention, weights in kept:
            attention.last_weights = weights
    for layer, (weights, block) in enumerate(zip(maps, model.blocks, strict=True)):
        sums = weights.float().sum(dim=-1)  # (B, H, T)
        normalised = sums_to_one(block.attention)
        bad = ~torch.isfinite(sums)
        if normalised:
            bad |= (sums - 1).abs() > WEIGHTS_TOLERANCE
        if bool(bad.any()):
            _, head, query = (int(i) for i in torch.nonzero(bad)[0])
            what, expected = (("probabilities", "1") if normalised
                              else ("weights", "a finite number"))
            return (f"layer {layer}, head {head}: query {query}'s attention {what} sum to "
                    f"{float(sums[0, head, query]):.3g}, not {expected}")
    return ""


@property_check
def query_sees_a_key(model: nn.Module, vocab_size: int, max_len: int,
                     seq_len: int = 16) -> PropertyResult:
    """Every query sees a key: in the additive mask and in the written-out attention."""
    name = "query_sees_a_key"
    lengths, first = _keyless_queries(model, max_len)
    bad_rows = _bad_probability_rows(model, random_tokens(vocab_size, 2, min(seq_len, max_len)))
    if lengths:
        head, query = first
        at = (f"every length from {lengths[0]} to {lengths[-1]}" if len(lengths) > 1
              else f"length {lengths[0]}")
        causal = " with the causal mask" if model.causal else ""
        return PropertyResult(name, False, float(len(lengths)), 0.0,
                              f"the positional encoding ({component(model.positional)})"
                              f"{causal} masks every key of query {query} (head {head}) at "
                              f"{at}: SDPA returns 0 for that query, the written-out softmax "
                              "NaN")
    return verdict(name, not bad_rows, float(bool(bad_rows)), 0.0,
                   f"every query sees a key at lengths 1 to {max_len}",
                   f"written-out attention: {bad_rows}")


@property_check
def attention_paths_agree(model: nn.Module, vocab_size: int, seq_len: int = 16) -> PropertyResult:
    """SDPA and the written-out attention (``need_weights=True``) give the same outputs."""
    name = "attention_paths_agree"
    tokens = random_tokens(vocab_size, 2, seq_len, seed=11)
    copied = amplified_copy(model).eval()
    with torch.no_grad():
        fused = copied(tokens).float()
        written = copied(tokens, need_weights=True).float()
    finite = torch.isfinite(fused).all(dim=-1) == torch.isfinite(written).all(dim=-1)
    change = relative_change(torch.nan_to_num(fused - written, nan=math.inf),
                             torch.nan_to_num(fused))  # (B, T)
    worst = float(change.max()) if bool(finite.all()) else math.inf
    if worst <= PATHS_TOLERANCE:
        return PropertyResult(name, True, worst, PATHS_TOLERANCE,
                              "SDPA and the written-out attention agree")
    b, t = (int(i) for i in torch.nonzero(change >= change.max())[0])
    return PropertyResult(name, False, worst, PATHS_TOLERANCE,
                          f"SDPA and the written-out attention (need_weights=True) disagree at "
                          f"position {t} (relative change {float(change[b, t]):.2g}; finite: "
                          f"{bool(torch.isfinite(fused[b, t]).all())} / "
                          f"{bool(torch.isfinite(written[b, t]).all())})")

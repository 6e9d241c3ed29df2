"""Step 1's ``cached_decoding``: decoding with a KV cache gives the logits of the full forward
(Megatron-LM #453, llama2.c #286, HF transformers #25104, PyTorch #108108; docs/detector.md)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    evaluating,
    property_check,
    random_tokens,
    relative_change,
)

RELATIVE_TOLERANCE = 1e-5  # a few fp32 roundings of reordered sums, times sqrt(their length)
CHUNK = 3  # tokens per step of the chunked decoding
FIRST_LAYER_NOTE = (" (first layer only: the logits depend on the sequence's length, and a "
                    "deeper layer's cached keys come from a shorter sequence)")
ADVICE = ("cached decoding (a KV cache) disagrees with the full forward: check how the PE "
          "uses `positions` after an offset")


def decoding_spans(max_len: int, step: int) -> list[tuple[int, int, bool]]:
    """``(start, end, compared)`` token spans covering ``0 .. max_len``, one forward each: the
    compared ones hold ``step`` tokens (the first 8, from ``p - 1`` and ``p`` for each power of
    two ``p >= 16``, the last), the others feed the tokens between them."""
    starts = list(range(0, min(8, max_len), step))
    power = 16
    while power <= max_len:
        starts += [power - 1, power]
        power *= 2
    starts.append(max(max_len - step, 0))
    spans: list[tuple[int, int, bool]] = []
    done = 0  # tokens in the cache
    for start in sorted({start for start in starts if start < max_len}):
        if start < done:  # already in a compared span
            continue
        if start > done:
            spans.append((done, start, False))  # the tokens in between, in one step
        done = min(start + step, max_len)
        spans.append((start, done, True))
    if done < max_len:
        spans.append((done, max_len, True))
    return spans


def _first_mismatch(model: nn.Module, tokens: torch.Tensor, step: int,
                    full: dict[int, torch.Tensor]) -> tuple[float, tuple[int, float, str] | None]:
    """Decode ``tokens`` (1, L) along ``decoding_spans(L, step)`` with a cache; compare each
    compared span with ``full[end]`` (end, V). Returns the worst relative difference and the
    first position past the tolerance: (position, its relative difference, how it was fed)."""
    worst, cache = 0.0, model.new_cache()
    label = "one token at a time" if step == 1 else f"{step} tokens at a time"
    for start, end, compared in decoding_spans(tokens.shape[1], step):
        cached = model(tokens[:, start:end], cache=cache).float()[0]  # (T_step, V)
        if not compared:
            continue
        reference = full[end][start:end]  # (T_step, V)
        delta = relative_change(cached - reference, reference)  # (T_step,)
        delta = torch.where(torch.isnan(delta), torch.inf, delta)
        worst = max(worst, float(delta.max()))
        over = torch.nonzero(delta > RELATIVE_TOLERANCE)
        if len(over):
            index = int(over[0])
            return worst, (start + index, float(delta[index]), label)
    return worst, None


def first_layer_only(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its first block only (embedding, block 0, final norm, head)."""
    copied = copy.deepcopy(model)
    copied.blocks = nn.ModuleList(list(copied.blocks)[:1])
    return copied


@property_check
def cached_decoding(model: nn.Module, vocab_size: int, max_len: int,
                    chunk: int = CHUNK) -> PropertyResult:
    """Decoders: decoding with a KV cache gives the logits of the full forward."""
    name = "cached_decoding"
    if not getattr(model, "causal", False):
        return PropertyResult(name, None, detail="encoder: no KV cache (every token attends "
                              "to later ones)")
    tokens = random_tokens(vocab_size, 1, max_len, seed=5)  # (1, L)
    steps = (1, chunk)
    ends = {end for step in steps for _, end, compared in decoding_spans(max_len, step)
            if compared}
    scope = ""
    with evaluating(model):
        # end -> logits (end, V) of the full forward over the first end tokens
        full = {end: model(tokens[:, :end]).float()[0] for end in sorted(ends)}
        longest = full[max_len]  # (L, V)
        if not bool(torch.isfinite(longest).all()):
            return PropertyResult(name, False, float("nan"), RELATIVE_TOLERANCE,
                                  f"non-finite logits in a forward of {max_len} tokens: "
                                  "not compared (see finite_at_max_len)")
        # a prefix's logits change when the sequence grows (RoPE scaling=dynamic)
        if len(model.blocks) > 1 and any(
                float(relative_change(logits - longest[:end], longest[:end]).max())
                > RELATIVE_TOLERANCE for end, logits in full.items()):
            model, scope = first_layer_only(model), FIRST_LAYER_NOTE
            full = {end: model(tokens[:, :end]).float()[0] for end in sorted(ends)}
        results = [_first_mismatch(model, tokens, step, full) for step in steps]
    worst = max(w for w, _ in results)
    mismatches = [m for _, m in results if m is not None]
    if not mismatches:
        return PropertyResult(name, True, worst, RELATIVE_TOLERANCE,
                              f"one token and {chunk} tokens at a time up to {max_len} tokens "
                              f"equal the full forward{scope}")
    position, relative, steps_taken = min(mismatches, key=lambda m: m[0])
    return PropertyResult(name, False, worst, RELATIVE_TOLERANCE,
                          f"position {position} ({steps_taken}) differs from the full "
                          f"forward by {relative:.2g} (relative){scope}; {ADVICE}")

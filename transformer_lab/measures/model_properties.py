"""Step 1's forward-pass properties of a built model, and :func:`model_properties`, which runs
every step-1 check in order (docs/detector.md lists them and how each is measured)."""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_lab.measures.attention_properties import attention_paths_agree, query_sees_a_key
from transformer_lab.measures.bf16_behaviour import bf16_behaviour
from transformer_lab.measures.cached_decoding import cached_decoding
from transformer_lab.measures.component_properties import (
    ffn_interaction,
    ffn_nonlinearity,
    norm_scale_control,
)
from transformer_lab.measures.output_properties import (
    device_placement,
    eval_determinism,
    ffn_gain,
    output_dtype,
)
from transformer_lab.measures.positions import position_distinguishability, position_max_len
from transformer_lab.measures.property_result import (
    PropertyResult,
    amplified_copy,
    eval_outputs,
    property_check,
    random_tokens,
    relative_change,
    train_mode_without_dropout,
    verdict,
)

RELATIVE_TOLERANCE = 1e-5  # float32 noise is ~1e-7 of an output's norm


@property_check
def causality(model: nn.Module, vocab_size: int, seq_len: int = 16) -> PropertyResult:
    """Decoders: ``logits[t]`` must not change when a token at ``s > t`` changes."""
    name = "causality"
    if not getattr(model, "causal", False):
        return PropertyResult(name, None, detail="encoder: bidirectional by design")
    base = random_tokens(vocab_size, 1, seq_len)  # (1, T)
    changed = base.repeat(seq_len, 1)  # (T, T): row s changes token s
    rows = torch.arange(seq_len)
    changed[rows, rows] = (changed[rows, rows] + 1) % vocab_size
    out = eval_outputs(amplified_copy(model), torch.cat([base, changed]))  # (1+T, T, V)
    # (S, T): the change at t when token s changed, where t < s
    delta = relative_change(out[1:] - out[:1], out[:1]).tril(-1)
    worst = float(delta.max())
    if worst <= RELATIVE_TOLERANCE:
        return PropertyResult(name, True, worst, RELATIVE_TOLERANCE, "no future leak")
    s, t = (int(i) for i in torch.nonzero(delta > RELATIVE_TOLERANCE)[0])  # first leak
    return PropertyResult(name, False, worst, RELATIVE_TOLERANCE,
                          f"output at position {t} changed when token {s} changed "
                          f"(relative change {float(delta[s, t]):.2g}): a future leak")


def _swap_pairs(max_len: int) -> list[int]:
    """Left positions ``i`` of the adjacent pairs (i, i + 1) to test: 0-4, then doubling, and
    the last pair (a PE that clamps past any index fails there)."""
    left, i = [0, 1, 2, 3], 4
    while i < max_len - 1:
        left += [i - 1, i]
        i *= 2
    return sorted({p for p in [*left, max_len - 2] if 0 <= p < max_len - 1})


def _swap_gap(model: nn.Module, vocab_size: int, i: int, length: int) -> float:
    """How far ``out'[i], out'[i + 1]`` (tokens i and i + 1 swapped) are from
    ``out[i + 1], out[i]``, relative to the outputs' norm: 0 if the two positions look alike."""
    base = random_tokens(vocab_size, 1, length, seed=1 + i)[0]  # (L,)
    if base[i] == base[i + 1]:
        base[i + 1] = (base[i] + 1) % vocab_size  # the swapped tokens differ
    swapped = base.clone()
    swapped[i], swapped[i + 1] = base[i + 1], base[i]
    out = eval_outputs(model, torch.stack([base, swapped]))  # (2, L, V)
    pairs = torch.stack([out[1, i] - out[0, i + 1], out[1, i + 1] - out[0, i]])  # (2, V)
    return float(relative_change(pairs, out[0]).min())


@property_check
def position_injectivity(model: nn.Module, vocab_size: int, max_len: int | None = None,
                         window: int = 6) -> PropertyResult:
    """Swapping the tokens at i and i + 1 (below ``max_len``) must not just swap the outputs."""
    name = "position_injectivity"
    max_len = max_len or position_max_len(model)
    if max_len < 2:
        return PropertyResult(name, None, detail=f"max_len={max_len}: one position")
    left = _swap_pairs(max_len)
    copied = amplified_copy(model)
    copied.causal = False
    gaps = [_swap_gap(copied, vocab_size, i, min(max_len, i + 2 + window)) for i in left]
    worst = min(gaps)
    if not all(math.isfinite(g) for g in gaps):
        return PropertyResult(name, False, math.nan, RELATIVE_TOLERANCE,
                              "non-finite outputs while swapping positions up to "
                              f"{max_len} (see finite_at_max_len)")
    if worst > RELATIVE_TOLERANCE:
        return PropertyResult(name, True, worst, RELATIVE_TOLERANCE,
                              f"{len(left)} pairs of positions up to {max_len} told apart")
    blind = [i for i, g in zip(left, gaps, strict=True) if g <= RELATIVE_TOLERANCE]
    return PropertyResult(name, False, worst, RELATIVE_TOLERANCE,
                          f"positions {blind[0]} and {blind[0] + 1} get the same representation "
                          f"(swapping their tokens swaps the outputs); {len(blind)} of "
                          f"{len(left)} tested pairs up to {max_len} are indistinguishable")


@property_check
def finite_at_max_len(model: nn.Module, vocab_size: int,
                      max_len: int | None = None) -> PropertyResult:
    """A forward at ``max_len`` is finite; else the shortest non-finite length, by bisection."""
    name = "finite_at_max_len"
    max_len = max_len or position_max_len(model)

    def finite(length: int) -> bool:
        return bool(torch.isfinite(eval_outputs(model, random_tokens(vocab_size, 2, length))).all())

    if finite(max_len):
        return PropertyResult(name, True, float(max_len), None, f"finite at {max_len} tokens")
    low, high = 1, max_len  # finite(low) is assumed, finite(high) is False
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if finite(middle) else (low, middle)
    return PropertyResult(name, False, float(high), float(max_len),
                          f"inf/NaN in the output from sequence length {high} on "
                          f"(position {high - 1}); finite up to {high - 1} tokens")


@property_check
def batch_independence(model: nn.Module, vocab_size: int, seq_len: int = 16,
                       batch: int = 4) -> PropertyResult:
    """In eval mode sequence 0's output must not depend on the other sequences of the batch."""
    tokens = random_tokens(vocab_size, batch, seq_len, seed=2)  # (B, T)
    others = tokens.clone()
    others[1:] = random_tokens(vocab_size, batch - 1, seq_len, seed=3)
    copied = amplified_copy(model)
    full, alone, other = (eval_outputs(copied, t)[0] for t in (tokens, tokens[:1], others))
    worst = float(torch.maximum(relative_change(full - alone, full),
                                relative_change(full - other, full)).max())  # (T,) -> ()
    return verdict("batch_independence", worst <= RELATIVE_TOLERANCE, worst, RELATIVE_TOLERANCE,
                   "independent", f"sequence 0's output changed by {worst:.2g} (relative) when "
                   "the other sequences of its batch changed")


@property_check
def train_eval_agreement(model: nn.Module, vocab_size: int, seq_len: int = 16) -> PropertyResult:
    """With dropout off, ``model.train()`` and ``model.eval()`` give the same outputs."""
    tokens = random_tokens(vocab_size, 2, seq_len, seed=4)
    copied = amplified_copy(model)
    evaluated = eval_outputs(copied, tokens)
    with train_mode_without_dropout(copied) as exempt, torch.no_grad():
        trained = copied(tokens).float()
    worst = float(relative_change(trained - evaluated, evaluated).max())
    note = f"; {', '.join(exempt)} exempt (BatchNorm)" if exempt else ""
    return verdict("train_eval_agreement", worst <= RELATIVE_TOLERANCE, worst,
                   RELATIVE_TOLERANCE, "agree" + note, f"train-mode outputs differ from eval-mode "
                   f"ones by {worst:.2g} (relative) with dropout off{note}")


def model_properties(model: nn.Module, vocab_size: int, max_len: int | None = None,
                     precision: str = "fp32") -> list[PropertyResult]:
    """Every step-1 property of ``model``, in order (its weights, modes and torch's random state
    are left as they were). ``max_len``: how far positions are checked (default: the PE's own,
    else :data:`~.positions.DEFAULT_MAX_LEN`; one given bounds every check); ``precision``: the
    run's ``train.precision``."""
    given = max_len is not None
    max_len = max_len or position_max_len(model)
    return [
        output_dtype(model, vocab_size),
        device_placement(model, vocab_size),
        eval_determinism(model, vocab_size),  # before the invariances a random output breaks
        norm_scale_control(model),
        ffn_nonlinearity(model),
        ffn_interaction(model),
        query_sees_a_key(model, vocab_size, max_len),
        attention_paths_agree(model, vocab_size),
        causality(model, vocab_size),
        finite_at_max_len(model, vocab_size, max_len),  # before injectivity: it names an inf
        position_injectivity(model, vocab_size, max_len),
        cached_decoding(amplified_copy(model), vocab_size, max_len),
        position_distinguishability(model, max_len),
        bf16_behaviour(model, vocab_size, max_len, precision, given),
        batch_independence(model, vocab_size),
        train_eval_agreement(model, vocab_size),
        ffn_gain(model, vocab_size),
    ]

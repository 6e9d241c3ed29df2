"""Properties of one component measured on its own, outside the model (step 1):

    norm_scale_control  a norm layer's output RMS does not grow with its input's RMS
    ffn_nonlinearity    an FFN has a nonlinearity between its two linear maps
    ffn_interaction     an FFN's input features interact (it is not a sum of one-variable
                        functions of its inputs)

Each returns a :class:`PropertyResult` naming the component's class, and never raises.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    amplified_copy,
    component,
    failed,
    train_mode_without_dropout,
    verdict,
)

INPUT_SCALES = (1e-2, 1e-1, 1.0, 1e1, 1e2)  # input RMS values a norm layer is fed
SCALE_EXPONENT_LIMIT = 0.5
# Over one decade of input RMS a norm's output RMS changes like input^e. A normaliser (LayerNorm,
# RMSNorm, BatchNorm, ScaleNorm) has e = 0, DyT's tanh saturates to 0 past unit scale; the bugs
# have |e| >= 1: a norm that multiplies by the RMS grows like input^2, one that divides by the
# variance instead of the standard deviation like input^-1. 0.5 is halfway, in log scale.
NONLINEARITY_TOLERANCE = 1e-4
# sigma2 / sigma1 of a stack of Jacobian rows that only rescale is float32 rounding: a sum of n
# terms rounds at ~sqrt(n) * 6e-8, below 1e-4 for any width under 10^6; correct FFNs are at >= 0.5.
JACOBIAN_INPUTS = 8  # inputs at which an FFN's Jacobian is taken
JACOBIAN_ROWS = 16  # output coordinates whose Jacobian rows are compared (at most)
INTERACTION_TOLERANCE = 1e-4
# A mixed second difference of a sum of one-variable functions cancels exactly but for float32
# rounding of the four outputs (~1e-7 of their size); correct FFNs are at >= 1e-2 (the test of
# every built-in gives each one's value).
INTERACTION_PAIRS = 16  # (x, i, j) probes of the mixed second difference


def norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """One ``(name, module)`` per norm-layer class of the model: the blocks' ``norm*``
    sublayers, ``final_norm`` and ``embed_norm`` (not ``nn.Identity``)."""
    found: dict[type, tuple[str, nn.Module]] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if (leaf.startswith("norm") or leaf in ("final_norm", "embed_norm")) \
                and not isinstance(module, nn.Identity):
            found.setdefault(type(module), (name, module))
    return list(found.values())


def output_rms(norm: nn.Module, d_model: int) -> list[float]:
    """The RMS of ``norm``'s output for inputs of RMS :data:`INPUT_SCALES` (the same Gaussian
    batch (4, 8, D) scaled), on a copy in train mode (BatchNorm uses the batch's statistics)."""
    copied = copy.deepcopy(norm).train()
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(4, 8, d_model, generator=generator)  # (B, T, D), RMS ~1
    dtype = next((p.dtype for p in copied.parameters()), torch.float32)
    with torch.no_grad():
        return [float(copied((scale * x).to(dtype)).float().pow(2).mean().sqrt())
                for scale in INPUT_SCALES]


def _exponent(out_big: float, out_small: float, decades: float = 1.0) -> float:
    """e in out_big / out_small = 10^(e * decades); 0 where both are 0."""
    big, small = max(out_big, 1e-30), max(out_small, 1e-30)
    return math.log10(big / small) / decades


def norm_scale_control(model: nn.Module) -> PropertyResult:
    """A norm layer bounds the scale of its output: over input RMS 1e-2 ... 1e2
    (:data:`INPUT_SCALES`) its output RMS neither grows past unit scale (the top decade, like
    ``input^e`` with ``e`` > 0.5) nor grows as the input shrinks (any decade, ``e`` < -0.5):
    :data:`SCALE_EXPONENT_LIMIT`. An RMSNorm that multiplies by the RMS instead of dividing
    (llm-foundry) grows like input^2; a LayerNorm using the squared variance like input^-1 below
    unit scale. DyT (``g * tanh(a x)``) passes: it grows at small inputs and saturates.
    """
    name = "norm_scale_control"
    layers = norm_layers(model)
    if not layers:
        return PropertyResult(name, None, detail="no norm layer")
    d_model = model.token_embedding.weight.shape[1]
    worst: tuple[float, str] = (-math.inf, "")
    for layer_name, norm in layers:
        label = f"the norm layer {layer_name} ({component(norm)})"
        try:
            out = output_rms(norm, d_model)
        except Exception as exc:
            return failed(name, exc)
        if not all(math.isfinite(v) for v in out):
            return PropertyResult(name, False, math.inf, SCALE_EXPONENT_LIMIT,
                                  f"{label} returns inf/NaN for inputs of RMS "
                                  f"{', '.join(f'{s:g}' for s in INPUT_SCALES)}")
        table = ", ".join(f"{o:.3g} at {s:g}" for s, o in zip(INPUT_SCALES, out, strict=True))
        growth = _exponent(out[-1], out[-2])
        shrink = max((-_exponent(big, small), small_scale) for small_scale, small, big
                     in zip(INPUT_SCALES, out, out[1:], strict=False))
        if growth > worst[0]:
            worst = (growth, f"{label}: output RMS {table} (input RMS): it grows like "
                             f"input^{growth:.2g} past unit scale; a norm bounds its output "
                             "(multiplied by the RMS instead of dividing?)")
        if shrink[0] > worst[0]:
            worst = (shrink[0], f"{label}: output RMS {table} (input RMS): it grows as the "
                                f"input shrinks from {shrink[1] * 10:g} to {shrink[1]:g} (like "
                                f"input^-{shrink[0]:.2g}); divided by the variance instead of "
                                "the standard deviation?")
    exponent, detail = worst
    labels = ", ".join(component(norm) for _, norm in layers)
    return verdict(name, exponent <= SCALE_EXPONENT_LIMIT, exponent, SCALE_EXPONENT_LIMIT,
                   f"{labels}: output RMS bounded for input RMS {INPUT_SCALES[0]:g} to "
                   f"{INPUT_SCALES[-1]:g}", detail)


def jacobian_rows(ffn: nn.Module, d_model: int) -> torch.Tensor:
    """Rows of the FFN's Jacobian at :data:`JACOBIAN_INPUTS` Gaussian inputs (each its own
    one-token sequence): ``J[i, k] = d ffn(x_k)[i] / d x_k`` for the first
    :data:`JACOBIAN_ROWS` output coordinates i: (rows, K, D)."""
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(JACOBIAN_INPUTS, 1, d_model, generator=generator).requires_grad_(True)
    y = ffn(x)  # (K, 1, D)
    rows = []
    for i in range(min(d_model, JACOBIAN_ROWS)):
        (grad,) = torch.autograd.grad(y[:, 0, i].sum(), x, retain_graph=True, allow_unused=True)
        rows.append(torch.zeros_like(x[:, 0]) if grad is None else grad[:, 0])  # (K, D)
    return torch.stack(rows)  # (rows, K, D)


def first_ffn(model: nn.Module, name: str) -> nn.Module | PropertyResult:
    """Block 0's FFN, or the SKIP row of property ``name`` when there is none or its class
    declares ``is_linear = True``."""
    blocks = getattr(model, "blocks", [])
    if not len(blocks) or not hasattr(blocks[0], "feedforward"):
        return PropertyResult(name, None, detail="no FFN")
    ffn = blocks[0].feedforward
    if getattr(type(ffn), "is_linear", False):
        return PropertyResult(name, None, detail=f"{component(ffn)} declares is_linear = True")
    return ffn


def ffn_nonlinearity(model: nn.Module) -> PropertyResult:
    """The FFN has a nonlinearity between its linear maps, unless its class declares
    ``is_linear = True``.

    An elementwise function of one linear map, ``act(W2 W1 x)`` (the activation applied after
    the down-projection), or no activation at all, has the Jacobian ``diag(s(x)) A``: across
    inputs each of its rows only rescales. A correct FFN's rows ``sum_h W2[i, h] act'(h) W1[h]``
    turn with the input. So, per output coordinate, the rows at several inputs are stacked and
    their second singular value over the first measures how far they turn; the FFN passes if
    some row turns by more than float32 rounding (:data:`NONLINEARITY_TOLERANCE`). Measured on
    block 0's FFN, with weights at std 0.3 (:func:`amplified_copy`: at std 0.02 a GELU is
    nearly linear around 0), in train mode without dropout.
    """
    name = "ffn_nonlinearity"
    ffn = first_ffn(model, name)
    if isinstance(ffn, PropertyResult):
        return ffn
    label = f"the FFN ({component(ffn)}) of block 0"
    try:
        copied = amplified_copy(ffn)
        with train_mode_without_dropout(copied):
            rows = jacobian_rows(copied, model.token_embedding.weight.shape[1]).double()
    except Exception as exc:
        return failed(name, exc)
    singular = torch.linalg.svdvals(rows)  # (rows, min(K, D))
    informative = singular[:, 0] > 1e-30
    if not bool(informative.any()):
        return PropertyResult(name, False, 0.0, NONLINEARITY_TOLERANCE,
                              f"{label}: its output does not depend on its input")
    turn = float((singular[informative, 1] / singular[informative, 0]).max())
    return verdict(name, turn > NONLINEARITY_TOLERANCE, turn, NONLINEARITY_TOLERANCE,
                   f"{label}: its Jacobian turns with the input (sigma2/sigma1 up to {turn:.2g})",
                   f"{label} has no hidden nonlinearity: at {JACOBIAN_INPUTS} inputs "
                   f"each row of its Jacobian only rescales (sigma2/sigma1 {turn:.2g}): "
                   "one linear map then an elementwise function (the activation after "
                   "the down-projection?) or no activation; a linear FFN by design "
                   "declares is_linear = True")


def mixed_differences(ffn: nn.Module, d_model: int, step: float = 1.0) -> torch.Tensor:
    """``|f(x + a e_i + a e_j) - f(x + a e_i) - f(x + a e_j) + f(x)|`` over the largest first
    difference ``|f(x + a e_i) - f(x)|`` of the same probe, for :data:`INTERACTION_PAIRS`
    Gaussian inputs x (each its own one-token sequence), distinct coordinates i != j and
    ``a = step``: (pairs,). Zero (to rounding) when ``f`` is a sum of one-variable functions."""
    generator = torch.Generator().manual_seed(13)
    x = torch.randn(INTERACTION_PAIRS, d_model, generator=generator)  # (P, D)
    i = torch.randint(0, d_model, (INTERACTION_PAIRS,), generator=generator)  # (P,)
    j = (i + torch.randint(1, d_model, (INTERACTION_PAIRS,), generator=generator)) % d_model
    e_i = torch.nn.functional.one_hot(i, d_model).float() * step  # (P, D)
    e_j = torch.nn.functional.one_hot(j, d_model).float() * step
    corners = torch.stack([x, x + e_i, x + e_j, x + e_i + e_j], dim=1)  # (P, 4, D)
    dtype = next((p.dtype for p in ffn.parameters()), torch.float32)
    out = ffn(corners.reshape(-1, 1, d_model).to(dtype)).float().reshape(
        INTERACTION_PAIRS, 4, -1).double()  # (P, 4, D)
    mixed = (out[:, 3] - out[:, 1] - out[:, 2] + out[:, 0]).norm(dim=-1)  # (P,)
    first = torch.maximum((out[:, 1] - out[:, 0]).norm(dim=-1),
                          (out[:, 2] - out[:, 0]).norm(dim=-1))  # (P,)
    return mixed / first.clamp_min(1e-30)


def ffn_interaction(model: nn.Module) -> PropertyResult:
    """The FFN's input features interact: some mixed second difference along two input
    coordinates (:func:`mixed_differences`) is above float32 rounding
    (:data:`INTERACTION_TOLERANCE`), unless its class declares ``is_linear = True``.

    An FFN whose output is a sum of one-variable functions of its inputs, ``sum_k g_k(x_k)``
    (the activation applied to the input before the up-projection, ``W2 W1 act(x)``, or an
    elementwise nonlinearity with no mixing in front of it), passes ``ffn_nonlinearity`` (its
    Jacobian turns with the input) but cannot compute any function of two features together:
    every mixed difference is 0. Measured on block 0's FFN like ``ffn_nonlinearity``."""
    name = "ffn_interaction"
    ffn = first_ffn(model, name)
    if isinstance(ffn, PropertyResult):
        return ffn
    label = f"the FFN ({component(ffn)}) of block 0"
    d_model = model.token_embedding.weight.shape[1]
    if d_model < 2:
        return PropertyResult(name, None, detail="d_model 1: one input feature")
    try:
        copied = amplified_copy(ffn)
        with train_mode_without_dropout(copied), torch.no_grad():
            ratios = mixed_differences(copied, d_model)
    except Exception as exc:
        return failed(name, exc)
    largest = float(ratios.max())
    if not math.isfinite(largest):  # some ratio is inf or NaN
        return PropertyResult(name, False, math.nan, INTERACTION_TOLERANCE,
                              f"{label} returns inf/NaN for Gaussian inputs")
    return verdict(name, largest > INTERACTION_TOLERANCE, largest, INTERACTION_TOLERANCE,
                   f"{label}: its input features interact (mixed second difference up to "
                   f"{largest:.2g} of a first difference)",
                   f"{label} is a sum of one-variable functions of its inputs: at "
                   f"{INTERACTION_PAIRS} pairs of input features the mixed second difference is "
                   f"{largest:.2g} of a first difference (rounding): no two features interact "
                   "(the activation before the up-projection?)")

"""Step 1's properties of one component on its own: ``norm_scale_control``,
``ffn_nonlinearity``, ``ffn_interaction`` (docs/detector.md)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    amplified_copy,
    component,
    property_check,
    train_mode_without_dropout,
    verdict,
)

INPUT_SCALES = (1e-2, 1e-1, 1.0, 1e1, 1e2)  # input RMS values a norm layer is fed
SCALE_EXPONENT_LIMIT = 0.5  # output RMS ~ input^e: normalisers e = 0, the bugs |e| >= 1
NONLINEARITY_TOLERANCE = 1e-4  # sigma2/sigma1 of rows that only rescale: ~sqrt(n) * 6e-8
JACOBIAN_INPUTS = 8  # inputs at which an FFN's Jacobian is taken
JACOBIAN_ROWS = 16  # output coordinates whose Jacobian rows are compared (at most)
INTERACTION_TOLERANCE = 1e-4  # a sum of one-variable functions: fp32 rounding of four outputs
INTERACTION_PAIRS = 16  # (x, i, j) probes of the mixed second difference


def norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """One ``(name, module)`` per norm-layer class: the blocks' ``norm*`` sublayers,
    ``final_norm`` and ``embed_norm`` (not ``nn.Identity``)."""
    found: dict[type, tuple[str, nn.Module]] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if (leaf.startswith("norm") or leaf in ("final_norm", "embed_norm")) \
                and not isinstance(module, nn.Identity):
            found.setdefault(type(module), (name, module))
    return list(found.values())


def output_rms(norm: nn.Module, d_model: int) -> list[float]:
    """The RMS of ``norm``'s output for one Gaussian batch (4, 8, D) scaled to each RMS of
    :data:`INPUT_SCALES`, on a copy in train mode (BatchNorm uses the batch's statistics)."""
    copied = copy.deepcopy(norm).train()
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(4, 8, d_model, generator=generator)  # (B, T, D), RMS ~1
    dtype = next((p.dtype for p in copied.parameters()), torch.float32)
    with torch.no_grad():
        return [float(copied((scale * x).to(dtype)).float().pow(2).mean().sqrt())
                for scale in INPUT_SCALES]


def _exponent(out_big: float, out_small: float) -> float:
    """e in out_big / out_small = 10^e; 0 where both are 0."""
    return math.log10(max(out_big, 1e-30) / max(out_small, 1e-30))


@property_check
def norm_scale_control(model: nn.Module) -> PropertyResult:
    """Each norm layer bounds its output RMS over the input RMS of :data:`INPUT_SCALES`."""
    name = "norm_scale_control"
    layers = norm_layers(model)
    if not layers:
        return PropertyResult(name, None, detail="no norm layer")
    exponents: list[tuple[float, str]] = []  # (exponent, what it means), per layer and kind
    for layer_name, norm in layers:
        label = f"the norm layer {layer_name} ({component(norm)})"
        out = output_rms(norm, model.token_embedding.weight.shape[1])
        if not all(math.isfinite(v) for v in out):
            return PropertyResult(name, False, math.inf, SCALE_EXPONENT_LIMIT,
                                  f"{label} returns inf/NaN for inputs of RMS "
                                  f"{', '.join(f'{s:g}' for s in INPUT_SCALES)}")
        table = ", ".join(f"{o:.3g} at {s:g}" for s, o in zip(INPUT_SCALES, out, strict=True))
        growth = _exponent(out[-1], out[-2])
        shrink, small = max((-_exponent(big, small), small_scale) for small_scale, small, big
                            in zip(INPUT_SCALES, out, out[1:], strict=False))
        exponents += [(growth, f"{label}: output RMS {table} (input RMS): it grows like "
                               f"input^{growth:.2g} past unit scale; a norm bounds its output "
                               "(multiplied by the RMS instead of dividing?)"),
                      (shrink, f"{label}: output RMS {table} (input RMS): it grows as the "
                               f"input shrinks from {small * 10:g} to {small:g} (like "
                               f"input^-{shrink:.2g}); divided by the variance instead of "
                               "the standard deviation?")]
    exponent, detail = max(exponents, key=lambda pair: pair[0])  # the first of the largest
    labels = ", ".join(component(norm) for _, norm in layers)
    return verdict(name, exponent <= SCALE_EXPONENT_LIMIT, exponent, SCALE_EXPONENT_LIMIT,
                   f"{labels}: output RMS bounded for input RMS {INPUT_SCALES[0]:g} to "
                   f"{INPUT_SCALES[-1]:g}", detail)


def jacobian_rows(ffn: nn.Module, d_model: int) -> torch.Tensor:
    """``J[i, k] = d ffn(x_k)[i] / d x_k`` at :data:`JACOBIAN_INPUTS` Gaussian one-token inputs
    for the first :data:`JACOBIAN_ROWS` output coordinates i: (rows, K, D)."""
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(JACOBIAN_INPUTS, 1, d_model, generator=generator).requires_grad_(True)
    y = ffn(x)  # (K, 1, D)
    rows = []
    for i in range(min(d_model, JACOBIAN_ROWS)):
        (grad,) = torch.autograd.grad(y[:, 0, i].sum(), x, retain_graph=True, allow_unused=True)
        rows.append(torch.zeros_like(x[:, 0]) if grad is None else grad[:, 0])  # (K, D)
    return torch.stack(rows)  # (rows, K, D)


def _ffn_of_block_0(model: nn.Module, name: str) -> tuple[nn.Module, str] | PropertyResult:
    """An :func:`amplified_copy` of block 0's FFN and how messages name it, or the SKIP row of
    property ``name`` when there is none or its class declares ``is_linear = True``."""
    blocks = getattr(model, "blocks", [])
    if not len(blocks) or not hasattr(blocks[0], "feedforward"):
        return PropertyResult(name, None, detail="no FFN")
    ffn = blocks[0].feedforward
    if getattr(type(ffn), "is_linear", False):
        return PropertyResult(name, None, detail=f"{component(ffn)} declares is_linear = True")
    return amplified_copy(ffn), f"the FFN ({component(ffn)}) of block 0"


@property_check
def ffn_nonlinearity(model: nn.Module) -> PropertyResult:
    """Block 0's FFN has a nonlinearity between its linear maps (its Jacobian turns)."""
    name = "ffn_nonlinearity"
    found = _ffn_of_block_0(model, name)
    if isinstance(found, PropertyResult):
        return found
    ffn, label = found
    with train_mode_without_dropout(ffn):
        rows = jacobian_rows(ffn, model.token_embedding.weight.shape[1]).double()
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
    """``|f(x + a e_i + a e_j) - f(x + a e_i) - f(x + a e_j) + f(x)|`` over the larger first
    difference, for :data:`INTERACTION_PAIRS` Gaussian inputs x, ``i != j``, ``a = step``:
    (pairs,). Zero (to rounding) for a sum of one-variable functions."""
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


@property_check
def ffn_interaction(model: nn.Module) -> PropertyResult:
    """Block 0's FFN's input features interact (a :func:`mixed_differences` ratio > 0)."""
    name = "ffn_interaction"
    d_model = model.token_embedding.weight.shape[1]
    found = _ffn_of_block_0(model, name)
    if isinstance(found, PropertyResult):
        return found
    if d_model < 2:
        return PropertyResult(name, None, detail="d_model 1: one input feature")
    ffn, label = found
    with train_mode_without_dropout(ffn), torch.no_grad():
        largest = float(mixed_differences(ffn, d_model).max())
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

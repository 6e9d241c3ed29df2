"""Step 1's ``bf16_behaviour``: where the run or the PE uses half precision, positions stay
distinct up to ``max_len`` and the loss finite (gpt-neox #1016, modded-nanogpt #39;
docs/detector.md)."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_lab.measures.positions import position_representations, same_pairs
from transformer_lab.measures.property_result import (
    PropertyResult,
    called_from,
    component,
    evaluating,
    flat_tensors,
    property_check,
    random_tokens,
    relative_change,
)

HALF = (torch.bfloat16, torch.float16)
FLOAT32_TOLERANCE = 1e-5  # a float32 computation and its float32 twin differ by rounding only
BF16_TOLERANCE = 2.0 ** -7  # 4 x one bf16 rounding of the output (2^-9 relative)
BF16_LENGTH = 512  # bf16 spaces integers 2 apart from 256 on: look past it where the PE can


class HalfPrecisionAudit(TorchFunctionMode):
    """Records, in ``ops``, each op whose result is bfloat16 or float16: what, shape, where."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        half = next((v for v in flat_tensors(result) if v.dtype in HALF), None)
        if half is not None and len(self.ops) < 8:
            where = called_from(inspect.currentframe())
            self.ops.append(f"{getattr(func, '__name__', str(func))} -> {half.dtype} "
                            f"{tuple(half.shape)}{f' at {where}' if where else ''}")
        return result


class KeepFloat32(TorchFunctionMode):
    """Every cast to bfloat16/float16 (``.to``, ``.type``, ``.bfloat16()``, ``.half()``,
    ``type_as`` a half tensor, a factory's ``dtype=``) gives float32 instead."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("bfloat16", "half") or (name == "type_as" and args[1].dtype in HALF):
            return args[0].float()

        def float32(value: Any) -> Any:
            return torch.float32 if isinstance(value, torch.dtype) and value in HALF else value

        return func(*(float32(a) for a in args), **{k: float32(v) for k, v in kwargs.items()})


@property_check
def bf16_behaviour(model: nn.Module, vocab_size: int, max_len: int,
                   precision: str = "fp32", given: bool = False) -> PropertyResult:
    """Where half precision is used, positions stay distinct and the loss finite."""
    name = "bf16_behaviour"
    bf16_run = precision == "bf16"
    if not given and not getattr(model.positional, "max_len", None):
        max_len = max(max_len, BF16_LENGTH)
    pe = f"the positional encoding ({component(model.positional)})"
    with HalfPrecisionAudit() as audit:
        position_representations(model, max_len)
    if not bf16_run and not audit.ops:
        return PropertyResult(name, None, detail="float32 run; the PE computes in float32")
    allowed = BF16_TOLERANCE if bf16_run else FLOAT32_TOLERANCE
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16_run):
        rows = position_representations(model, max_len,
                                        torch.bfloat16 if bf16_run else torch.float32)
    with KeepFloat32():
        twin_rows = position_representations(copy.deepcopy(model), max_len)
    tokens, targets = (random_tokens(vocab_size, 2, max_len, seed=seed) for seed in (12, 13))
    with evaluating(model), torch.autocast("cpu", torch.bfloat16, enabled=bf16_run):
        logits = model(tokens)  # (B, T, V)
        loss = float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()))
    if rows is None:  # kind none: only the run's precision applies
        rows = twin_rows = torch.zeros(1, 1)
    how = "under bf16 autocast" if bf16_run else "in a float32 run"
    merged = sorted(set(same_pairs(rows)) - set(same_pairs(twin_rows)))
    deviations = relative_change(rows - twin_rows, twin_rows)  # (L,)
    deviation = float(deviations.max())
    if merged:
        p, q = merged[0]
        return PropertyResult(name, False, deviation, allowed,
                              f"{pe} gives positions {p} and {q} the same representation "
                              f"{how}, distinct in float32 ({len(merged)} such pairs below "
                              f"{max_len}): bf16 holds integers exactly only up to 256; compute "
                              "positions and angles in float32 (gpt-neox #1016)")
    if not bf16_run:
        off = (f"; its output is {deviation:.2g} (relative) from float32"
               if deviation > allowed else "")
        return PropertyResult(name, False, deviation, allowed,
                              f"{pe} rounds to half precision in a float32 run ({audit.ops[0]})"
                              f"{off}: 8-bit angles and tables blur positions; keep them in "
                              "float32 (modded-nanogpt #39)")
    if not deviation <= allowed:
        return PropertyResult(name, False, deviation, allowed,
                              f"{pe} {how}: its output at position {int(deviations.argmax())} is "
                              f"{deviation:.2g} (relative) from the same computation in float32, "
                              f"more than one bf16 rounding ({allowed:.2g}): angles or tables "
                              "computed in bf16? keep them in float32 (gpt-neox #1003)")
    if not torch.isfinite(torch.tensor(loss)):
        return PropertyResult(name, False, loss, allowed,
                              f"the loss at {max_len} tokens is {loss} {how}")
    return PropertyResult(name, True, deviation, allowed,
                          f"{how}: positions distinct up to {max_len}, output within "
                          f"{allowed:.2g} of float32, loss finite ({loss:.3g})")

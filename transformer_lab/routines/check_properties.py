"""The property checks of ``tlab check`` as rows of ``checks.csv``: :class:`ComponentCheck`
(:data:`CHECK_TABLE_COLUMNS`), the tolerances, one function per property (its inputs built so
that a broken component can be passed in instead) and the terminal table. The measurements are
in :mod:`transformer_lab.measures.properties`; which checks a PE gets, and the routine, in
``check.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.table import Table

from transformer_lab.measures.properties import (
    permutation_error,
    rope_relative_violation,
    shift_positions,
    sinusoidal_shift_residual,
    swap_attention_error,
)
from transformer_lab.model import TransformerModel

CHECK_TABLE_COLUMNS = ["check", "component", "status", "value", "tolerance", "detail", "wall_s"]

# Tolerances. "exact" properties allow float32 rounding; "must break" properties need a
# difference far above it.
ROPE_TOLERANCE = 1e-4  # relative spread of q.k over shifts (fp32 angles up to ~100 rad)
MISMATCH_MINIMUM = 0.05  # a pairing mix-up must move the relative score at least this much
SHIFT_TOLERANCE = 1e-3  # relative residual of the fitted linear map on held-out positions
# ... or more for wide tables: float32 angle rounding grows with the largest position (measured
# 1.4e-7 per position at d 2048; this allows about 6x that).
SHIFT_ROUNDING_PER_POSITION = 2.0**-20
EQUIVARIANCE_TOLERANCE = 1e-5  # NoPE: relative output error, absolute attention error
BREAK_MINIMUM = 1e-4  # a PE must change outputs / attention more than this (10x the above)


@dataclass
class ComponentCheck:
    check: str
    component: str
    status: str  # PASS | FAIL
    value: float
    tolerance: str  # "<= x" (must be small) or "> x" (must be large)
    detail: str = ""
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def at_most(check: str, component: str, value: float, tolerance: float,
            detail: str = "") -> ComponentCheck:
    """A property that holds: PASS when ``value <= tolerance``."""
    return ComponentCheck(check, component, "PASS" if value <= tolerance else "FAIL", value,
                          f"<= {tolerance:g}", detail)


def more_than(check: str, component: str, value: float, minimum: float,
              detail: str = "") -> ComponentCheck:
    """A property that must break: PASS when ``value > minimum``."""
    return ComponentCheck(check, component, "PASS" if value > minimum else "FAIL", value,
                          f"> {minimum:g}", detail)


RotaryFactory = Callable[[float, str], torch.nn.Module]  # (base, style) -> rotary PE module


def module_rotate(rotary: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A rotary PE module as ``rotate(x, positions)`` (it rotates q and k alike)."""
    return lambda x, positions: rotary(x, x, positions)[0]


def rope_relative_rows(make_rotary: RotaryFactory, head_dim: int, bases: list[float],
                       component: str) -> list[ComponentCheck]:
    rows = []
    for style in ("half", "interleaved"):
        for base in bases:
            rotate = module_rotate(make_rotary(base, style))
            value = rope_relative_violation(rotate, rotate, head_dim)
            rows.append(at_most("rope_relative", f"{component} {style} base={base:g}",
                                value, ROPE_TOLERANCE,
                                "max spread of q.k/(|q||k|) over shifts 0,5,17,64 of (m,n) = "
                                "(2,5) [the source article: = (7,10)], (0,3), (10,4), (1,30)"))
    return rows


def pairing_mismatch_row(make_rotary: RotaryFactory, head_dim: int, base: float,
                         component: str) -> ComponentCheck:
    half = module_rotate(make_rotary(base, "half"))
    interleaved = module_rotate(make_rotary(base, "interleaved"))
    value = rope_relative_violation(half, interleaved, head_dim)
    detected = value > MISMATCH_MINIMUM
    detail = ("half on q, interleaved on k: q.k now depends on absolute position (mismatch "
              "detected)" if detected else "half on q, interleaved on k did NOT break the "
              "relative property: the detector cannot tell the pairings apart")
    return more_than("rope_pairing_mismatch", component, value, MISMATCH_MINIMUM, detail)


def sinusoidal_shift_row(table: Callable[[torch.Tensor], torch.Tensor],
                         component: str) -> ComponentCheck:
    value = sinusoidal_shift_residual(table)
    positions = shift_positions(table(torch.arange(1)).shape[-1])
    tolerance = max(SHIFT_TOLERANCE, SHIFT_ROUNDING_PER_POSITION * positions)
    return at_most("sinusoidal_shift", component, value, tolerance,
                   "PE(pos+k) = M_k PE(pos): M_k fitted by least squares on half of the "
                   "positions 0..max(255, 4d-1), residual on the other half (k = 1, 3, 10)")


def equivariance_row(model: TransformerModel, tokens: torch.Tensor, component: str,
                     expect_equivariant: bool) -> ComponentCheck:
    # a fixed random permutation (not a reversal, which a symmetric ALiBi bias cannot see)
    permutation = torch.randperm(tokens.shape[1], generator=torch.Generator().manual_seed(1))
    value = permutation_error(model, tokens, permutation)
    text = f"max |f(Px) - P f(x)| / max |f(x)|, P = {permutation.tolist()}"
    if expect_equivariant:
        return at_most("permutation_equivariant", component, value, EQUIVARIANCE_TOLERANCE, text)
    return more_than("pe_breaks_permutation", component, value, BREAK_MINIMUM, text)


def swap_row(model: TransformerModel, tokens: torch.Tensor, component: str,
             expect_permuted: bool, i: int = 0, j: int = 2) -> ComponentCheck:
    differing = (tokens[0] != tokens[0, i]).nonzero().flatten().tolist()
    if tokens[0, i] == tokens[0, j] and differing:
        j = differing[0]  # swapping two equal tokens would change nothing
    attention, output = swap_attention_error(model, tokens, i, j)
    detail = (f"swap tokens {i} and {j}: max |A' - P A P| over layers and heads; outputs "
              f"differ from permuted outputs by {output:.3g}")
    if expect_permuted:
        return at_most("swap_attention", component, attention, EQUIVARIANCE_TOLERANCE,
                       detail + " (NoPE: rows and columns just permute)")
    return more_than("swap_attention", component, attention, BREAK_MINIMUM,
                     detail + " (a PE: attention is not just permuted)")


def component_check_table(rows: list[ComponentCheck], title: str) -> Table:
    table = Table(title=title)
    for column in ("check", "component", "status", "value", "tolerance"):
        table.add_column(column, overflow="fold")
    colours = {"PASS": "green", "FAIL": "bold red"}
    for row in rows:
        table.add_row(row.check, row.component, f"[{colours[row.status]}]{row.status}[/]",
                      f"{row.value:.3g}", row.tolerance)
    return table

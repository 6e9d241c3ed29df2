"""Learned absolute positional embeddings (BERT / GPT-2 style)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .sinusoidal import sinusoidal_table


class LearnedPositionalEncoding(nn.Module):
    """A learned ``(max_len, d_model)`` table added to the token embeddings (``kind = "additive"``;
    BERT, Devlin et al. 2018, arXiv:1810.04805; GPT-2). ``init="sinusoidal"`` starts from Vaswani's
    table; ``interpolate=True`` resamples the table linearly past ``max_len``.
    Shapes: positions ``(T,)`` long -> ``(T, d_model)``."""

    kind = "additive"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    expected_reversal: dict[str, str] = {"encoder": "solves", "decoder": "solves"}

    @classmethod
    def count_parameters(cls, d_model: int, max_len: int) -> int:
        """The ``(max_len, d_model)`` table."""
        return max_len * d_model

    @classmethod
    def property_checks(cls, init: str = "normal") -> tuple[str, ...]:
        """``tlab check``'s checks; a sinusoidal start also gets the shift property."""
        return ("sinusoidal_shift", "permutation") if init == "sinusoidal" else ("permutation",)

    def __init__(self, d_model: int, max_len: int, init: str = "normal",
                 interpolate: bool = False) -> None:
        super().__init__()
        if init not in ("normal", "sinusoidal"):
            raise ValueError(f"init={init!r} is not valid; choose 'normal' or 'sinusoidal'")
        if max_len < 2 and interpolate:
            raise ValueError(f"max_len={max_len} is not valid with interpolate=True; use >= 2")
        if max_len < 1:
            raise ValueError(f"max_len={max_len} is not valid; it must be >= 1")
        if d_model < 1:
            raise ValueError(f"d_model={d_model} is not valid; it must be >= 1")
        self.d_model, self.max_len = d_model, max_len
        self.init, self.interpolate = init, interpolate
        self.weight = nn.Parameter(torch.empty(max_len, d_model))  # (max_len, d_model)
        with torch.no_grad():
            if init == "normal":
                nn.init.normal_(self.weight, mean=0.0, std=0.02)
            else:
                self.weight.copy_(sinusoidal_table(max_len, d_model))

    @property
    def context_window(self) -> int | None:
        """The most positions it encodes: ``max_len``; None (no limit) with ``interpolate``."""
        return None if self.interpolate else self.max_len

    def table(self, length: int) -> torch.Tensor:
        """The table for ``length`` positions, ``(length, d_model)``: stored rows, or interpolated
        past ``max_len`` (``interpolate=True``)."""
        if length <= self.max_len:
            return self.weight[:length]  # (length, d)
        if not self.interpolate:
            raise ValueError(
                f"sequence length {length} is longer than the learned position table "
                f"(max_len={self.max_len}); use sequences of at most {self.max_len} tokens, "
                f"a larger max_len, or interpolate=True"
            )
        table = self.weight.t()[None]  # (1, d, max_len)
        table = F.interpolate(table, size=length, mode="linear", align_corners=True)
        return table[0].t()  # (length, d)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (T,) -> (T, d_model). Without ``interpolate`` only T is checked, not the
        values (the model's positions are ``arange(offset, offset + T)``, and the model checks
        ``offset + T`` against ``context_window``); ``interpolate`` resamples the table to
        ``max(positions) + 1`` rows."""
        if not self.interpolate:
            self.table(positions.shape[-1])  # the length error past max_len
            return F.embedding(positions, self.weight)  # (T, d_model); an index error past it
        if positions.numel() == 0:
            return self.weight[:0]  # (0, d)
        if int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
        return self.table(int(positions.max()) + 1)[positions]  # (T, d_model)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, max_len={self.max_len}, init={self.init!r}, "
                f"interpolate={self.interpolate}")

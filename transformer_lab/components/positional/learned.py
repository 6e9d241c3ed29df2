"""Learned absolute positional embeddings (BERT / GPT-2 style)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .sinusoidal import sinusoidal_table

LEARNED_INITS: tuple[str, ...] = ("normal", "sinusoidal")


class LearnedPositionalEncoding(nn.Module):
    """A learned table ``P[pos]`` added to the token embeddings (``kind = "additive"``).

    ``x_pos = emb(token) + P[pos]`` with ``P`` a trainable ``(max_len, d_model)`` matrix, as in
    BERT (Devlin et al., 2018, arXiv:1810.04805) and GPT-2. ``init="normal"`` draws
    ``P ~ N(0, 0.02^2)`` (BERT); ``init="sinusoidal"`` starts from the fixed table of Vaswani et
    al. (2017, arXiv:1706.03762) and then learns it (the ``sinusoidal_learned`` choice).

    A table knows only ``max_len`` positions: asking for position ``>= max_len`` is a
    ``ValueError`` unless ``interpolate=True``, in which case the table is linearly resampled
    along the position axis (``F.interpolate(..., mode="linear", align_corners=True)``) to the
    needed length ``L``, so that row 0 and row ``L - 1`` are the table's first and last rows
    (the trick used to extend ViT/BERT position tables). Positions then mean "fraction of the
    way through the sequence", not absolute offsets.

    The parameter is a plain ``nn.Parameter`` named ``weight`` (not an ``nn.Embedding``) so a
    model-wide ``nn.Embedding`` re-initialisation does not overwrite the sinusoidal start.

    Shapes:
        positions ``(T,)`` long -> ``(T, d_model)`` float.
    """

    kind = "additive"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    #: what it does on the 4-token reversal task, per arch (``tlab reverse-task``, ``reverse.csv``)
    expected_reversal: dict[str, str] = {"encoder": "solves", "decoder": "solves"}

    @classmethod
    def count_parameters(cls, d_model: int, max_len: int) -> int:
        """Parameters the module holds: the ``(max_len, d_model)`` table."""
        return max_len * d_model

    @classmethod
    def property_checks(cls, init: str = "normal") -> tuple[str, ...]:
        """Property checks of ``tlab check`` that apply (names in ``routines/check.py``): a table
        initialised from the sinusoidal one is also checked for the shift property (at init)."""
        if init == "sinusoidal":
            return ("sinusoidal_shift", "permutation")
        return ("permutation",)


    def __init__(
        self, d_model: int, max_len: int, init: str = "normal", interpolate: bool = False
    ) -> None:
        super().__init__()
        if init not in LEARNED_INITS:
            valid = " or ".join(repr(v) for v in LEARNED_INITS)
            raise ValueError(f"init={init!r} is not valid; choose {valid}")
        if max_len < 2 and interpolate:
            raise ValueError(f"max_len={max_len} is not valid with interpolate=True; use >= 2")
        if max_len < 1:
            raise ValueError(f"max_len={max_len} is not valid; it must be >= 1")
        if d_model < 1:
            raise ValueError(f"d_model={d_model} is not valid; it must be >= 1")
        self.d_model = d_model
        self.max_len = max_len
        self.init = init
        self.interpolate = interpolate
        self.weight = nn.Parameter(torch.empty(max_len, d_model))  # (max_len, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.init == "normal":
                nn.init.normal_(self.weight, mean=0.0, std=0.02)
            else:
                self.weight.copy_(sinusoidal_table(self.max_len, self.d_model))

    def table(self, length: int) -> torch.Tensor:
        """The table for ``length`` positions: ``(length, d_model)``.

        Rows of the stored table when ``length <= max_len``, else the linearly interpolated
        table (only with ``interpolate=True``).
        """
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
        if positions.numel() == 0:
            return self.weight[:0]  # (0, d)
        if int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
        length = int(positions.max()) + 1
        return self.table(length)[positions]  # (T, d_model)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, max_len={self.max_len}, init={self.init!r}, "
            f"interpolate={self.interpolate}"
        )

"""No positional encoding ("NoPE")."""

from __future__ import annotations

from torch import nn


class NoPositionalEncoding(nn.Module):
    """No positional information at all (``kind = "none"``): the model adds nothing.

    Without a PE, self-attention is permutation-equivariant: an encoder's outputs for a
    permuted input are the permuted outputs ("我打你" and "你打我" look the same up to order).
    A causal decoder can still infer some position from the mask (Haviv et al., 2022,
    "Transformer Language Models without Positional Encodings Still Learn Positional
    Information", arXiv:2203.16634).

    The module exists so that every ``pe=`` choice is an object of the same protocol; the
    model never calls it.
    """

    kind = "none"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    #: property checks of ``tlab check`` that apply (names in ``routines/check.py``)
    property_checks: tuple[str, ...] = ("permutation",)
    #: what it does on the 4-token reversal task, per arch (``tlab reverse-task``, ``reverse.csv``)
    expected_reversal: dict[str, str] = {
        "encoder": "cannot: a NoPE encoder is permutation-equivariant (~0.07)",
        "decoder": "may learn it: the causal mask leaks position (NoPE decoder)",
    }

    @classmethod
    def count_parameters(cls) -> int:
        """Parameters the module holds: none."""
        return 0

    def __init__(self) -> None:
        super().__init__()

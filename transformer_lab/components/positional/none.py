"""No positional encoding ("NoPE")."""

from __future__ import annotations

from torch import nn


class NoPositionalEncoding(nn.Module):
    """No positional information (``kind = "none"``): the model never calls it. A NoPE encoder is
    permutation-equivariant; a causal decoder still infers position from the mask (Haviv et al.
    2022, arXiv:2203.16634)."""

    kind = "none"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    property_checks: tuple[str, ...] = ("permutation",)
    expected_reversal: dict[str, str] = {
        "encoder": "cannot: a NoPE encoder is permutation-equivariant (~0.07)",
        "decoder": "may learn it: the causal mask leaks position (NoPE decoder)",
    }

    @classmethod
    def count_parameters(cls) -> int:
        """None."""
        return 0

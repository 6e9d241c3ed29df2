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

    def __init__(self) -> None:
        super().__init__()

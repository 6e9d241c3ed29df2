"""Broken FFNs: each a few lines on top of the built-in two-matrix FFN (see the catalogue in
:mod:`transformer_lab.mutants` for the check expected to catch each)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_lab.components.feedforward import FeedForward
from transformer_lab.components.moe import MoEFeedForward


class TokenShiftFFN(FeedForward):
    """Mixes in the next position (a token shift from t + 1): a future leak in a decoder."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)  # (B, T, D)
        return y + F.pad(y[:, 1:], (0, 0, 0, 1))  # y[t] + y[t + 1] (0 at the end)


class ExplodingFFN(FeedForward):
    """Adds ``gain * x`` to its output (a residual-branch scale of 100 instead of 1/100): the
    stream is multiplied at every layer and explodes with depth."""

    def __init__(self, d_model: int, d_ff: int, gain: float = 100.0, **kwargs: object) -> None:
        super().__init__(d_model, d_ff, **kwargs)
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain * x + super().forward(x)  # (B, T, D)


class NoisyTrainFFN(FeedForward):
    """Adds Gaussian noise in train mode only: trained as one function, evaluated as another."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)  # (B, T, D)
        return y + 0.1 * torch.randn_like(y) if self.training else y


class SkipInEvalFFN(FeedForward):
    """Skips its branch in eval mode (returns zeros): the evaluated model has no FFN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.training else torch.zeros_like(x)


class WrongShapeFFN(FeedForward):
    """Drops the last output feature: (B, T, D) -> (B, T, D - 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[..., :-1]  # (B, T, D - 1)


class LinearFFN(FeedForward):
    """Applies the activation after the down-projection, ``act(W2 W1 x)``: one linear map then
    an elementwise function, no hidden nonlinearity (the FFN adds nothing a linear layer
    cannot)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.down_proj(self.dropout(self.up_proj(x))))  # (B, T, D)


class ActivationFirstFFN(FeedForward):
    """Applies the activation to the input, before the up-projection, ``W2 W1 act(x)``: a sum
    of one-variable functions of the input features, so no two features interact (its
    Jacobian still turns with the input: ``ffn_nonlinearity`` passes it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.dropout(self.up_proj(self.act(x))))  # (B, T, D)


class FunctionalDropoutFFN(FeedForward):
    """Calls ``F.dropout(h, p)`` whose ``training`` defaults to True: dropout stays on in eval
    mode, so evaluation and generation are random."""

    def __init__(self, d_model: int, d_ff: int, p: float = 0.1, **kwargs: object) -> None:
        super().__init__(d_model, d_ff, **kwargs)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(self.act(self.up_proj(x)), self.p)  # (B, T, d_ff), always dropped
        return self.down_proj(h)  # (B, T, D)


class RenormalisedTop1MoE(MoEFeedForward):
    """tlab's Mixture of Experts before issue 32: with ``top_k = 1`` the chosen expert's
    weight is renormalised over itself, ``p_i / p_i = 1`` whatever the logits, so the router
    gets no gradient from the task loss (only the load-balance loss moves it) and routes
    without learning which expert suits a token. Switch keeps ``p_i`` (eq. 2)."""

    def route(self, logits: torch.Tensor,
              probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        weights, chosen = super().route(logits, probs)  # (N, k): p_i at top_k 1
        return weights / weights.sum(dim=-1, keepdim=True), chosen  # all 1 at top_k 1

"""What a component-property check returns, and the small helpers the checks share
(:mod:`.model_properties`, :mod:`.output_properties`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class PropertyResult:
    """One property: ``passed`` is None when it does not apply (e.g. causality in an encoder)."""

    name: str
    passed: bool | None
    value: float | None = None
    tolerance: float | None = None
    detail: str = ""


def eval_outputs(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) in eval mode, without gradients; the model's mode is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(tokens).float()
    finally:
        model.train(was_training)


def random_tokens(vocab_size: int, batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=generator)  # (B, T)


def relative_change(diff: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """|diff| over the mean norm of ``reference``'s rows, per row: (..., V) -> (...)."""
    scale = reference.norm(dim=-1).mean().clamp_min(1e-30)
    return diff.norm(dim=-1) / scale


def failed(name: str, exc: Exception) -> PropertyResult:
    message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return PropertyResult(name, False, detail=f"the forward raised {type(exc).__name__}: "
                          f"{message[:200]}")

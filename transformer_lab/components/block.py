"""Transformer blocks: where the norms sit around attention and FFN (post, pre, sandwich, deepnorm);
each maps (B, T, D) -> (B, T, D). Formulas: docs/custom_components.md."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from transformer_lab.components.attention import AttentionInputs, MultiHeadAttention

NormFactory = Callable[[int], nn.Module]


class TransformerBlock(nn.Module):
    """Holds the sublayers, two norms, residual dropout and scale; subclasses fix the wiring."""

    needs_final_norm = False

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, residual_scale: float = 1.0,
                 residual_dropout: float = 0.0) -> None:
        super().__init__()
        self.attention = attention
        self.feedforward = feedforward
        self.norm1 = make_norm(d_model)
        self.norm2 = make_norm(d_model)
        self.residual_scale = residual_scale
        self.dropout = nn.Dropout(residual_dropout)

    def scale_and_drop(self, y: torch.Tensor) -> torch.Tensor:
        """``residual_scale * dropout(y)``, skipping the no-op cases (p = 0 or eval; scale 1)."""
        if self.training and self.dropout.p > 0.0:
            y = self.dropout(y)
        return y if self.residual_scale == 1.0 else self.residual_scale * y


class PostNormBlock(TransformerBlock):
    """Original Transformer: ``x = N(x + s * f(x))`` after each sublayer."""

    #: norm layers inside one block (parameter and memory formulas: docs/custom_components.md)
    norms_per_block = 2

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = self.norm1(x + self.scale_and_drop(self.attention(x, inputs)))
        return self.norm2(x + self.scale_and_drop(self.feedforward(x)))


class PreNormBlock(TransformerBlock):
    """Pre-LN (Xiong et al. 2020, arXiv:2002.04745): ``x = x + s * f(N(x))``, a final norm;
    ``parallel=True`` (GPT-J): ``x + s * attn(N1(x)) + s * ffn(N2(x))``."""

    needs_final_norm = True
    norms_per_block = 2
    #: accepts ``parallel=True`` (``model.parallel_block``)
    supports_parallel = True

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, residual_scale: float = 1.0,
                 residual_dropout: float = 0.0, parallel: bool = False) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, residual_scale,
                         residual_dropout)
        self.parallel = parallel

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        h = x + self.scale_and_drop(self.attention(self.norm1(x), inputs))  # (B, T, D)
        ffn_input = x if self.parallel else h  # parallel (GPT-J): both sublayers read x
        return h + self.scale_and_drop(self.feedforward(self.norm2(ffn_input)))


class SandwichNormBlock(TransformerBlock):
    """Sandwich-LN (Ding et al. 2021, CogView): ``x = x + s * N_out(f(N_in(x)))``."""

    needs_final_norm = True
    norms_per_block = 4

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, residual_scale: float = 1.0,
                 residual_dropout: float = 0.0) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, residual_scale,
                         residual_dropout)
        self.norm1_out = make_norm(d_model)
        self.norm2_out = make_norm(d_model)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = x + self.scale_and_drop(self.norm1_out(self.attention(self.norm1(x), inputs)))
        return x + self.scale_and_drop(self.norm2_out(self.feedforward(self.norm2(x))))


class DeepNormBlock(TransformerBlock):
    """DeepNorm (Wang et al. 2022, arXiv:2203.00555): ``x = N(alpha x + f(x))``; alpha and beta
    default to the paper's values for ``n_layers`` (``residual_scale`` unused)."""

    norms_per_block = 2

    def __init__(self, d_model: int, attention: MultiHeadAttention, feedforward: nn.Module,
                 make_norm: NormFactory, n_layers: int, alpha: float | None = None,
                 beta: float | None = None, residual_scale: float = 1.0,
                 residual_dropout: float = 0.0) -> None:
        super().__init__(d_model, attention, feedforward, make_norm, 1.0, residual_dropout)
        self.alpha = alpha if alpha is not None else (2 * n_layers) ** 0.25
        self.beta = beta if beta is not None else (8 * n_layers) ** -0.25
        with torch.no_grad():  # V, output projection and FFN weights times beta (Q, K keep gain 1)
            self.attention.qkv_proj.weight[-self.attention.kv_size:].mul_(self.beta)  # V: last
            self.attention.out_proj.weight.mul_(self.beta)
            for module in self.feedforward.modules():
                if isinstance(module, nn.Linear):
                    module.weight.mul_(self.beta)

    def forward(self, x: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        x = self.norm1(self.alpha * x + self.scale_and_drop(self.attention(x, inputs)))
        return self.norm2(self.alpha * x + self.scale_and_drop(self.feedforward(x)))

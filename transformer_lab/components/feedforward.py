"""Position-wise FFNs: ``act(x W1 + b1) W2 + b2`` (Vaswani et al. 2017, eq. 2) and the GLU family
``(act(x W_gate) * (x W_up)) W_down`` (Shazeer 2020, arXiv:2002.05202).
Shapes: (B, T, d_model) -> hidden (B, T, d_ff) -> (B, T, d_model)."""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab.components.attention import init_linear

# One registry of element-wise activations, shared by both FFN kinds.
ACTIVATIONS: dict[str, nn.Module | type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact: x * Phi(x), with Phi the normal CDF (erf form)
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
    "swish": nn.SiLU,  # x * sigmoid(x)  (Ramachandran et al. 2017; = SiLU)
    "silu": nn.SiLU,
    "leaky_relu": lambda: nn.LeakyReLU(0.01),
}


def make_activation(name: str) -> nn.Module:
    """Return the activation module called ``name`` (see ``ACTIVATIONS``)."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"activation '{name}' is not known; valid: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]()


class FeedForward(nn.Module):
    """Two-matrix FFN: ``down(dropout(act(up(x))))``."""

    # What tlab knows about this FFN (docs/custom_components.md, "What a component declares").
    #: weight matrices that multiply activations (the ``6N`` FLOPs rule counts them)
    weight_matrices = 2

    @classmethod
    def hidden_size(cls, d_ff: int) -> int:
        """Width of the hidden activation: ``d_ff``."""
        return d_ff

    @classmethod
    def count_parameters(cls, d_model: int, d_ff: int, bias: bool = True) -> int:
        """``2 D F`` weights (+ ``F + D`` biases)."""
        return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True,
                 dropout: float = 0.0, init_std: float = 0.02) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.act = make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        for layer in (self.up_proj, self.down_proj):
            init_linear(layer, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up_proj(x))  # (B, T, d_ff)
        return self.down_proj(self.dropout(h))  # (B, T, d_model)


class GatedFeedForward(nn.Module):
    """GLU-family FFN (SwiGLU, GeGLU, ReGLU): ``down(dropout(act(gate(x)) * up(x)))``, named as in
    LLaMA."""

    # What tlab knows about this FFN (docs/custom_components.md, "What a component declares").
    weight_matrices = 3

    @classmethod
    def hidden_size(cls, d_ff: int, match_params: bool = False) -> int:
        """Width of the hidden activation: ``d_ff``, or ``round(2/3 d_ff)`` with ``match_params``
        (as many weights as two matrices)."""
        return max(1, int(round(2 * d_ff / 3))) if match_params else d_ff

    @classmethod
    def count_parameters(cls, d_model: int, d_ff: int, bias: bool = True,
                         match_params: bool = False) -> int:
        """``3 D H`` weights (+ ``2 H + D`` biases), ``H = hidden_size(d_ff, match_params)``."""
        hidden = cls.hidden_size(d_ff, match_params)
        return 3 * d_model * hidden + ((2 * hidden + d_model) if bias else 0)

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu", bias: bool = True,
                 dropout: float = 0.0, init_std: float = 0.02, match_params: bool = False) -> None:
        super().__init__()
        d_hidden = self.hidden_size(d_ff, match_params)
        self.gate_proj = nn.Linear(d_model, d_hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, d_hidden, bias=bias)
        self.act = make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.down_proj = nn.Linear(d_hidden, d_model, bias=bias)
        for layer in (self.gate_proj, self.up_proj, self.down_proj):
            init_linear(layer, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.gate_proj(x)) * self.up_proj(x)  # (B, T, d_hidden)
        return self.down_proj(self.dropout(h))  # (B, T, d_model)


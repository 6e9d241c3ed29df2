"""Position-wise feed-forward networks: the two-matrix FFN and the gated (GLU) family.

Vaswani et al. 2017 (arXiv 1706.03762), eq. 2:   FFN(x) = act(x W1 + b1) W2 + b2
Shazeer 2020 (arXiv 2002.05202), GLU variants:   FFN(x) = (act(x W_gate) * (x W_up)) W_down
    swiglu: act = Swish/SiLU, geglu: act = GELU, reglu: act = ReLU.

Shapes: input (B, T, d_model) -> hidden (B, T, d_ff) -> output (B, T, d_model).
Initialisation as in the source article: weights N(0, init_std=0.02), biases zero.
"""

from __future__ import annotations

import torch
from torch import nn

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
        valid = ", ".join(sorted(ACTIVATIONS))
        raise ValueError(f"activation '{name}' is not known; valid: {valid}")
    return ACTIVATIONS[name]()


def _init_linear(layer: nn.Linear, std: float) -> None:
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


class FeedForward(nn.Module):
    """Two-matrix FFN: ``down(dropout(act(up(x))))``.

    Parameters: 2 * d_model * d_ff (+ d_ff + d_model with bias). For d_model 768, d_ff 3072 with
    bias that is 4,722,432 (the source article prints 4,721,664, which leaves out the output bias).
    """

    gated = False
    # What tlab knows about this FFN (docs/custom_components.md, "What a component declares").
    #: weight matrices that multiply activations (up, down): the ``6N`` FLOPs rule counts them
    weight_matrices = 2

    @classmethod
    def hidden_size(cls, d_ff: int) -> int:
        """Width of the hidden activation: ``d_ff``."""
        return d_ff

    @classmethod
    def count_parameters(cls, d_model: int, d_ff: int, bias: bool = True) -> int:
        """``2 D F`` weights (+ ``F + D`` biases)."""
        return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.act = make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        for layer in (self.up_proj, self.down_proj):
            _init_linear(layer, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up_proj(x))  # (B, T, d_ff)
        return self.down_proj(self.dropout(h))  # (B, T, d_model)


def gated_hidden_size(d_ff: int, match_params: bool) -> int:
    """Hidden size of a gated FFN: ``d_ff``, or ``round(2/3 * d_ff)`` when ``match_params``.

    Three matrices of ``2/3 d_ff`` hold as many weights as two of ``d_ff`` (Shazeer 2020, sec. 2).
    """
    return max(1, int(round(2 * d_ff / 3))) if match_params else d_ff


class GatedFeedForward(nn.Module):
    """GLU-family FFN (SwiGLU, GeGLU, ReGLU): ``down(dropout(act(gate(x)) * up(x)))``.

    Named as in LLaMA / Hugging Face: ``gate_proj``, ``up_proj``, ``down_proj``.
    Parameters: 3 * d_model * d_hidden (+ 2 * d_hidden + d_model with bias), where
    ``d_hidden = gated_hidden_size(d_ff, match_params)``.
    """

    gated = True
    # What tlab knows about this FFN (docs/custom_components.md, "What a component declares").
    #: weight matrices that multiply activations (gate, up, down): the ``6N`` FLOPs rule
    weight_matrices = 3

    @classmethod
    def hidden_size(cls, d_ff: int, match_params: bool = False) -> int:
        """Width of the hidden activation: ``gated_hidden_size(d_ff, match_params)``."""
        return gated_hidden_size(d_ff, match_params)

    @classmethod
    def count_parameters(cls, d_model: int, d_ff: int, bias: bool = True,
                         match_params: bool = False) -> int:
        """``3 D H`` weights (+ ``2 H + D`` biases), ``H = hidden_size(d_ff, match_params)``."""
        hidden = gated_hidden_size(d_ff, match_params)
        return 3 * d_model * hidden + ((2 * hidden + d_model) if bias else 0)

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "silu",
        bias: bool = True,
        dropout: float = 0.0,
        init_std: float = 0.02,
        match_params: bool = False,
    ) -> None:
        super().__init__()
        d_hidden = gated_hidden_size(d_ff, match_params)
        self.gate_proj = nn.Linear(d_model, d_hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, d_hidden, bias=bias)
        self.act = make_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.down_proj = nn.Linear(d_hidden, d_model, bias=bias)
        for layer in (self.gate_proj, self.up_proj, self.down_proj):
            _init_linear(layer, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.gate_proj(x)) * self.up_proj(x)  # (B, T, d_hidden)
        return self.down_proj(self.dropout(h))  # (B, T, d_model)


__all__ = [
    "ACTIVATIONS",
    "FeedForward",
    "GatedFeedForward",
    "gated_hidden_size",
    "make_activation",
]

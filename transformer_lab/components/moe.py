"""Mixture-of-Experts FFN: a router sends each token to ``top_k`` of ``n_experts`` FFNs (Shazeer et
al. 2017, arXiv:1701.06538; Switch, arXiv:2101.03961; Mixtral, arXiv:2401.04088), with the
load-balance and z-loss as ``aux_loss`` (docs/custom_components.md).
Shapes: x (B, T, D) -> (B, T, D)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components.feedforward import ACTIVATIONS, FeedForward, GatedFeedForward

ROUTERS: tuple[str, ...] = ("softmax_then_topk", "topk_then_softmax")
#: gated experts by name, with their activation; every name in ``ACTIVATIONS`` is a plain FFN
GATED_EXPERTS: dict[str, str] = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


def expert_class(expert: str, match_params: bool) -> tuple[type[nn.Module], dict[str, bool]]:
    """The FFN class of the expert called ``expert`` (an ``ffn`` choice: gelu, swiglu, ...) and
    the keywords it takes beyond ``FeedForward``'s."""
    if expert in GATED_EXPERTS:
        return GatedFeedForward, {"match_params": match_params}
    if expert not in ACTIVATIONS:
        names = ", ".join(sorted(set(ACTIVATIONS) | set(GATED_EXPERTS)))
        raise ValueError(f"expert={expert!r} is not a built-in FFN; valid: {names}")
    return FeedForward, {}


class MoEFeedForward(nn.Module):
    """Top-k routed experts with Switch load-balancing and optional router z-loss."""

    # What tlab knows about this FFN (docs/custom_components.md, "What a component declares").
    @classmethod
    def count_parameters(cls, d_model: int, d_ff: int, n_experts: int = 8,
                         expert: str = "swiglu", bias: bool = True,
                         match_params: bool = False) -> int:
        """``D E`` (router) + ``E`` times the expert's own ``count_parameters``."""
        return cls.active_parameters(d_model, d_ff, n_experts, n_experts, expert, bias,
                                     match_params)

    @classmethod
    def active_parameters(cls, d_model: int, d_ff: int, n_experts: int = 8, top_k: int = 2,
                          expert: str = "swiglu", bias: bool = True,
                          match_params: bool = False) -> int:
        """Parameters one token uses: the router and ``top_k`` experts."""
        ffn, keywords = expert_class(expert, match_params)
        return d_model * n_experts + top_k * ffn.count_parameters(d_model, d_ff, bias, **keywords)

    @classmethod
    def hidden_size(cls, d_ff: int, top_k: int = 2, expert: str = "swiglu",
                    match_params: bool = False) -> int:
        """Hidden activation width per token: ``top_k`` experts' hidden sizes."""
        ffn, keywords = expert_class(expert, match_params)
        return top_k * ffn.hidden_size(d_ff, **keywords)

    @classmethod
    def weight_matrices(cls, expert: str = "swiglu") -> int:
        """Matrices of one expert that multiply activations (2; gated 3)."""
        return expert_class(expert, False)[0].weight_matrices

    @classmethod
    def routing_weights(cls, d_model: int, n_experts: int = 8) -> int:
        """Router weights that multiply every token (``D E``): part of N in the 6N rule."""
        return d_model * n_experts

    def __init__(self, d_model: int, d_ff: int, n_experts: int = 8, top_k: int = 2,
                 expert: str = "swiglu", router: str = "softmax_then_topk",
                 normalize_topk: bool = True, load_balance_coef: float = 0.01,
                 z_loss_coef: float = 0.0, bias: bool = True, dropout: float = 0.0,
                 init_std: float = 0.02, match_params: bool = False) -> None:
        super().__init__()
        if router not in ROUTERS:
            raise ValueError(f"router={router!r} is not valid; choose one of {', '.join(ROUTERS)}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} is not valid; it must be in [1, n_experts="
                             f"{n_experts}]")
        self.n_experts, self.top_k = n_experts, top_k
        self.router, self.normalize_topk = router, normalize_topk
        self.load_balance_coef, self.z_loss_coef = load_balance_coef, z_loss_coef
        self.gate = nn.Linear(d_model, n_experts, bias=False)  # the router (HF Mixtral: gate)
        nn.init.normal_(self.gate.weight, mean=0.0, std=init_std)
        ffn, keywords = expert_class(expert, match_params)
        activation = GATED_EXPERTS.get(expert, expert)
        self.experts = nn.ModuleList(
            ffn(d_model, d_ff, activation, bias, dropout, init_std, **keywords)
            for _ in range(n_experts))
        self.aux_loss: torch.Tensor | None = None
        self.aux_metrics: dict[str, torch.Tensor] = {}

    def route(self, logits: torch.Tensor,
              probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits (N, E) -> weights (N, k) in the input dtype, chosen experts (N, k).
        ``probs``: ``logits.float().softmax(-1)`` when the caller has it already (forward)."""
        if self.router == "topk_then_softmax" and self.top_k > 1:
            top_logits, chosen = logits.topk(self.top_k, dim=-1)  # (N, k)
            weights = top_logits.float().softmax(dim=-1)
        else:
            if probs is None:
                probs = logits.float().softmax(dim=-1)  # (N, E)
            weights, chosen = probs.topk(self.top_k, dim=-1)  # (N, k)
            if self.normalize_topk and self.top_k > 1:  # top-1: p_i itself (Switch)
                weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        flat = x.reshape(-1, d_model)  # (N, D), N = B T
        logits = self.gate(flat)  # (N, E)
        probs = logits.float().softmax(dim=-1)  # (N, E): routing and the load-balance loss
        weights, chosen = self.route(logits, probs)  # (N, k), (N, k)
        out = torch.zeros_like(flat)  # (N, D)
        for index, expert in enumerate(self.experts):
            # tokens routed here; an expert with none still runs (on 0 rows), so each of its
            # parameters gets a (zero) gradient instead of None
            token, slot = (chosen == index).nonzero(as_tuple=True)
            y = expert(flat[token]) * weights[token, slot, None]  # (N_i, D)
            out.index_add_(0, token, y.to(out.dtype))
        # aux_loss: the weighted load-balance loss (+ z-loss); aux_metrics: each expert's share
        assigned = F.one_hot(chosen, self.n_experts).float().sum(dim=1)  # (N, E) 0/1
        tokens_per_expert = assigned.mean(dim=0)  # (E,) F_i, sums to top_k
        loss = self.load_balance_coef * self.n_experts * (tokens_per_expert
                                                          * probs.mean(dim=0)).sum()
        if self.z_loss_coef:
            loss = loss + self.z_loss_coef * logits.float().logsumexp(dim=-1).square().mean()
        self.aux_loss = loss
        fractions = (tokens_per_expert / self.top_k).detach()  # (E,) sums to 1
        self.aux_metrics = {f"moe_expert{i}_fraction": fractions[i]
                            for i in range(self.n_experts)}
        return out.view(batch, seq, d_model)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, router={self.router!r}, "
                f"load_balance_coef={self.load_balance_coef}, z_loss_coef={self.z_loss_coef}")

"""AdamW without ``torch.optim``: the same update, none of its first-call start-up cost.

AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), per parameter θ
with gradient g at step t (β1, β2, ε, learning rate η, weight decay λ)::

    θ ← θ · (1 − η λ)                                   (decoupled decay)
    m ← β1 m + (1 − β1) g          v ← β2 v + (1 − β2) g²
    θ ← θ − η · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + ε)

Why not ``torch.optim.AdamW``: its first ``step`` (and its constructor) import
``torch._dynamo`` (about 1.2-1.5 s of CPU on the 2-core machine) to disable compilation around
itself. A tlab run trains models of a few thousand parameters for a few seconds, so that import
was the largest single cost of ``tlab smoke`` and of every sweep job. This class calls the
same fused kernel ``torch.optim.AdamW(fused=True)`` calls (``torch._fused_adamw_``: one kernel
for all tensors), or, where the device has no fused kernel, the same ``torch._foreach_*``
arithmetic. ``tests/test_optim.py`` checks it against ``torch.optim.AdamW`` step by step.

The interface is the part of ``torch.optim.Optimizer`` tlab uses: ``param_groups`` (a list of
dicts with ``params``, ``lr``, ``weight_decay``; set ``group["lr"]`` to change the learning
rate) and ``step()``. Parameters whose ``grad`` is None are skipped, as torch skips them. The
state lists are made once, so a step adds no per-parameter Python work beyond collecting the
gradients (the training step of a tiny model is mostly such overhead).

With it, the optimiser helpers of the training loops: ``make_adamw``, ``adamw_param_groups``
(decay on matrices only) and ``set_lr`` (``Trainer`` and the seed engines), ``clip_gradients``
(``Trainer``; the seed engines clip per seed, ``seed_stack.clip_seed_gradients``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class _GroupState:
    """AdamW's state for one parameter group, as lists parallel to ``group["params"]``."""

    exp_avgs: list[torch.Tensor]  # m
    exp_avg_sqs: list[torch.Tensor]  # v
    steps: list[torch.Tensor]  # t per parameter (a parameter without a gradient keeps its t)
    fused: bool  # the device has torch's fused kernel for these tensors

    @classmethod
    def zeros_like(cls, params: list[torch.Tensor]) -> _GroupState:
        return cls([torch.zeros_like(p, memory_format=torch.preserve_format) for p in params],
                   [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params],
                   [torch.zeros((), dtype=torch.float32, device=p.device) for p in params],
                   _has_fused_kernel(params))


class AdamW:
    """AdamW over ``param_groups``; the state (m, v, t) is made at the first ``step``."""

    def __init__(self, param_groups: Iterable[dict], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.param_groups = [
            {"lr": lr, "weight_decay": 0.0, **group, "params": list(group["params"])}
            for group in param_groups
        ]
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps = float(eps)
        self._states: list[_GroupState] = []

    @torch.no_grad()
    def step(self) -> None:
        if not self._states:
            self._states = [_GroupState.zeros_like(g["params"]) for g in self.param_groups]
        for group, state in zip(self.param_groups, self._states, strict=True):
            params = group["params"]
            grads = [p.grad for p in params]
            tensors = (params, grads, state.exp_avgs, state.exp_avg_sqs, state.steps)
            if any(g is None for g in grads):  # skip those parameters, as torch does
                kept = [i for i, g in enumerate(grads) if g is not None]
                if not kept:
                    continue
                tensors = tuple([seq[i] for i in kept] for seq in tensors)
            update = self._fused_step if state.fused else self._foreach_step
            update(*tensors, group["lr"], group["weight_decay"])

    def _fused_step(self, params: list[torch.Tensor], grads: list[torch.Tensor],
                    exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                    steps: list[torch.Tensor], lr: float, weight_decay: float) -> None:
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr,
                            beta1=self.beta1, beta2=self.beta2, weight_decay=weight_decay,
                            eps=self.eps, amsgrad=False, maximize=False)

    def _foreach_step(self, params: list[torch.Tensor], grads: list[torch.Tensor],
                      exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                      steps: list[torch.Tensor], lr: float, weight_decay: float) -> None:
        torch._foreach_add_(steps, 1)
        if weight_decay:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - self.beta1)
        torch._foreach_mul_(exp_avg_sqs, self.beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - self.beta2)
        for param, exp_avg, exp_avg_sq, step in zip(params, exp_avgs, exp_avg_sqs, steps,
                                                    strict=True):
            t = int(step.item())  # the fallback path only (devices without the fused kernel)
            bias_correction1 = 1 - self.beta1 ** t
            bias_correction2_sqrt = (1 - self.beta2 ** t) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _has_fused_kernel(params: list[torch.Tensor]) -> bool:
    """``torch._fused_adamw_`` runs on CPU and CUDA for floating dtypes, on one device."""
    if not params:
        return False
    first = params[0]
    return (first.device.type in ("cpu", "cuda") and first.dtype in _FUSED_DTYPES
            and all(p.device == first.device and p.dtype == first.dtype for p in params))


def clip_gradients(params: Sequence[nn.Parameter], max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` without its per-call grouping: the same numbers, fewer Python steps.

    total = ||(||g_1||, ..., ||g_n||)||_2; if max_norm is finite every g_i is multiplied by
    min(1, max_norm / (total + 1e-6)). Returns the norm before clipping as a 0-d tensor (no
    host sync).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))  # ()
    if math.isfinite(max_norm):
        torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp_(max=1.0))
    return total


def make_adamw(param_groups: list[dict], lr: float, betas: tuple[float, float]) -> AdamW:
    """AdamW (Loshchilov & Hutter 2019) on the fused kernel where the device has it (``AdamW``
    above: ``torch.optim.AdamW``'s numbers without its start-up cost)."""
    return AdamW(param_groups, lr=lr, betas=betas)


def set_lr(optimizer: AdamW, lr: float) -> None:
    """Set every param group's learning rate; a no-op when it is unchanged (constant schedules
    skip the param-group loop)."""
    if optimizer.param_groups[0]["lr"] != lr:
        for group in optimizer.param_groups:
            group["lr"] = lr


def adamw_param_groups(params: Sequence[torch.Tensor], weight_decay: float,
                       leading_dims: int = 0) -> list[dict]:
    """Weight decay on matrices only (not on biases, norm gains); one group when it is 0.
    ``leading_dims``: extra axes in front of each parameter (e.g. a stacked seed axis)."""
    if not weight_decay:
        return [{"params": list(params), "weight_decay": 0.0}]
    decay = [p for p in params if p.dim() - leading_dims >= 2]
    no_decay = [p for p in params if p.dim() - leading_dims < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]

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
rate) and ``step()``. Parameters whose ``grad`` is None are skipped, as torch skips them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class AdamW:
    """AdamW over ``param_groups``; state (m, v, step) is created at a parameter's first step."""

    def __init__(self, param_groups: Iterable[dict], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.param_groups = [
            {"lr": lr, "weight_decay": 0.0, **group, "params": list(group["params"])}
            for group in param_groups
        ]
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps = float(eps)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def _state_of(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(param)
        if state is None:
            state = self.state[param] = {
                "step": torch.zeros((), dtype=torch.float32, device=param.device),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }
        return state

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state_of(p) for p in params]
            tensors = ([p.grad for p in params], [s["exp_avg"] for s in states],
                       [s["exp_avg_sq"] for s in states], [s["step"] for s in states])
            if _has_fused_kernel(params):
                self._fused_step(params, *tensors, group["lr"], group["weight_decay"])
            else:
                self._foreach_step(params, *tensors, group["lr"], group["weight_decay"])

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
    first = params[0]
    return (first.device.type in ("cpu", "cuda") and first.dtype in _FUSED_DTYPES
            and all(p.device == first.device and p.dtype == first.dtype for p in params))

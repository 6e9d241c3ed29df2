"""Step 1's ``task_gradient``: does the task loss reach every trainable weight matrix?
(docs/detector.md)"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    perturbed_copy,
    property_check,
    train_mode_without_dropout,
    verdict,
)

GRADIENT_RATIO = 1e-4  # gradient RMS over the median's: an exact 0 rounds to ~1e-7 in fp32


@contextmanager
def idle_parameters(model: nn.Module) -> Iterator[set[str]]:
    """Fills the set it yields, on leaving, with the names of the parameters of the modules
    called only on empty inputs (an expert no token chose): they get no gradient."""
    called: dict[nn.Module, bool] = {}

    def hook(module: nn.Module, args: tuple, _out: object) -> None:
        sizes = [a.numel() for a in args if isinstance(a, torch.Tensor)]
        called[module] = called.get(module, False) or not sizes or any(sizes)

    idle: set[str] = set()
    with ExitStack() as hooks:
        for module in model.modules():
            hooks.enter_context(module.register_forward_hook(hook))
        yield idle
    idle.update(f"{name}.{p}" if name else p for name, module in model.named_modules()
                if called.get(module) is False for p, _ in module.named_parameters())


@property_check
def task_gradient(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
                  loss_fn) -> PropertyResult:
    """Every trainable weight matrix (2+ dims) gets a task-loss gradient: its gradient RMS over
    the median one's, for ``loss_fn(logits, targets)`` summed over ``batches`` of (inputs,
    targets), on a :func:`perturbed_copy` in train mode without dropout; idle experts left out."""
    name = "task_gradient"
    copied = perturbed_copy(model)
    with (idle_parameters(copied) as idle, train_mode_without_dropout(copied),
          torch.random.fork_rng(devices=[])):
        for inputs, targets in batches:
            loss_fn(copied(inputs), targets).backward()
    rms = {key: (float(p.grad.double().pow(2).mean().sqrt()) if p.grad is not None else 0.0)
           for key, p in copied.named_parameters()
           if p.requires_grad and p.dim() >= 2 and key not in idle}
    if not rms:
        return PropertyResult(name, None, detail="no trainable parameter")
    median = float(torch.tensor(list(rms.values()), dtype=torch.float64).median())
    if not median > 0 or any(math.isnan(v) for v in rms.values()):
        return PropertyResult(name, False, math.nan, GRADIENT_RATIO,
                              "no parameter gets a task-loss gradient (every gradient is 0)")
    ratios = {key: value / median for key, value in rms.items()}
    weakest, ratio = min(ratios.items(), key=lambda item: item[1])
    starved = [n for n, v in ratios.items() if v < GRADIENT_RATIO]
    others = f" ({len(starved)} such: {', '.join(starved[:3])})" if len(starved) > 1 else ""
    return verdict(name, ratio >= GRADIENT_RATIO, ratio, GRADIENT_RATIO,
                   f"every weight matrix gets a task-loss gradient (weakest {weakest}: "
                   f"{ratio:.2g} of the median)",
                   f"the parameter {weakest} gets a task-loss gradient of {ratio:.2g} times the "
                   f"median parameter's: the task does not train it{others}; a renormalised "
                   "single weight, a detach, a scale that cancels?")

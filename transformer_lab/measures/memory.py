"""Activation memory: the storage bytes autograd saves for the backward pass in one forward,
per innermost module (``saved_tensors_hooks``; parameters and buffers left out). The backward
only frees them, so their sum is the peak of saved activations; transients are not counted."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch import nn


@contextmanager
def module_stack(model: nn.Module) -> Iterator[list[str]]:
    """A list whose last element is the name of the innermost module now running."""
    names, stack = {module: name for name, module in model.named_modules()}, [""]

    def enter(module: nn.Module, args: tuple) -> None:
        stack.append(names[module])

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        stack.pop()

    with ExitStack() as hooks:
        for module, name in names.items():
            if name:
                hooks.enter_context(module.register_forward_pre_hook(enter))
                hooks.enter_context(module.register_forward_hook(leave))
        yield stack


def saved_activation_bytes(model: nn.Module, tokens: torch.Tensor) -> dict[str, int]:
    """Bytes autograd saves in one forward, per module name; tokens (B, T). The loss,
    cross-entropy against random targets (its log-probabilities), is charged to ""."""
    owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    per_module: dict[str, int] = defaultdict(int)
    model.train()
    with module_stack(model) as stack:

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
            if pointer not in owned and pointer not in seen and storage.nbytes() > 0:
                seen.add(pointer)
                per_module[stack[-1]] += storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logits = model(tokens)  # (B, T, V)
            generator = torch.Generator().manual_seed(0)
            targets = torch.randint(0, logits.shape[-1], tokens.shape, generator=generator)
            F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # saves the log-probs
    return dict(per_module)


def extrapolate_batch(at_b: dict[str, int], at_b_plus_1: dict[str, int], b: int,
                      batch: int) -> dict[str, int]:
    """Saved bytes at ``batch`` from measurements at ``b`` and ``b + 1``: they are affine in the
    batch size (per-example activations plus batch-independent tables such as RoPE's)."""
    return {n: at_b.get(n, 0) + (batch - b) * (at_b_plus_1.get(n, 0) - at_b.get(n, 0))
            for n in {*at_b, *at_b_plus_1}}


def matmul_flops(model: nn.Module, tokens: torch.Tensor) -> int:
    """FLOPs of ``aten.mm`` / ``aten.addmm`` (the weight matmuls) in one forward + backward, by
    ``FlopCounterMode``; attention's batched products are left out."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        logits = model(tokens)
        logits.float().logsumexp(dim=-1).mean().backward()
    model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts().get("Global", {})
    return int(sum(v for op, v in counts.items() if str(op) in ("aten.mm", "aten.addmm")))

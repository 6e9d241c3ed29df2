"""Measuring activation memory: the bytes autograd keeps for the backward pass.

During one forward pass under ``torch.autograd.graph.saved_tensors_hooks`` every tensor that
autograd saves goes through a pack hook. We record the storage behind it once (a view keeps its
whole storage alive, so storage bytes are what the memory costs), skip parameters and buffers,
and charge it to the innermost module running at that moment (forward pre/post hooks keep a
stack of module names). The backward pass only frees these tensors, so their sum at the end of
the forward pass is the peak of saved activation memory during forward + backward. Transient
tensors (a gradient being computed, the temporaries inside one kernel) are not counted.

Shapes: tokens (B, T) -> {module name: bytes}; "" is code outside any module (the loss).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


@contextmanager
def module_stack(model: nn.Module) -> Iterator[list[str]]:
    """A list whose last element is the name of the innermost module now running."""
    stack = [""]
    handles = []

    def enter(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            stack.append(name)

        return hook

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        stack.pop()

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave))
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


def saved_activation_bytes(model: nn.Module, tokens: torch.Tensor) -> dict[str, int]:
    """Bytes of the tensors autograd saves for the backward pass in one forward, per module
    (what a training step holds between forward and backward).

    The loss is cross-entropy of the logits against random targets (it saves the
    log-probabilities, ``B * T * vocab`` floats, charged to "").
    """
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
    """Saved bytes are affine in the batch size (``a + c * B``: per-example activations plus
    batch-independent tables such as RoPE's cos/sin rows), so measurements at batch ``b`` and
    ``b + 1`` give them exactly at any ``batch``: ``at_b + (batch - b) * (at_b_plus_1 - at_b)``."""
    names = set(at_b) | set(at_b_plus_1)
    return {n: at_b.get(n, 0) + (batch - b) * (at_b_plus_1.get(n, 0) - at_b.get(n, 0))
            for n in names}


def matmul_flops(model: nn.Module, tokens: torch.Tensor) -> int:
    """FLOPs of ``aten.mm`` / ``aten.addmm`` (the weight matmuls, 2-D after flattening) in one
    forward + backward, counted by ``torch.utils.flop_counter.FlopCounterMode``. Attention's
    batched products are left out (they are ``bmm`` or a fused SDPA kernel)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(tokens)
        logits.float().logsumexp(dim=-1).mean().backward()
    model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts().get("Global", {})
    return int(sum(v for op, v in counts.items() if str(op) in ("aten.mm", "aten.addmm")))

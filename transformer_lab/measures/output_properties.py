"""Step 1's properties of what each module returns, measured with forward hooks on one small
batch: ``output_dtype``, ``device_placement``, ``eval_determinism``, ``ffn_gain``."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack

import torch
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    component,
    eval_outputs,
    failed,
    property_check,
    random_tokens,
    relative_change,
    verdict,
)

FFN_GAIN_LIMIT = 10.0  # RMS(ffn(x)) / RMS(x): the residual stream grows by it per layer
SAME_OUTPUT_TOLERANCE = 1e-5  # relative: two forwards of the same tokens run the same ops


def _tensors(value: object) -> list[torch.Tensor]:
    """The tensors of a module's inputs or output (a tensor, or a tuple or list of values)."""
    values = value if isinstance(value, tuple | list) else (value,)
    return [v for v in values if isinstance(v, torch.Tensor)]


def _hooked_forward(model: nn.Module, tokens: torch.Tensor,
                    inspect: Callable[[str, nn.Module, list, list], None]) -> torch.Tensor:
    """Logits of an eval forward that calls ``inspect(name, module, inputs, outputs)`` (their
    tensors) as each submodule finishes."""
    names = {module: name for name, module in model.named_modules()}

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        inspect(names[module] or "model", module, _tensors(args), _tensors(output))

    with ExitStack() as hooks:
        for module in model.modules():
            hooks.enter_context(module.register_forward_hook(hook))
        return eval_outputs(model, tokens)


def output_dtype(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Every submodule returns the dtype of the model's activations (the token embedding's)."""
    name = "output_dtype"
    expected = model.token_embedding.weight.dtype
    wrong: list[str] = []

    def inspect(module_name: str, module: nn.Module, _inputs: list, outputs: list) -> None:
        wrong.extend(f"{module_name} ({type(module).__name__}) returned {value.dtype}"
                     for value in outputs
                     if value.is_floating_point() and value.dtype != expected)

    try:
        _hooked_forward(model, random_tokens(vocab_size, 2, seq_len, seed=5), inspect)
    except Exception as exc:
        if not wrong:
            return failed(name, exc)
    if wrong:
        return PropertyResult(name, False, detail=f"{wrong[0]} for {expected} activations")
    return PropertyResult(name, True, detail=f"every module returns {expected}")


@property_check
def device_placement(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """No tensor made without ``device=`` meets the model's tensors or leaves a module."""
    from transformer_lab.measures.device_audit import DeviceAudit, host_tensor

    returned: list[str] = []

    def inspect(module_name: str, module: nn.Module, _inputs: list, outputs: list) -> None:
        returned.extend(f"{module_name} ({type(module).__name__}) returned a tensor made "
                        "without device=" for value in outputs if host_tensor(value))

    tokens = random_tokens(vocab_size, 2, seq_len, seed=6)  # made outside the audit
    with DeviceAudit() as audit:
        _hooked_forward(model, tokens, inspect)
    found = returned[:1] + audit.violations[:1]
    return verdict("device_placement", not found, float(len(returned) + len(audit.violations)),
                   0.0, "every tensor follows the model's device",
                   f"{'; '.join(found)} (on the CPU whatever the model's device)")


def _recorded_forward(model: nn.Module, tokens: torch.Tensor
                      ) -> tuple[torch.Tensor, list[tuple[str, nn.Module, list, list]]]:
    """Logits of an eval forward and, in the order the modules finished, each module's name,
    the module, and copies of its tensor inputs and outputs."""
    calls: list[tuple[str, nn.Module, list, list]] = []

    def record(module_name: str, module: nn.Module, inputs: list, outputs: list) -> None:
        calls.append((module_name, module, *([v.detach().float().clone() for v in values]
                                             for values in (inputs, outputs))))

    return _hooked_forward(model, tokens, record), calls


def _differ(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    """Largest relative change between two lists of same-shaped tensors (inf if shapes differ)."""
    if [a.shape for a in first] != [b.shape for b in second]:
        return math.inf
    changes = [float(relative_change((a - b).reshape(-1, a.shape[-1]),
                                     a.reshape(-1, a.shape[-1])).max())
               for a, b in zip(first, second, strict=True) if a.numel()]
    return max(changes, default=0.0)


@property_check
def eval_determinism(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Two eval forwards of the same tokens agree; else the first module that differs."""
    name = "eval_determinism"
    tokens = random_tokens(vocab_size, 2, seq_len, seed=8)
    with torch.random.fork_rng(devices=[]):
        (first, first_calls), (second, second_calls) = [_recorded_forward(model, tokens)
                                                        for _ in range(2)]
    change = float(relative_change(first - second, first).max())
    if change <= SAME_OUTPUT_TOLERANCE:
        return PropertyResult(name, True, change, SAME_OUTPUT_TOLERANCE,
                              "two eval forwards of the same tokens agree")
    where = "the model's output"
    for (module_name, module, in_a, out_a), (_, _, in_b, out_b) in zip(
            first_calls, second_calls, strict=False):
        if (_differ(in_a, in_b) <= SAME_OUTPUT_TOLERANCE
                and _differ(out_a, out_b) > SAME_OUTPUT_TOLERANCE):
            where, change = f"{module_name} ({component(module)})", _differ(out_a, out_b)
            break
    return PropertyResult(name, False, change, SAME_OUTPUT_TOLERANCE,
                          f"output not deterministic in eval mode: {where} gave outputs "
                          f"{change:.2g} (relative) apart for the same input in two eval "
                          "forwards: randomness that model.eval() does not turn off (a "
                          "functional dropout needs training=self.training)")


@property_check
def ffn_gain(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Largest ``RMS(ffn(x)) / RMS(x)`` over the blocks' FFNs, at most :data:`FFN_GAIN_LIMIT`."""
    name = "ffn_gain"
    ffns = {block.feedforward: index for index, block in enumerate(getattr(model, "blocks", []))}
    gains: list[tuple[float, str]] = []

    def inspect(_name: str, module: nn.Module, inputs: list, outputs: list) -> None:
        if module in ffns:
            rms_in = inputs[0].float().pow(2).mean().sqrt().clamp_min(1e-30)
            gains.append((float(outputs[0].float().pow(2).mean().sqrt() / rms_in),
                          f"block {ffns[module]}"))

    _hooked_forward(model, random_tokens(vocab_size, 2, seq_len, seed=7), inspect)
    if not gains:
        return PropertyResult(name, None, detail="no FFN")
    gain, where = max(gains)
    return verdict(name, math.isfinite(gain) and gain <= FFN_GAIN_LIMIT, gain, FFN_GAIN_LIMIT,
                   f"largest FFN gain {gain:.3g} ({where})",
                   f"the FFN of {where} multiplies its input's RMS by {gain:.3g}: "
                   "activations explode with depth")

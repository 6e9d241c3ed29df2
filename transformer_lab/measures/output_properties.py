"""Properties of what each module returns, measured with forward hooks on one small batch:

    output_dtype      every module returns the model's dtype (a float64 table is a bug)
    device_placement  nothing is built on the CPU regardless of the model's device
    eval_determinism  in eval mode the same tokens give the same outputs (no dropout left on)
    ffn_gain          an FFN does not multiply the scale of its input (it would explode with
                      depth)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from transformer_lab.measures.property_result import (
    PropertyResult,
    component,
    eval_outputs,
    failed,
    random_tokens,
    relative_change,
)

FFN_GAIN_LIMIT = 10.0
# built-ins at init: ~0.01 (init_std 0.02) to ~1 (init_std 0.3)
SAME_OUTPUT_TOLERANCE = 1e-5  # relative: two forwards of the same tokens run the same ops


def _hooked_forward(model: nn.Module, tokens: torch.Tensor,
                    inspect: Callable[[str, nn.Module, torch.Tensor], None]) -> None:
    """Forward (eval, no grad) calling ``inspect(name, module, output)`` on every tensor
    output of every submodule."""
    names = {module: name for name, module in model.named_modules()}

    def hook(module: nn.Module, _args: object, output: object) -> None:
        outputs = output if isinstance(output, tuple | list) else (output,)
        for value in outputs:
            if isinstance(value, torch.Tensor):
                inspect(names[module] or "model", module, value)

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        eval_outputs(model, tokens)
    finally:
        for handle in handles:
            handle.remove()


def output_dtype(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Every submodule returns the dtype of the model's activations (the token embedding's).
    A float64 table silently promotes the residual stream (the next matmul then fails, or the
    model runs at half speed); a user's component must follow the activations' dtype."""
    name = "output_dtype"
    expected = model.token_embedding.weight.dtype
    wrong: list[str] = []

    def inspect(module_name: str, module: nn.Module, value: torch.Tensor) -> None:
        if value.is_floating_point() and value.dtype != expected:
            wrong.append(f"{module_name} ({type(module).__name__}) returned {value.dtype}")

    try:
        _hooked_forward(model, random_tokens(vocab_size, 2, seq_len, seed=5), inspect)
    except Exception as exc:
        if not wrong:
            return failed(name, exc)
    if wrong:
        return PropertyResult(name, False, detail=f"{wrong[0]} for {expected} activations")
    return PropertyResult(name, True, detail=f"every module returns {expected}")


def device_placement(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Nothing in the forward is built on the CPU regardless of the model's device.

    On a CPU-only machine a tensor made without ``device=`` (``torch.arange(T)``, a table
    built in ``forward``) looks correct and crashes only on a GPU. Measured by provenance
    (:class:`~transformer_lab.measures.device_audit.DeviceAudit`): such a tensor meeting the
    model's tensors, or returned by a module, fails. Not caught: an explicit ``device="cpu"``.
    """
    from transformer_lab.measures.device_audit import DeviceAudit, host_tensor

    name = "device_placement"
    returned: list[str] = []

    def inspect(module_name: str, module: nn.Module, value: torch.Tensor) -> None:
        if host_tensor(value):
            returned.append(f"{module_name} ({type(module).__name__})")

    audit, tokens = DeviceAudit(), random_tokens(vocab_size, 2, seq_len, seed=6)
    try:
        with audit:
            _hooked_forward(model, tokens, inspect)
    except Exception as exc:
        return failed(name, exc)
    if returned or audit.violations:
        where = f"{returned[0]} returned a tensor made without device=" if returned else ""
        what = "; ".join([where, *audit.violations[:1]]).strip("; ")
        return PropertyResult(name, False, float(len(returned) + len(audit.violations)), 0.0,
                              f"{what} (on the CPU whatever the model's device)")
    return PropertyResult(name, True, 0.0, 0.0, "every tensor follows the model's device")


def _recorded_forward(model: nn.Module, tokens: torch.Tensor
                      ) -> tuple[torch.Tensor, list[tuple[str, nn.Module, list, list]]]:
    """Logits of an eval forward and, in the order the modules finished, each module's name,
    the module, its tensor inputs and its tensor outputs (copies)."""
    names = {module: name for name, module in model.named_modules()}
    calls: list[tuple[str, nn.Module, list, list]] = []

    def tensors(value: object) -> list[torch.Tensor]:
        values = value if isinstance(value, tuple | list) else (value,)
        return [v.detach().float().clone() for v in values if isinstance(v, torch.Tensor)]

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        calls.append((names[module] or "model", module, tensors(args), tensors(output)))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        logits = eval_outputs(model, tokens)
    finally:
        for handle in handles:
            handle.remove()
    return logits, calls


def _differ(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    """Largest relative change between two lists of same-shaped tensors (inf if shapes differ)."""
    if len(first) != len(second) or any(a.shape != b.shape for a, b in zip(first, second,
                                                                           strict=True)):
        return math.inf
    changes = [float(relative_change((a - b).reshape(-1, a.shape[-1]),
                                     a.reshape(-1, a.shape[-1])).max())
               for a, b in zip(first, second, strict=True) if a.numel()]
    return max(changes, default=0.0)


def eval_determinism(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """In eval mode two forwards of the same tokens give the same outputs.

    A dropout that ``model.eval()`` does not turn off (``F.dropout(x, p)``, whose ``training``
    defaults to True; noise drawn in ``forward``) makes evaluation and generation random, and
    every invariance check below it fails for a reason it cannot name (a decoder's looks like a
    future leak). On a failure the culprit is the first module, in the order they finish, whose
    inputs are the same in both forwards and whose output is not. torch's random state is
    restored afterwards.
    """
    name = "eval_determinism"
    tokens = random_tokens(vocab_size, 2, seq_len, seed=8)
    try:
        with torch.random.fork_rng(devices=[]):
            first, first_calls = _recorded_forward(model, tokens)
            second, second_calls = _recorded_forward(model, tokens)
    except Exception as exc:
        return failed(name, exc)
    change = float(relative_change(first - second, first).max())
    if change <= SAME_OUTPUT_TOLERANCE:
        return PropertyResult(name, True, change, SAME_OUTPUT_TOLERANCE,
                              "two eval forwards of the same tokens agree")
    culprit = next(((module_name, module, _differ(out_a, out_b))
                    for (module_name, module, in_a, out_a), (_, _, in_b, out_b)
                    in zip(first_calls, second_calls, strict=False)
                    if _differ(in_a, in_b) <= SAME_OUTPUT_TOLERANCE
                    and _differ(out_a, out_b) > SAME_OUTPUT_TOLERANCE), None)
    if culprit is None:
        where = "the model's output"
    else:
        module_name, module, change = culprit
        where = f"{module_name} ({component(module)})"
    return PropertyResult(name, False, change, SAME_OUTPUT_TOLERANCE,
                          f"output not deterministic in eval mode: {where} gave outputs "
                          f"{change:.2g} (relative) apart for the same input in two eval "
                          "forwards: randomness that model.eval() does not turn off (a "
                          "functional dropout needs training=self.training)")


def ffn_gain(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Largest ``RMS(ffn(x)) / RMS(x)`` over the blocks' FFNs for the model's own inputs.

    An FFN that multiplies the scale of its input (a forgotten ``1/sqrt(d)``, an init std of
    1, an output gain) makes the residual stream grow by that factor per layer: activations
    explode with depth. Built-ins at init: ~0.01 (init_std 0.02); limit :data:`FFN_GAIN_LIMIT`.
    """
    name = "ffn_gain"
    gains: list[tuple[float, str]] = []
    handles = []
    for index, block in enumerate(getattr(model, "blocks", [])):
        def hook(_m: nn.Module, args: tuple, out: torch.Tensor, index: int = index) -> None:
            rms_in = args[0].float().pow(2).mean().sqrt().clamp_min(1e-30)
            gains.append((float(out.float().pow(2).mean().sqrt() / rms_in), f"block {index}"))
        handles.append(block.feedforward.register_forward_hook(hook))
    try:
        eval_outputs(model, random_tokens(vocab_size, 2, seq_len, seed=7))
    except Exception as exc:
        return failed(name, exc)
    finally:
        for handle in handles:
            handle.remove()
    if not gains:
        return PropertyResult(name, None, detail="no FFN")
    gain, where = max(gains)
    passed = math.isfinite(gain) and gain <= FFN_GAIN_LIMIT
    return PropertyResult(name, passed, gain, FFN_GAIN_LIMIT,
                          f"largest FFN gain {gain:.3g} ({where})" if passed else
                          f"the FFN of {where} multiplies its input's RMS by {gain:.3g}: "
                          "activations explode with depth")

"""Step 1's forward-pass properties of a built model, and :func:`model_properties`, which runs
every step-1 check in order (docs/detector.md lists them and how each is measured)."""

from __future__ import annotations

import copy
import inspect
import math
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_lab.components.attention import MultiHeadAttention
from transformer_lab.measures.property_result import (
    PropertyResult,
    amplified_copy,
    called_from,
    component,
    eval_outputs,
    evaluating,
    failed,
    flat_tensors,
    property_check,
    random_tokens,
    relative_change,
    train_mode_without_dropout,
    verdict,
)

RELATIVE_TOLERANCE = 1e-5  # float32 noise is ~1e-7 of an output's norm
FFN_GAIN_LIMIT = 10.0  # RMS(ffn(x)) / RMS(x): the residual stream grows by it per layer
INPUT_SCALES = (1e-2, 1e-1, 1.0, 1e1, 1e2)  # input RMS values a norm layer is fed
SCALE_EXPONENT_LIMIT = 0.5  # output RMS ~ input^e: normalisers e = 0, the bugs |e| >= 1
NONLINEARITY_TOLERANCE = 1e-4  # sigma2/sigma1 of rows that only rescale: ~sqrt(n) * 6e-8
JACOBIAN_INPUTS = 8  # inputs at which an FFN's Jacobian is taken
JACOBIAN_ROWS = 16  # output coordinates whose Jacobian rows are compared (at most)
INTERACTION_TOLERANCE = 1e-4  # a sum of one-variable functions: fp32 rounding of four outputs
INTERACTION_PAIRS = 16  # (x, i, j) probes of the mixed second difference
PATHS_TOLERANCE = 1e-4  # two orders of fp32 sums of <= 256 terms differ by < 256 * 6e-8
WEIGHTS_TOLERANCE = 1e-4  # a probability row sums to 1 up to fp32 rounding of T terms
DEFAULT_MAX_LEN = 256  # positions checked for a PE without a max_len of its own
SAME_TOLERANCE = 1e-5  # relative to a row's norm; one PE computation rounds at 6e-8 of it
ALIASING_RATIO = 0.05  # a far pair closer than this fraction of a neighbour step aliases
HALF = (torch.bfloat16, torch.float16)
FLOAT32_TOLERANCE = 1e-5  # a float32 computation and its float32 twin differ by rounding only
BF16_TOLERANCE = 2.0 ** -7  # 4 x one bf16 rounding of the output (2^-9 relative)
BF16_LENGTH = 512  # bf16 spaces integers 2 apart from 256 on: look past it where the PE can
CHUNK = 3  # tokens per step of the chunked decoding


def _hooked_forward(model: nn.Module, tokens: torch.Tensor,
                    visit: Callable[[str, nn.Module, list, list], None]) -> torch.Tensor:
    """Logits of an eval forward that calls ``visit(name, module, inputs, outputs)`` (their
    tensors) as each submodule finishes."""
    names = {module: name for name, module in model.named_modules()}

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        visit(names[module] or "model", module, flat_tensors(args), flat_tensors(output))

    with ExitStack() as hooks:
        for module in model.modules():
            hooks.enter_context(module.register_forward_hook(hook))
        return eval_outputs(model, tokens)


def output_dtype(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """Every submodule returns the dtype of the model's activations (the token embedding's)."""
    name = "output_dtype"
    expected = model.token_embedding.weight.dtype
    wrong: list[str] = []

    def visit(module_name: str, module: nn.Module, _inputs: list, outputs: list) -> None:
        wrong.extend(f"{module_name} ({type(module).__name__}) returned {value.dtype}"
                     for value in outputs
                     if value.is_floating_point() and value.dtype != expected)

    try:
        _hooked_forward(model, random_tokens(vocab_size, 2, seq_len, seed=5), visit)
    except Exception as exc:
        if not wrong:
            return failed(name, exc)
    if wrong:
        return PropertyResult(name, False, detail=f"{wrong[0]} for {expected} activations")
    return PropertyResult(name, True, detail=f"every module returns {expected}")


# Tensors made on the CPU whatever the model's device, followed by provenance, not by device
# (a CPU-only machine sees them too).
_HOST = "_tlab_host"  # attribute set on a host tensor: where it was made ("" if unknown)
_FACTORIES = {"arange", "zeros", "ones", "empty", "full", "tensor", "as_tensor", "rand",
              "randn", "randint", "randperm", "linspace", "logspace", "eye"}
_MOVES = {"to", "cuda", "type_as", "new_tensor", "new_zeros", "new_ones", "new_empty",
          "new_full"}


def _is_host(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and hasattr(value, _HOST)


def _mark(result: Any, made: str) -> Any:
    for value in flat_tensors(result):
        setattr(value, _HOST, made)
    return result


def _calling_module() -> str:
    """The class of the innermost module whose own code (a method with ``self``) is running,
    outside torch: ``CPUTablePE``; ``""`` if none."""
    for frame, _ in traceback.walk_stack(inspect.currentframe()):
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and not frame.f_code.co_filename.startswith(
                torch.__path__[0]):
            return type(owner).__name__
    return ""


class DeviceAudit(TorchFunctionMode):
    """Records in ``violations`` each op that mixes a host tensor with a device tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if name in _FACTORIES or name == "cpu":
            if kwargs.get("device") is not None:
                return result
            made = ".cpu()" if name == "cpu" else f"torch.{name}"
            return _mark(result, f"{made} at {called_from(inspect.currentframe())}")
        if name in _MOVES:
            # .to(dtype) keeps the provenance; .to(device / tensor) and new_* follow the target
            moved = name != "to" or any(isinstance(a, torch.Tensor | torch.device | str)
                                        for a in (*args[1:], kwargs.get("device")))
            if not moved:
                return _mark(result, getattr(args[0], _HOST)) if _is_host(args[0]) else result
            # a no-op move returns the same object: give back a fresh alias, not host-marked
            return result.view_as(result) if result is args[0] else result
        tensors = flat_tensors((args, kwargs))
        host = [t for t in tensors if _is_host(t)]
        if host and len(host) == len(tensors):
            return _mark(result, getattr(host[0], _HOST))
        if name == "__getitem__" and not _is_host(args[0]):
            return result  # a CPU index into a CUDA tensor is legal
        host = [t for t in host if t.dim() > 0]
        if host:  # e.g. "CPUTablePE: __getitem__ at my_pe.py:12 (forward) mixed a tensor ..."
            owner, where = _calling_module(), called_from(inspect.currentframe())
            made = getattr(host[0], _HOST)
            self.violations.append(
                f"{owner + ': ' if owner else ''}{name}{f' at {where}' if where else ''} mixed "
                f"a tensor made without device= {', '.join(str(tuple(t.shape)) for t in host)}"
                f"{f' ({made})' if made else ''} with the model's tensors")
        return result


def host_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor made on the host regardless of the model's device."""
    return _is_host(value) and value.dim() > 0


@property_check
def device_placement(model: nn.Module, vocab_size: int, seq_len: int = 8) -> PropertyResult:
    """No tensor made without ``device=`` meets the model's tensors or leaves a module."""
    returned: list[str] = []

    def visit(module_name: str, module: nn.Module, _inputs: list, outputs: list) -> None:
        returned.extend(f"{module_name} ({type(module).__name__}) returned a tensor made "
                        "without device=" for value in outputs if host_tensor(value))

    tokens = random_tokens(vocab_size, 2, seq_len, seed=6)  # made outside the audit
    with DeviceAudit() as audit:
        _hooked_forward(model, tokens, visit)
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
    if change <= RELATIVE_TOLERANCE:
        return PropertyResult(name, True, change, RELATIVE_TOLERANCE,
                              "two eval forwards of the same tokens agree")
    where = "the model's output"
    for (module_name, module, in_a, out_a), (_, _, in_b, out_b) in zip(
            first_calls, second_calls, strict=False):
        if (_differ(in_a, in_b) <= RELATIVE_TOLERANCE
                and _differ(out_a, out_b) > RELATIVE_TOLERANCE):
            where, change = f"{module_name} ({component(module)})", _differ(out_a, out_b)
            break
    return PropertyResult(name, False, change, RELATIVE_TOLERANCE,
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

    def visit(_name: str, module: nn.Module, inputs: list, outputs: list) -> None:
        if module in ffns:
            rms_in = inputs[0].float().pow(2).mean().sqrt().clamp_min(1e-30)
            gains.append((float(outputs[0].float().pow(2).mean().sqrt() / rms_in),
                          f"block {ffns[module]}"))

    _hooked_forward(model, random_tokens(vocab_size, 2, seq_len, seed=7), visit)
    if not gains:
        return PropertyResult(name, None, detail="no FFN")
    gain, where = max(gains)
    return verdict(name, math.isfinite(gain) and gain <= FFN_GAIN_LIMIT, gain, FFN_GAIN_LIMIT,
                   f"largest FFN gain {gain:.3g} ({where})",
                   f"the FFN of {where} multiplies its input's RMS by {gain:.3g}: "
                   "activations explode with depth")


def norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """One ``(name, module)`` per norm-layer class: the blocks' ``norm*`` sublayers,
    ``final_norm`` and ``embed_norm`` (not ``nn.Identity``)."""
    found: dict[type, tuple[str, nn.Module]] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if (leaf.startswith("norm") or leaf in ("final_norm", "embed_norm")) \
                and not isinstance(module, nn.Identity):
            found.setdefault(type(module), (name, module))
    return list(found.values())


def _exponent(out_big: float, out_small: float) -> float:
    """e in out_big / out_small = 10^e; 0 where both are 0."""
    return math.log10(max(out_big, 1e-30) / max(out_small, 1e-30))


@property_check
def norm_scale_control(model: nn.Module) -> PropertyResult:
    """Each norm layer bounds its output RMS over the input RMS of :data:`INPUT_SCALES`."""
    name = "norm_scale_control"
    layers = norm_layers(model)
    if not layers:
        return PropertyResult(name, None, detail="no norm layer")
    exponents: list[tuple[float, str]] = []  # (exponent, what it means), per layer and kind
    x = torch.randn(4, 8, model.token_embedding.weight.shape[1],
                    generator=torch.Generator().manual_seed(9))  # (B, T, D), RMS ~1
    for layer_name, norm in layers:
        label = f"the norm layer {layer_name} ({component(norm)})"
        copied = copy.deepcopy(norm).train()  # BatchNorm uses the batch's statistics
        dtype = next((p.dtype for p in copied.parameters()), torch.float32)
        with torch.no_grad():  # output RMS at each input RMS of INPUT_SCALES
            out = [float(copied((scale * x).to(dtype)).float().pow(2).mean().sqrt())
                   for scale in INPUT_SCALES]
        if not all(math.isfinite(v) for v in out):
            return PropertyResult(name, False, math.inf, SCALE_EXPONENT_LIMIT,
                                  f"{label} returns inf/NaN for inputs of RMS "
                                  f"{', '.join(f'{s:g}' for s in INPUT_SCALES)}")
        table = ", ".join(f"{o:.3g} at {s:g}" for s, o in zip(INPUT_SCALES, out, strict=True))
        growth = _exponent(out[-1], out[-2])
        shrink, small = max((-_exponent(big, small), small_scale) for small_scale, small, big
                            in zip(INPUT_SCALES, out, out[1:], strict=False))
        exponents += [(growth, f"{label}: output RMS {table} (input RMS): it grows like "
                               f"input^{growth:.2g} past unit scale; a norm bounds its output "
                               "(multiplied by the RMS instead of dividing?)"),
                      (shrink, f"{label}: output RMS {table} (input RMS): it grows as the "
                               f"input shrinks from {small * 10:g} to {small:g} (like "
                               f"input^-{shrink:.2g}); divided by the variance instead of "
                               "the standard deviation?")]
    exponent, detail = max(exponents, key=lambda pair: pair[0])  # the first of the largest
    labels = ", ".join(component(norm) for _, norm in layers)
    return verdict(name, exponent <= SCALE_EXPONENT_LIMIT, exponent, SCALE_EXPONENT_LIMIT,
                   f"{labels}: output RMS bounded for input RMS {INPUT_SCALES[0]:g} to "
                   f"{INPUT_SCALES[-1]:g}", detail)


def _ffn_of_block_0(model: nn.Module, name: str) -> tuple[nn.Module, str] | PropertyResult:
    """An :func:`amplified_copy` of block 0's FFN and how messages name it, or the SKIP row of
    property ``name`` when there is none or its class declares ``is_linear = True``."""
    blocks = getattr(model, "blocks", [])
    if not len(blocks) or not hasattr(blocks[0], "feedforward"):
        return PropertyResult(name, None, detail="no FFN")
    ffn = blocks[0].feedforward
    if getattr(type(ffn), "is_linear", False):
        return PropertyResult(name, None, detail=f"{component(ffn)} declares is_linear = True")
    return amplified_copy(ffn), f"the FFN ({component(ffn)}) of block 0"


@property_check
def ffn_nonlinearity(model: nn.Module) -> PropertyResult:
    """Block 0's FFN has a nonlinearity between its linear maps (its Jacobian turns)."""
    name = "ffn_nonlinearity"
    found = _ffn_of_block_0(model, name)
    if isinstance(found, PropertyResult):
        return found
    ffn, label = found
    d_model = model.token_embedding.weight.shape[1]
    x = torch.randn(JACOBIAN_INPUTS, 1, d_model, generator=torch.Generator().manual_seed(10))
    x.requires_grad_(True)  # (K, 1, D): Gaussian one-token inputs
    with train_mode_without_dropout(ffn):
        y = ffn(x)  # (K, 1, D)
    rows = []  # J[i, k] = d ffn(x_k)[i] / d x_k, for the first JACOBIAN_ROWS outputs i
    for i in range(min(d_model, JACOBIAN_ROWS)):
        (grad,) = torch.autograd.grad(y[:, 0, i].sum(), x, retain_graph=True, allow_unused=True)
        rows.append(torch.zeros_like(x[:, 0]) if grad is None else grad[:, 0])  # (K, D)
    singular = torch.linalg.svdvals(torch.stack(rows).double())  # (rows, min(K, D))
    informative = singular[:, 0] > 1e-30
    if not bool(informative.any()):
        return PropertyResult(name, False, 0.0, NONLINEARITY_TOLERANCE,
                              f"{label}: its output does not depend on its input")
    turn = float((singular[informative, 1] / singular[informative, 0]).max())
    return verdict(name, turn > NONLINEARITY_TOLERANCE, turn, NONLINEARITY_TOLERANCE,
                   f"{label}: its Jacobian turns with the input (sigma2/sigma1 up to {turn:.2g})",
                   f"{label} has no hidden nonlinearity: at {JACOBIAN_INPUTS} inputs "
                   f"each row of its Jacobian only rescales (sigma2/sigma1 {turn:.2g}): "
                   "one linear map then an elementwise function (the activation after "
                   "the down-projection?) or no activation; a linear FFN by design "
                   "declares is_linear = True")


def mixed_differences(ffn: nn.Module, d_model: int, step: float = 1.0) -> torch.Tensor:
    """``|f(x + a e_i + a e_j) - f(x + a e_i) - f(x + a e_j) + f(x)|`` over the larger first
    difference, for :data:`INTERACTION_PAIRS` Gaussian inputs x, ``i != j``, ``a = step``:
    (pairs,). Zero (to rounding) for a sum of one-variable functions."""
    generator = torch.Generator().manual_seed(13)
    x = torch.randn(INTERACTION_PAIRS, d_model, generator=generator)  # (P, D)
    i = torch.randint(0, d_model, (INTERACTION_PAIRS,), generator=generator)  # (P,)
    j = (i + torch.randint(1, d_model, (INTERACTION_PAIRS,), generator=generator)) % d_model
    e_i = torch.nn.functional.one_hot(i, d_model).float() * step  # (P, D)
    e_j = torch.nn.functional.one_hot(j, d_model).float() * step
    corners = torch.stack([x, x + e_i, x + e_j, x + e_i + e_j], dim=1)  # (P, 4, D)
    dtype = next((p.dtype for p in ffn.parameters()), torch.float32)
    out = ffn(corners.reshape(-1, 1, d_model).to(dtype)).float().reshape(
        INTERACTION_PAIRS, 4, -1).double()  # (P, 4, D)
    mixed = (out[:, 3] - out[:, 1] - out[:, 2] + out[:, 0]).norm(dim=-1)  # (P,)
    first = torch.maximum((out[:, 1] - out[:, 0]).norm(dim=-1),
                          (out[:, 2] - out[:, 0]).norm(dim=-1))  # (P,)
    return mixed / first.clamp_min(1e-30)


@property_check
def ffn_interaction(model: nn.Module) -> PropertyResult:
    """Block 0's FFN's input features interact (a :func:`mixed_differences` ratio > 0)."""
    name = "ffn_interaction"
    d_model = model.token_embedding.weight.shape[1]
    found = _ffn_of_block_0(model, name)
    if isinstance(found, PropertyResult):
        return found
    if d_model < 2:
        return PropertyResult(name, None, detail="d_model 1: one input feature")
    ffn, label = found
    with train_mode_without_dropout(ffn), torch.no_grad():
        largest = float(mixed_differences(ffn, d_model).max())
    if not math.isfinite(largest):  # some ratio is inf or NaN
        return PropertyResult(name, False, math.nan, INTERACTION_TOLERANCE,
                              f"{label} returns inf/NaN for Gaussian inputs")
    return verdict(name, largest > INTERACTION_TOLERANCE, largest, INTERACTION_TOLERANCE,
                   f"{label}: its input features interact (mixed second difference up to "
                   f"{largest:.2g} of a first difference)",
                   f"{label} is a sum of one-variable functions of its inputs: at "
                   f"{INTERACTION_PAIRS} pairs of input features the mixed second difference is "
                   f"{largest:.2g} of a first difference (rounding): no two features interact "
                   "(the activation before the up-projection?)")


def mask_lengths(max_len: int) -> list[int]:
    """Sequence lengths whose masks are scanned: 1 to 8, then doubling, and ``max_len``."""
    lengths, length = list(range(1, min(max_len, 8) + 1)), 16
    while length < max_len:
        lengths.append(length)
        length *= 2
    return sorted({*lengths, max_len})


def sums_to_one(attention: nn.Module) -> bool:
    """Whether an attention module's weights sum to one over the keys: tlab's softmax
    attention, or a class declaring ``weights_sum_to_one = True``."""
    return isinstance(attention, MultiHeadAttention) or bool(
        getattr(type(attention), "weights_sum_to_one", False))


def _bad_probability_rows(model: nn.Module, tokens: torch.Tensor) -> str:
    """Where the written-out attention's weights are not finite, or (where
    :func:`sums_to_one`) do not sum to 1 over the keys; ``last_weights`` are left as they were."""
    kept = [(block.attention, block.attention.last_weights) for block in model.blocks]
    try:
        with evaluating(model):
            maps = model.attention_maps(tokens)  # each (B, H, T, T)
    finally:
        for attention, weights in kept:
            attention.last_weights = weights
    for layer, (weights, block) in enumerate(zip(maps, model.blocks, strict=True)):
        sums = weights.float().sum(dim=-1)  # (B, H, T)
        normalised = sums_to_one(block.attention)
        bad = ~torch.isfinite(sums)
        if normalised:
            bad |= (sums - 1).abs() > WEIGHTS_TOLERANCE
        if bool(bad.any()):
            _, head, query = (int(i) for i in torch.nonzero(bad)[0])
            what, expected = (("probabilities", "1") if normalised
                              else ("weights", "a finite number"))
            return (f"layer {layer}, head {head}: query {query}'s attention {what} sum to "
                    f"{float(sums[0, head, query]):.3g}, not {expected}")
    return ""


@property_check
def query_sees_a_key(model: nn.Module, vocab_size: int, max_len: int,
                     seq_len: int = 16) -> PropertyResult:
    """Every query sees a key: in the additive mask and in the written-out attention."""
    name = "query_sees_a_key"
    # lengths where the additive mask (a bias PE plus the causal mask) leaves a query with every
    # key at -inf, and the first such (head, query)
    lengths, first = [], None
    for length in mask_lengths(max_len):
        mask = model.attention_mask(length, length, torch.device("cpu"))  # (H, T, T) or None
        if mask is None:  # no PE bias: SDPA's is_causal, or no mask
            break
        keyless = torch.isneginf(mask).all(dim=-1) | torch.isnan(mask).any(dim=-1)  # (H, T)
        if bool(keyless.any()):
            lengths.append(length)
            first = first or tuple(int(i) for i in torch.nonzero(keyless)[0])
    bad_rows = _bad_probability_rows(model, random_tokens(vocab_size, 2, min(seq_len, max_len)))
    if lengths:
        head, query = first
        at = (f"every length from {lengths[0]} to {lengths[-1]}" if len(lengths) > 1
              else f"length {lengths[0]}")
        causal = " with the causal mask" if model.causal else ""
        return PropertyResult(name, False, float(len(lengths)), 0.0,
                              f"the positional encoding ({component(model.positional)})"
                              f"{causal} masks every key of query {query} (head {head}) at "
                              f"{at}: SDPA returns 0 for that query, the written-out softmax "
                              "NaN")
    return verdict(name, not bad_rows, float(bool(bad_rows)), 0.0,
                   f"every query sees a key at lengths 1 to {max_len}",
                   f"written-out attention: {bad_rows}")


@property_check
def attention_paths_agree(model: nn.Module, vocab_size: int, seq_len: int = 16) -> PropertyResult:
    """SDPA and the written-out attention (``need_weights=True``) give the same outputs."""
    name = "attention_paths_agree"
    tokens = random_tokens(vocab_size, 2, seq_len, seed=11)
    copied = amplified_copy(model).eval()
    with torch.no_grad():
        fused = copied(tokens).float()
        written = copied(tokens, need_weights=True).float()
    finite = torch.isfinite(fused).all(dim=-1) == torch.isfinite(written).all(dim=-1)
    change = relative_change(torch.nan_to_num(fused - written, nan=math.inf),
                             torch.nan_to_num(fused))  # (B, T)
    worst = float(change.max()) if bool(finite.all()) else math.inf
    if worst <= PATHS_TOLERANCE:
        return PropertyResult(name, True, worst, PATHS_TOLERANCE,
                              "SDPA and the written-out attention agree")
    b, t = (int(i) for i in torch.nonzero(change >= change.max())[0])
    return PropertyResult(name, False, worst, PATHS_TOLERANCE,
                          f"SDPA and the written-out attention (need_weights=True) disagree at "
                          f"position {t} (relative change {float(change[b, t]):.2g}; finite: "
                          f"{bool(torch.isfinite(fused[b, t]).all())} / "
                          f"{bool(torch.isfinite(written[b, t]).all())})")



@property_check
def causality(model: nn.Module, vocab_size: int, seq_len: int = 16) -> PropertyResult:
    """Decoders: ``logits[t]`` must not change when a token at ``s > t`` changes."""
    name = "causality"
    if not getattr(model, "causal", False):
        return PropertyResult(name, None, detail="encoder: bidirectional by design")
    base = random_tokens(vocab_size, 1, seq_len)  # (1, T)
    changed = base.repeat(seq_len, 1)  # (T, T): row s changes token s
    rows = torch.arange(seq_len)
    changed[rows, rows] = (changed[rows, rows] + 1) % vocab_size
    out = eval_outputs(amplified_copy(model), torch.cat([base, changed]))  # (1+T, T, V)
    # (S, T): the change at t when token s changed, where t < s
    delta = relative_change(out[1:] - out[:1], out[:1]).tril(-1)
    worst = float(delta.max())
    if worst <= RELATIVE_TOLERANCE:
        return PropertyResult(name, True, worst, RELATIVE_TOLERANCE, "no future leak")
    s, t = (int(i) for i in torch.nonzero(delta > RELATIVE_TOLERANCE)[0])  # first leak
    return PropertyResult(name, False, worst, RELATIVE_TOLERANCE,
                          f"output at position {t} changed when token {s} changed "
                          f"(relative change {float(delta[s, t]):.2g}): a future leak")


def _swap_pairs(max_len: int) -> list[int]:
    """Left positions ``i`` of the adjacent pairs (i, i + 1) to test: 0-4, then doubling, and
    the last pair (a PE that clamps past any index fails there)."""
    left, i = [0, 1, 2, 3], 4
    while i < max_len - 1:
        left += [i - 1, i]
        i *= 2
    return sorted({p for p in [*left, max_len - 2] if 0 <= p < max_len - 1})


def _swap_gap(model: nn.Module, vocab_size: int, i: int, length: int) -> float:
    """How far ``out'[i], out'[i + 1]`` (tokens i and i + 1 swapped) are from
    ``out[i + 1], out[i]``, relative to the outputs' norm: 0 if the two positions look alike."""
    base = random_tokens(vocab_size, 1, length, seed=1 + i)[0]  # (L,)
    if base[i] == base[i + 1]:
        base[i + 1] = (base[i] + 1) % vocab_size  # the swapped tokens differ
    swapped = base.clone()
    swapped[i], swapped[i + 1] = base[i + 1], base[i]
    out = eval_outputs(model, torch.stack([base, swapped]))  # (2, L, V)
    pairs = torch.stack([out[1, i] - out[0, i + 1], out[1, i + 1] - out[0, i]])  # (2, V)
    return float(relative_change(pairs, out[0]).min())


@property_check
def position_injectivity(model: nn.Module, vocab_size: int, max_len: int | None = None,
                         window: int = 6) -> PropertyResult:
    """Swapping the tokens at i and i + 1 (below ``max_len``) must not just swap the outputs."""
    name = "position_injectivity"
    max_len = max_len or position_max_len(model)
    if max_len < 2:
        return PropertyResult(name, None, detail=f"max_len={max_len}: one position")
    left = _swap_pairs(max_len)
    copied = amplified_copy(model)
    copied.causal = False
    gaps = [_swap_gap(copied, vocab_size, i, min(max_len, i + 2 + window)) for i in left]
    worst = min(gaps)
    if not all(math.isfinite(g) for g in gaps):
        return PropertyResult(name, False, math.nan, RELATIVE_TOLERANCE,
                              "non-finite outputs while swapping positions up to "
                              f"{max_len} (see finite_at_max_len)")
    if worst > RELATIVE_TOLERANCE:
        return PropertyResult(name, True, worst, RELATIVE_TOLERANCE,
                              f"{len(left)} pairs of positions up to {max_len} told apart")
    blind = [i for i, g in zip(left, gaps, strict=True) if g <= RELATIVE_TOLERANCE]
    return PropertyResult(name, False, worst, RELATIVE_TOLERANCE,
                          f"positions {blind[0]} and {blind[0] + 1} get the same representation "
                          f"(swapping their tokens swaps the outputs); {len(blind)} of "
                          f"{len(left)} tested pairs up to {max_len} are indistinguishable")


@property_check
def finite_at_max_len(model: nn.Module, vocab_size: int,
                      max_len: int | None = None) -> PropertyResult:
    """A forward at ``max_len`` is finite; else the shortest non-finite length, by bisection."""
    name = "finite_at_max_len"
    max_len = max_len or position_max_len(model)

    def finite(length: int) -> bool:
        return bool(torch.isfinite(eval_outputs(model, random_tokens(vocab_size, 2, length))).all())

    if finite(max_len):
        return PropertyResult(name, True, float(max_len), None, f"finite at {max_len} tokens")
    low, high = 1, max_len  # finite(low) is assumed, finite(high) is False
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if finite(middle) else (low, middle)
    return PropertyResult(name, False, float(high), float(max_len),
                          f"inf/NaN in the output from sequence length {high} on "
                          f"(position {high - 1}); finite up to {high - 1} tokens")


@property_check
def batch_independence(model: nn.Module, vocab_size: int, seq_len: int = 16,
                       batch: int = 4) -> PropertyResult:
    """In eval mode sequence 0's output must not depend on the other sequences of the batch."""
    tokens = random_tokens(vocab_size, batch, seq_len, seed=2)  # (B, T)
    others = tokens.clone()
    others[1:] = random_tokens(vocab_size, batch - 1, seq_len, seed=3)
    copied = amplified_copy(model)
    full, alone, other = (eval_outputs(copied, t)[0] for t in (tokens, tokens[:1], others))
    worst = float(torch.maximum(relative_change(full - alone, full),
                                relative_change(full - other, full)).max())  # (T,) -> ()
    return verdict("batch_independence", worst <= RELATIVE_TOLERANCE, worst, RELATIVE_TOLERANCE,
                   "independent", f"sequence 0's output changed by {worst:.2g} (relative) when "
                   "the other sequences of its batch changed")


@property_check
def train_eval_agreement(model: nn.Module, vocab_size: int, seq_len: int = 16) -> PropertyResult:
    """With dropout off, ``model.train()`` and ``model.eval()`` give the same outputs."""
    tokens = random_tokens(vocab_size, 2, seq_len, seed=4)
    copied = amplified_copy(model)
    evaluated = eval_outputs(copied, tokens)
    with train_mode_without_dropout(copied) as exempt, torch.no_grad():
        trained = copied(tokens).float()
    worst = float(relative_change(trained - evaluated, evaluated).max())
    note = f"; {', '.join(exempt)} exempt (BatchNorm)" if exempt else ""
    return verdict("train_eval_agreement", worst <= RELATIVE_TOLERANCE, worst,
                   RELATIVE_TOLERANCE, "agree" + note, f"train-mode outputs differ from eval-mode "
                   f"ones by {worst:.2g} (relative) with dropout off{note}")


def position_max_len(model: nn.Module, default: int = DEFAULT_MAX_LEN) -> int:
    """The PE's own ``max_len`` where it has one (a learned table), else ``default``."""
    return int(getattr(model.positional, "max_len", None) or default)


def position_representations(model: nn.Module, length: int,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The model's PE for positions ``0 .. length - 1``, a float32 row each: an additive PE's
    rows (L, D); a rotary PE's rotation of all-ones q and k in ``dtype`` (L, (H + H_kv) Dh); a
    bias PE's softmax of its mask rows (L, H L). None for a PE of kind ``none``."""
    kind = model.positional.kind
    with torch.no_grad():
        if kind == "additive":
            return model.positional(torch.arange(length)).float()  # (L, D)
        if kind == "rotary":  # tlab's attention, or the one a block's own attention wraps
            attention = next(m for m in model.modules()
                             if all(hasattr(m, a) for a in ("n_heads", "n_kv_heads", "head_dim")))
            q = torch.ones(1, attention.n_heads, length, attention.head_dim, dtype=dtype)
            k = torch.ones(1, attention.n_kv_heads, length, attention.head_dim, dtype=dtype)
            q, k = model.positional(q, k, torch.arange(length))  # (1, H, L, Dh), (1, H_kv, L, Dh)
            rows = [x[0].transpose(0, 1).reshape(length, -1) for x in (q, k)]
            return torch.cat(rows, dim=1).float()  # (L, (H + H_kv) Dh)
        if kind == "bias":
            mask = model.attention_mask(length, length, torch.device("cpu"))  # (H, L, L)
            attention = mask.float().softmax(dim=-1).nan_to_num(0.0)  # (H, L, L)
            return attention.transpose(0, 1).reshape(length, -1)  # (L, H L)
    return None


def same_pairs(rows: torch.Tensor) -> list[tuple[int, int]]:
    """Pairs ``(p, q)``, ``p < q``, whose rows are the same up to :data:`SAME_TOLERANCE` of the
    rows' mean norm."""
    rows = rows.double()
    scale = float(rows.norm(dim=-1).mean())
    close = torch.cdist(rows, rows) <= SAME_TOLERANCE * max(scale, 1e-30)  # (L, L)
    close &= torch.ones_like(close).triu(1)
    return [(int(p), int(q)) for p, q in torch.nonzero(close)]


def aliasing(rows: torch.Tensor) -> tuple[float, int, int]:
    """The smallest distance between two positions at least 2 apart, as a fraction of the
    smaller of their distances to their closest neighbours, with features standardized; and
    that pair. Rows must be distinct (:func:`same_pairs`)."""
    rows = rows.double()
    spread = rows.std(dim=0)  # (F,)
    varies = spread > SAME_TOLERANCE * float(rows.pow(2).mean().sqrt())  # beyond float32 noise
    rows = rows[:, varies] / spread[varies]  # (L, F'): each varying feature standardized
    distances = torch.cdist(rows, rows)  # (L, L)
    length = distances.shape[0]
    neighbour = distances.diagonal(1)  # (L - 1,): p to p + 1
    padded = F.pad(neighbour, (1, 1), value=math.inf)  # (L + 1,)
    step = torch.minimum(padded[:-1], padded[1:])  # (L,): to the closer neighbour
    ratio = distances / torch.minimum(step[:, None], step[None, :])  # (L, L)
    near = torch.ones(length, length, dtype=torch.bool).triu(2).logical_not()
    ratio = ratio.masked_fill(near, math.inf)
    p, q = divmod(int(ratio.argmin()), length)
    return float(ratio[p, q]), p, q


@property_check
def position_distinguishability(model: nn.Module, max_len: int | None = None) -> PropertyResult:
    """The PE gives every pair of positions below ``max_len`` clearly different rows."""
    name = "position_distinguishability"
    max_len = max_len or position_max_len(model)
    pe = f"the positional encoding ({component(model.positional)})"
    if max_len < 3:
        return PropertyResult(name, None, detail=f"max_len={max_len}: no far pair")
    rows = position_representations(model, max_len)
    if rows is None:
        return PropertyResult(name, None, detail="pe kind 'none': no positions (the control)")
    if not bool(torch.isfinite(rows).all()):
        return PropertyResult(name, False, math.nan, ALIASING_RATIO,
                              f"{pe} gives non-finite values below position {max_len}")
    same = same_pairs(rows)
    if same:
        p, q = same[0]
        return PropertyResult(name, False, 0.0, ALIASING_RATIO,
                              f"{pe} gives positions {p} and {q} the same representation "
                              f"({len(same)} such pairs below {max_len})")
    ratio, p, q = aliasing(rows)
    return verdict(name, ratio >= ALIASING_RATIO, ratio, ALIASING_RATIO,
                   f"every pair of positions below {max_len} at least {ratio:.2g} of a "
                   "neighbour step apart",
                   f"{pe}: positions {p} and {q} are only {ratio:.2g} of a neighbour step apart "
                   "while neighbours differ clearly: far positions alias (a frequency turning a "
                   f"whole number of times in {q - p} steps?)")


class HalfPrecisionAudit(TorchFunctionMode):
    """Records, in ``ops``, each op whose result is bfloat16 or float16: what, shape, where."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        half = next((v for v in flat_tensors(result) if v.dtype in HALF), None)
        if half is not None and len(self.ops) < 8:
            where = called_from(inspect.currentframe())
            self.ops.append(f"{getattr(func, '__name__', str(func))} -> {half.dtype} "
                            f"{tuple(half.shape)}{f' at {where}' if where else ''}")
        return result


class KeepFloat32(TorchFunctionMode):
    """Every cast to bfloat16/float16 (``.to``, ``.type``, ``.bfloat16()``, ``.half()``,
    ``type_as`` a half tensor, a factory's ``dtype=``) gives float32 instead."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("bfloat16", "half") or (name == "type_as" and args[1].dtype in HALF):
            return args[0].float()

        def float32(value: Any) -> Any:
            return torch.float32 if isinstance(value, torch.dtype) and value in HALF else value

        return func(*(float32(a) for a in args), **{k: float32(v) for k, v in kwargs.items()})


@property_check
def bf16_behaviour(model: nn.Module, vocab_size: int, max_len: int,
                   precision: str = "fp32", given: bool = False) -> PropertyResult:
    """Where the run or the PE uses half precision, positions stay distinct up to ``max_len``
    and the loss finite (gpt-neox #1016, modded-nanogpt #39)."""
    name = "bf16_behaviour"
    bf16_run = precision == "bf16"
    if not given and not getattr(model.positional, "max_len", None):
        max_len = max(max_len, BF16_LENGTH)
    pe = f"the positional encoding ({component(model.positional)})"
    with HalfPrecisionAudit() as audit:
        position_representations(model, max_len)
    if not bf16_run and not audit.ops:
        return PropertyResult(name, None, detail="float32 run; the PE computes in float32")
    allowed = BF16_TOLERANCE if bf16_run else FLOAT32_TOLERANCE
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16_run):
        rows = position_representations(model, max_len,
                                        torch.bfloat16 if bf16_run else torch.float32)
    with KeepFloat32():
        twin_rows = position_representations(copy.deepcopy(model), max_len)
    tokens, targets = (random_tokens(vocab_size, 2, max_len, seed=seed) for seed in (12, 13))
    with evaluating(model), torch.autocast("cpu", torch.bfloat16, enabled=bf16_run):
        logits = model(tokens)  # (B, T, V)
        loss = float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()))
    if rows is None:  # kind none: only the run's precision applies
        rows = twin_rows = torch.zeros(1, 1)
    how = "under bf16 autocast" if bf16_run else "in a float32 run"
    merged = sorted(set(same_pairs(rows)) - set(same_pairs(twin_rows)))
    deviations = relative_change(rows - twin_rows, twin_rows)  # (L,)
    deviation = float(deviations.max())
    if merged:
        p, q = merged[0]
        return PropertyResult(name, False, deviation, allowed,
                              f"{pe} gives positions {p} and {q} the same representation "
                              f"{how}, distinct in float32 ({len(merged)} such pairs below "
                              f"{max_len}): bf16 holds integers exactly only up to 256; compute "
                              "positions and angles in float32 (gpt-neox #1016)")
    if not bf16_run:
        off = (f"; its output is {deviation:.2g} (relative) from float32"
               if deviation > allowed else "")
        return PropertyResult(name, False, deviation, allowed,
                              f"{pe} rounds to half precision in a float32 run ({audit.ops[0]})"
                              f"{off}: 8-bit angles and tables blur positions; keep them in "
                              "float32 (modded-nanogpt #39)")
    if not deviation <= allowed:
        return PropertyResult(name, False, deviation, allowed,
                              f"{pe} {how}: its output at position {int(deviations.argmax())} is "
                              f"{deviation:.2g} (relative) from the same computation in float32, "
                              f"more than one bf16 rounding ({allowed:.2g}): angles or tables "
                              "computed in bf16? keep them in float32 (gpt-neox #1003)")
    if not torch.isfinite(torch.tensor(loss)):
        return PropertyResult(name, False, loss, allowed,
                              f"the loss at {max_len} tokens is {loss} {how}")
    return PropertyResult(name, True, deviation, allowed,
                          f"{how}: positions distinct up to {max_len}, output within "
                          f"{allowed:.2g} of float32, loss finite ({loss:.3g})")


FIRST_LAYER_NOTE = (" (first layer only: the logits depend on the sequence's length, and a "
                    "deeper layer's cached keys come from a shorter sequence)")
ADVICE = ("cached decoding (a KV cache) disagrees with the full forward: check how the PE "
          "uses `positions` after an offset")


def decoding_spans(max_len: int, step: int) -> list[tuple[int, int, bool]]:
    """``(start, end, compared)`` token spans covering ``0 .. max_len``, one forward each: the
    compared ones hold ``step`` tokens (the first 8, from ``p - 1`` and ``p`` for each power of
    two ``p >= 16``, the last), the others feed the tokens between them."""
    starts = list(range(0, min(8, max_len), step))
    power = 16
    while power <= max_len:
        starts += [power - 1, power]
        power *= 2
    starts.append(max(max_len - step, 0))
    spans: list[tuple[int, int, bool]] = []
    done = 0  # tokens in the cache
    for start in sorted({start for start in starts if start < max_len}):
        if start < done:  # already in a compared span
            continue
        if start > done:
            spans.append((done, start, False))  # the tokens in between, in one step
        done = min(start + step, max_len)
        spans.append((start, done, True))
    if done < max_len:
        spans.append((done, max_len, True))
    return spans


def _first_mismatch(model: nn.Module, tokens: torch.Tensor, step: int,
                    full: dict[int, torch.Tensor]) -> tuple[float, tuple[int, float, str] | None]:
    """Decode ``tokens`` (1, L) along ``decoding_spans(L, step)`` with a cache; compare each
    compared span with ``full[end]`` (end, V). Returns the worst relative difference and the
    first position past the tolerance: (position, its relative difference, how it was fed)."""
    worst, cache = 0.0, model.new_cache()
    label = "one token at a time" if step == 1 else f"{step} tokens at a time"
    for start, end, compared in decoding_spans(tokens.shape[1], step):
        cached = model(tokens[:, start:end], cache=cache).float()[0]  # (T_step, V)
        if not compared:
            continue
        reference = full[end][start:end]  # (T_step, V)
        delta = relative_change(cached - reference, reference)  # (T_step,)
        delta = torch.where(torch.isnan(delta), torch.inf, delta)
        worst = max(worst, float(delta.max()))
        over = torch.nonzero(delta > RELATIVE_TOLERANCE)
        if len(over):
            index = int(over[0])
            return worst, (start + index, float(delta[index]), label)
    return worst, None


def first_layer_only(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its first block only (embedding, block 0, final norm, head)."""
    copied = copy.deepcopy(model)
    copied.blocks = nn.ModuleList(list(copied.blocks)[:1])
    return copied


@property_check
def cached_decoding(model: nn.Module, vocab_size: int, max_len: int,
                    chunk: int = CHUNK) -> PropertyResult:
    """Decoders: decoding with a KV cache gives the logits of the full forward (Megatron-LM
    #453, llama2.c #286, HF transformers #25104, PyTorch #108108)."""
    name = "cached_decoding"
    if not getattr(model, "causal", False):
        return PropertyResult(name, None, detail="encoder: no KV cache (every token attends "
                              "to later ones)")
    tokens = random_tokens(vocab_size, 1, max_len, seed=5)  # (1, L)
    steps = (1, chunk)
    ends = {end for step in steps for _, end, compared in decoding_spans(max_len, step)
            if compared}
    scope = ""
    def full_forwards(model: nn.Module) -> dict[int, torch.Tensor]:
        """end -> logits (end, V) of the full forward over the first end tokens."""
        return {end: model(tokens[:, :end]).float()[0] for end in sorted(ends)}

    with evaluating(model):
        full = full_forwards(model)
        longest = full[max_len]  # (L, V)
        if not bool(torch.isfinite(longest).all()):
            return PropertyResult(name, False, float("nan"), RELATIVE_TOLERANCE,
                                  f"non-finite logits in a forward of {max_len} tokens: "
                                  "not compared (see finite_at_max_len)")
        # a prefix's logits change when the sequence grows (RoPE scaling=dynamic)
        if len(model.blocks) > 1 and any(
                float(relative_change(logits - longest[:end], longest[:end]).max())
                > RELATIVE_TOLERANCE for end, logits in full.items()):
            model, scope = first_layer_only(model), FIRST_LAYER_NOTE
            full = full_forwards(model)
        results = [_first_mismatch(model, tokens, step, full) for step in steps]
    worst = max(w for w, _ in results)
    mismatches = [m for _, m in results if m is not None]
    if not mismatches:
        return PropertyResult(name, True, worst, RELATIVE_TOLERANCE,
                              f"one token and {chunk} tokens at a time up to {max_len} tokens "
                              f"equal the full forward{scope}")
    position, relative, steps_taken = min(mismatches, key=lambda m: m[0])
    return PropertyResult(name, False, worst, RELATIVE_TOLERANCE,
                          f"position {position} ({steps_taken}) differs from the full "
                          f"forward by {relative:.2g} (relative){scope}; {ADVICE}")


def model_properties(model: nn.Module, vocab_size: int, max_len: int | None = None,
                     precision: str = "fp32") -> list[PropertyResult]:
    """Every step-1 property of ``model``, in order (its weights, modes and torch's random state
    are left as they were). ``max_len``: how far positions are checked (default: the PE's own,
    else :data:`DEFAULT_MAX_LEN`; one given bounds every check); ``precision``: the
    run's ``train.precision``."""
    given = max_len is not None
    max_len = max_len or position_max_len(model)
    return [
        output_dtype(model, vocab_size),
        device_placement(model, vocab_size),
        eval_determinism(model, vocab_size),  # before the invariances a random output breaks
        norm_scale_control(model),
        ffn_nonlinearity(model),
        ffn_interaction(model),
        query_sees_a_key(model, vocab_size, max_len),
        attention_paths_agree(model, vocab_size),
        causality(model, vocab_size),
        finite_at_max_len(model, vocab_size, max_len),  # before injectivity: it names an inf
        position_injectivity(model, vocab_size, max_len),
        cached_decoding(amplified_copy(model), vocab_size, max_len),
        position_distinguishability(model, max_len),
        bf16_behaviour(model, vocab_size, max_len, precision, given),
        batch_independence(model, vocab_size),
        train_eval_agreement(model, vocab_size),
        ffn_gain(model, vocab_size),
    ]

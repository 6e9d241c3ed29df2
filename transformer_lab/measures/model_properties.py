"""Step 1's forward-pass properties of a built model, and :func:`model_properties`, which runs
every step-1 check in order (docs/detector.md lists them and how each is measured)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from contextlib import ExitStack

import torch
from torch import nn

from transformer_lab.components.attention import MultiHeadAttention
from transformer_lab.measures.bf16_behaviour import bf16_behaviour
from transformer_lab.measures.cached_decoding import cached_decoding
from transformer_lab.measures.positions import position_distinguishability, position_max_len
from transformer_lab.measures.property_result import (
    PropertyResult,
    amplified_copy,
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


def _hooked_forward(model: nn.Module, tokens: torch.Tensor,
                    inspect: Callable[[str, nn.Module, list, list], None]) -> torch.Tensor:
    """Logits of an eval forward that calls ``inspect(name, module, inputs, outputs)`` (their
    tensors) as each submodule finishes."""
    names = {module: name for name, module in model.named_modules()}

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        inspect(names[module] or "model", module, flat_tensors(args), flat_tensors(output))

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


def model_properties(model: nn.Module, vocab_size: int, max_len: int | None = None,
                     precision: str = "fp32") -> list[PropertyResult]:
    """Every step-1 property of ``model``, in order (its weights, modes and torch's random state
    are left as they were). ``max_len``: how far positions are checked (default: the PE's own,
    else :data:`~.positions.DEFAULT_MAX_LEN`; one given bounds every check); ``precision``: the
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

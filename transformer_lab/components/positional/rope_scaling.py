"""RoPE inverse frequencies with the usual context-extension scalings, following HF
``transformers.modeling_rope_utils`` so the numbers compare one to one."""

from __future__ import annotations

import math

import torch

ROPE_SCALINGS: tuple[str, ...] = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")


def _default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """``theta_i = base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1``: shape ``(dim // 2,)``, float32."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # (dim/2,)
    return 1.0 / (base**exponents)


def rope_inverse_frequencies(head_dim: int, base: float = 10000.0, *, scaling: str = "none",
                             factor: float = 1.0, original_max_len: int | None = None,
                             seq_len: int | None = None, beta_fast: float = 32.0,
                             beta_slow: float = 1.0, attention_factor: float | None = None,
                             low_freq_factor: float = 1.0,
                             high_freq_factor: float = 4.0) -> tuple[torch.Tensor, float]:
    """``(inv_freq (head_dim // 2,) float32, attention (cos/sin) scale)`` for RoPE.

    ``none``: ``base^(-2i/d)`` (Su et al. 2021); ``linear``: ``/ factor`` (Chen et al. 2023,
    arXiv:2306.15595); ``ntk``: base ``* factor^(d/(d-2))`` (bloc97 2023); ``dynamic``: NTK from
    ``seq_len`` past ``original_max_len`` (emozilla 2023); ``yarn``: Peng et al. 2023
    (arXiv:2309.00071), scale ``0.1 ln(factor) + 1``; ``llama3``: Llama 3.1. ``head_dim``: the
    rotated part only."""
    d = head_dim
    valid = ", ".join(repr(s) for s in ROPE_SCALINGS)
    for invalid, message in (  # the first that applies is the error
        (scaling not in ROPE_SCALINGS, f"scaling={scaling!r} is not valid; choose one of {valid}"),
        (d < 2 or d % 2 != 0, f"head_dim={d} is not valid for RoPE; it must be even and >= 2"),
        (base <= 1, f"base={base} is not valid for RoPE; it must be > 1"),
        (factor <= 0, f"factor={factor} is not valid; the RoPE scaling factor must be > 0"),
        (scaling in ("ntk", "dynamic") and d == 2,
         f"head_dim={d} is not valid for scaling={scaling!r}: the NTK exponent d/(d-2) needs a "
         f"rotated dimension of at least 4"),
        (attention_factor is not None and attention_factor <= 0,
         f"attention_factor={attention_factor} is not valid; it must be > 0"),
        (beta_fast <= beta_slow or beta_slow <= 0,
         f"beta_fast={beta_fast}, beta_slow={beta_slow} are not valid; they must satisfy "
         f"beta_fast > beta_slow > 0"),
        (low_freq_factor <= 0 or high_freq_factor <= low_freq_factor,
         f"low_freq_factor={low_freq_factor}, high_freq_factor={high_freq_factor} are not "
         f"valid; they must satisfy high_freq_factor > low_freq_factor > 0"),
        (scaling in ("dynamic", "yarn", "llama3")
         and (original_max_len is None or original_max_len < 1),
         f"original_max_len={original_max_len} is not valid for scaling={scaling!r}; give the "
         f"trained context length (a positive integer)"),
    ):
        if invalid:
            raise ValueError(message)
    inv_freq, scale = _default_inv_freq(d, base), 1.0  # (d/2,)
    if scaling == "linear":
        inv_freq = inv_freq / factor
    elif scaling == "ntk":
        inv_freq = _default_inv_freq(d, base * factor ** (d / (d - 2)))
    elif scaling == "dynamic" and seq_len is not None and seq_len > original_max_len:
        stretch = (factor * seq_len / original_max_len) - (factor - 1)
        inv_freq = _default_inv_freq(d, base * stretch ** (d / (d - 2)))
    elif scaling == "llama3":  # by wavelength, as HF ``_compute_llama3_parameters``
        low_freq_wavelen = original_max_len / low_freq_factor
        high_freq_wavelen = original_max_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq  # (d/2,)
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (original_max_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif scaling == "yarn":
        scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        # YaRN ramps from extrapolation to interpolation over the pair indices [low, high]
        # whose wavelengths make beta_fast and beta_slow turns over original_max_len positions
        low, high = (d * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))
                     for turns in (beta_fast, beta_slow))
        low, high = max(math.floor(low), 0), min(math.ceil(high), d - 1)
        if low == high:
            high += 0.001  # avoid a division by zero, as HF does
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0.0, 1.0)
        extrapolation_weight = 1.0 - ramp  # (d/2,) 1 = keep theta_i
        inv_freq = (inv_freq / factor) * (1.0 - extrapolation_weight) + (
            inv_freq * extrapolation_weight)
    return inv_freq, scale if attention_factor is None else float(attention_factor)
